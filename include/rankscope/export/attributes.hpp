// rankscope/export/attributes.hpp — the typed key/value attributes an event
// carries to the sinks: a log record's fields, an invariant's values, the
// watchdog's measurements.
//
//   for (const rankscope::Attribute& a : event.attributes) {
//     if (a.type == rankscope::Attribute::Type::kDouble) use(a.key, a.d);
//   }
//
// Values keep their type from the call site to the sink: nothing is rendered
// to text and parsed back on the way (the run log renders JSON, OTLP encodes
// AnyValues, the console prints k=v — each from the typed value). Nested data
// (a list of ranks, the threads of a stalled rank) is one kJson attribute
// holding a JSON array or object.
// Storage is one compact byte string per event (one allocation, whatever the
// number of attributes); iteration decodes it in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>

namespace rankscope {

/// One attribute, viewed in place (valid while its Attributes lives).
struct Attribute {
  enum class Type : std::uint8_t { kInt, kUInt, kDouble, kBool, kString, kJson };
  std::string_view key;
  Type type = Type::kInt;
  std::int64_t i = 0;   // kInt
  std::uint64_t u = 0;  // kUInt
  double d = 0.0;       // kDouble
  bool b = false;       // kBool
  std::string_view s;   // kString: the text; kJson: a JSON array or object
};

class Attributes {
 public:
  class Iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = Attribute;
    using difference_type = std::ptrdiff_t;
    using pointer = const Attribute*;
    using reference = const Attribute&;
    Iterator() = default;
    const Attribute& operator*() const noexcept { return cur_; }
    const Attribute* operator->() const noexcept { return &cur_; }
    Iterator& operator++() noexcept;
    Iterator operator++(int) noexcept {
      Iterator t = *this;
      ++*this;
      return t;
    }
    friend bool operator==(const Iterator& a, const Iterator& b) noexcept { return a.at_ == b.at_; }

   private:
    friend class Attributes;
    Iterator(std::string_view buf, std::size_t at) noexcept;
    void load() noexcept;
    std::string_view buf_;
    std::size_t at_ = 0, next_ = 0;
    Attribute cur_;
  };

  Iterator begin() const noexcept { return Iterator(buf_, 0); }
  Iterator end() const noexcept { return Iterator(buf_, buf_.size()); }
  bool empty() const noexcept { return buf_.empty(); }
  std::optional<Attribute> find(std::string_view key) const noexcept;

  // Builders (keys longer than 255 bytes are cut).
  Attributes& add(std::string_view key, std::int64_t v);
  Attributes& add(std::string_view key, int v) { return add(key, static_cast<std::int64_t>(v)); }
  Attributes& add(std::string_view key, std::uint64_t v);
  Attributes& add(std::string_view key, double v);
  Attributes& add(std::string_view key, bool v);
  Attributes& add(std::string_view key, std::string_view v);
  Attributes& add(std::string_view key, const char* v) { return add(key, std::string_view(v != nullptr ? v : "")); }
  /// A JSON array or object, for nested data (the caller renders it valid).
  Attributes& add_json(std::string_view key, std::string_view json);
  void clear() noexcept { buf_.clear(); }

  /// The encoded bytes (what travels through a thread's ring), and back.
  std::string_view encoded() const noexcept { return buf_; }
  static Attributes from_encoded(std::string_view bytes) {
    Attributes a;
    a.buf_.assign(bytes);
    return a;
  }

 private:
  std::string buf_;
};

}  // namespace rankscope
