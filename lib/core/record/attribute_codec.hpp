// The internal side of Attributes (rankscope/export/attributes.hpp): encoding
// a log call's Fields straight into a ring payload, cutting an encoding at an
// entry boundary, and rendering attributes as JSON object members for the run
// log. Thread-safety: pure functions. Cost: encode_fields is on the calling
// thread (copies only: numbers are rendered later, on the background thread).
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string_view>

#include <fmt/format.h>

#include "rankscope/export/attributes.hpp"
#include "rankscope/log.hpp"
#include "schema.hpp"

namespace rankscope::detail {

// The attribute that says attributes were cut (run-log schema: `fields_truncated`).
inline constexpr std::string_view kFieldsTruncatedKey = schema::field_name(schema::Field::kFieldsTruncated);

/// Encodes `fields` into `out` (at most `cap` bytes). What does not fit is cut
/// at an entry boundary, never inside one: a string keeps the UTF-8-safe
/// prefix that fits and ends in "…", later fields are dropped, and a
/// `fields_truncated` = true attribute says so. Returns the bytes written.
std::size_t encode_fields(std::initializer_list<Field> fields, char* out, std::size_t cap) noexcept;

/// The length of the longest prefix of `encoded` of at most `cap` bytes that
/// ends at an entry boundary.
std::size_t attributes_prefix(std::string_view encoded, std::size_t cap) noexcept;

/// `"key":value,...` (JSON object members) of every attribute.
void attributes_json_to(const Attributes& attrs, fmt::memory_buffer& out);
void attribute_value_json_to(const Attribute& a, fmt::memory_buffer& out);

}  // namespace rankscope::detail
