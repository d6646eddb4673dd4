// Attributes: the compact encoding shared by the hot path (log fields written
// into a ring), the background thread (decoded into Event::attributes) and the
// sinks (iterated in place). One entry is
//   type (1 byte) | key length (1) | key | value
// with the value 8 raw bytes for numbers, 1 for a bool, and a 4-byte length
// plus the bytes for strings and JSON. Host byte order: it never leaves the
// process.
#include "rankscope/export/attributes.hpp"

#include <algorithm>
#include <cstring>

#include "attribute_codec.hpp"
#include "json_util.hpp"

namespace rankscope {

namespace {
using Type = Attribute::Type;
static_assert(static_cast<int>(Field::Type::kInt) == static_cast<int>(Type::kInt) &&
                  static_cast<int>(Field::Type::kUInt) == static_cast<int>(Type::kUInt) &&
                  static_cast<int>(Field::Type::kDouble) == static_cast<int>(Type::kDouble) &&
                  static_cast<int>(Field::Type::kBool) == static_cast<int>(Type::kBool) &&
                  static_cast<int>(Field::Type::kString) == static_cast<int>(Type::kString),
              "a log Field's type is an Attribute's type");

bool is_text(Type t) { return t == Type::kString || t == Type::kJson; }

std::size_t value_size(Type t) { return t == Type::kBool ? 1 : 8; }

template <typename T>
T load_raw(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
}  // namespace

Attributes::Iterator::Iterator(std::string_view buf, std::size_t at) noexcept : buf_(buf), at_(at) { load(); }

// Decodes the entry at at_; a malformed entry ends the iteration.
void Attributes::Iterator::load() noexcept {
  if (at_ >= buf_.size()) {
    at_ = buf_.size();
    return;
  }
  const char* p = buf_.data() + at_;
  const std::size_t left = buf_.size() - at_;
  auto bad = [&] { at_ = next_ = buf_.size(); };
  if (left < 2 || static_cast<std::uint8_t>(p[0]) > static_cast<std::uint8_t>(Type::kJson)) return bad();
  const auto type = static_cast<Type>(p[0]);
  const std::size_t klen = static_cast<std::uint8_t>(p[1]);
  std::size_t n = 2 + klen;
  if (left < n) return bad();
  cur_ = Attribute{};
  cur_.type = type;
  cur_.key = std::string_view(p + 2, klen);
  const char* v = p + n;
  if (is_text(type)) {
    if (left < n + 4) return bad();
    const auto len = load_raw<std::uint32_t>(v);
    if (left - n - 4 < len) return bad();
    cur_.s = std::string_view(v + 4, len);
    n += 4 + len;
  } else {
    if (left < n + value_size(type)) return bad();
    switch (type) {
      case Type::kInt: cur_.i = load_raw<std::int64_t>(v); break;
      case Type::kUInt: cur_.u = load_raw<std::uint64_t>(v); break;
      case Type::kDouble: cur_.d = load_raw<double>(v); break;
      case Type::kBool: cur_.b = *v != 0; break;
      default: break;
    }
    n += value_size(type);
  }
  next_ = at_ + n;
}

Attributes::Iterator& Attributes::Iterator::operator++() noexcept {
  at_ = next_;
  load();
  return *this;
}

std::optional<Attribute> Attributes::find(std::string_view key) const noexcept {
  for (const Attribute& a : *this) {
    if (a.key == key) return a;
  }
  return std::nullopt;
}

namespace {
void put_head(std::string& b, Type t, std::string_view key) {
  key = key.substr(0, 255);
  b.push_back(static_cast<char>(t));
  b.push_back(static_cast<char>(key.size()));
  b.append(key);
}
template <typename T>
void put_raw(std::string& b, T v) {
  char raw[sizeof v];
  std::memcpy(raw, &v, sizeof v);
  b.append(raw, sizeof v);
}
void put_text(std::string& b, Type t, std::string_view key, std::string_view v) {
  put_head(b, t, key);
  put_raw(b, static_cast<std::uint32_t>(std::min<std::size_t>(v.size(), UINT32_MAX)));
  b.append(v.data(), std::min<std::size_t>(v.size(), UINT32_MAX));
}
}  // namespace

Attributes& Attributes::add(std::string_view key, std::int64_t v) {
  put_head(buf_, Type::kInt, key);
  put_raw(buf_, v);
  return *this;
}
Attributes& Attributes::add(std::string_view key, std::uint64_t v) {
  put_head(buf_, Type::kUInt, key);
  put_raw(buf_, v);
  return *this;
}
Attributes& Attributes::add(std::string_view key, double v) {
  put_head(buf_, Type::kDouble, key);
  put_raw(buf_, v);
  return *this;
}
Attributes& Attributes::add(std::string_view key, bool v) {
  put_head(buf_, Type::kBool, key);
  buf_.push_back(v ? 1 : 0);
  return *this;
}
Attributes& Attributes::add(std::string_view key, std::string_view v) {
  put_text(buf_, Type::kString, key, v);
  return *this;
}
Attributes& Attributes::add_json(std::string_view key, std::string_view json) {
  put_text(buf_, Type::kJson, key, json);
  return *this;
}

namespace detail {

namespace {
// The encoded size of an entry with a `text_n`-byte text value (or a number).
std::size_t entry_size(Type t, std::size_t key_n, std::size_t text_n) {
  return 2 + std::min<std::size_t>(key_n, 255) + (is_text(t) ? 4 + text_n : value_size(t));
}

class FixedOut {
 public:
  FixedOut(char* p) : p_(p) {}
  void head(Type t, std::string_view key) {
    key = key.substr(0, 255);
    *p_++ = static_cast<char>(t);
    *p_++ = static_cast<char>(key.size());
    bytes(key);
  }
  template <typename T>
  void raw(T v) {
    std::memcpy(p_, &v, sizeof v);
    p_ += sizeof v;
  }
  void bytes(std::string_view s) {
    std::memcpy(p_, s.data(), s.size());
    p_ += s.size();
  }
  char* at() const { return p_; }

 private:
  char* p_;
};
}  // namespace

std::size_t encode_fields(std::initializer_list<Field> fields, char* out, std::size_t cap) noexcept {
  static constexpr std::string_view kEllipsis = "\xe2\x80\xa6";  // …
  const std::size_t marker = entry_size(Type::kBool, kFieldsTruncatedKey.size(), 0);
  if (cap < marker) return 0;
  const std::size_t room = cap - marker;  // the truncation marker always fits
  FixedOut o(out);
  bool cut = false;
  for (const Field& f : fields) {
    const std::string_view key = f.key != nullptr ? f.key : "";
    const auto t = static_cast<Type>(f.type);  // Field::Type is Attribute::Type's prefix
    const std::size_t used = static_cast<std::size_t>(o.at() - out);
    const std::size_t need = entry_size(t, key.size(), t == Type::kString ? f.s.size() : 0);
    if (used + need > room) {
      // A string keeps the UTF-8-safe prefix that fits, ending in "…"; the
      // fields after it are dropped and `fields_truncated` says so.
      const std::size_t fixed = entry_size(t, key.size(), kEllipsis.size());
      if (t == Type::kString && used + fixed < room) {
        const std::string_view keep = f.s.substr(0, utf8_prefix(f.s, room - used - fixed));
        o.head(t, key);
        o.raw(static_cast<std::uint32_t>(keep.size() + kEllipsis.size()));
        o.bytes(keep);
        o.bytes(kEllipsis);
      }
      cut = true;
      break;
    }
    o.head(t, key);
    switch (f.type) {
      case Field::Type::kInt: o.raw(f.i); break;
      case Field::Type::kUInt: o.raw(f.u); break;
      case Field::Type::kDouble: o.raw(f.d); break;
      case Field::Type::kBool: o.bytes(std::string_view(f.b ? "\1" : "\0", 1)); break;
      case Field::Type::kString:
        o.raw(static_cast<std::uint32_t>(f.s.size()));
        o.bytes(f.s);
        break;
    }
  }
  if (cut) {
    o.head(Type::kBool, kFieldsTruncatedKey);
    o.bytes(std::string_view("\1", 1));
  }
  return static_cast<std::size_t>(o.at() - out);
}

std::size_t attributes_prefix(std::string_view encoded, std::size_t cap) noexcept {
  if (encoded.size() <= cap) return encoded.size();
  const Attributes a = Attributes::from_encoded(encoded);
  std::size_t keep = 0;
  for (auto it = a.begin(); it != a.end(); ++it) {
    const std::size_t end = entry_size(it->type, it->key.size(), is_text(it->type) ? it->s.size() : 0) + keep;
    if (end > cap) break;
    keep = end;
  }
  return keep;
}

void attributes_json_to(const Attributes& attrs, fmt::memory_buffer& out) {
  bool first = true;
  for (const Attribute& a : attrs) {
    if (!first) out.push_back(',');
    first = false;
    json_escape_to(out, a.key);
    out.push_back(':');
    attribute_value_json_to(a, out);
  }
}

void attribute_value_json_to(const Attribute& a, fmt::memory_buffer& out) {
  switch (a.type) {
    case Type::kInt: fmt::format_to(fmt::appender(out), "{}", a.i); break;
    case Type::kUInt: fmt::format_to(fmt::appender(out), "{}", a.u); break;
    case Type::kDouble: json_number_to(out, a.d); break;
    case Type::kBool: out.append(std::string_view(a.b ? "true" : "false")); break;
    case Type::kString: json_escape_to(out, a.s); break;
    case Type::kJson: out.append(a.s); break;
  }
}

}  // namespace detail
}  // namespace rankscope
