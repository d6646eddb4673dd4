// Integer-to-decimal for the run-log writer. Every line carries two 13–19
// digit timestamps; fmt::format_int and std::to_chars peel two digits per
// step in one 64-bit dependency chain (~10 ns for a timestamp). Here a value
// splits into 8-digit chunks whose 4-digit halves convert independently, so
// the CPU overlaps them: about twice as fast on timestamps.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace rankscope::detail::decimal {

inline constexpr char kPairs[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

inline char* pair(char* p, std::uint32_t v) {  // exactly 2 digits, v < 100
  std::memcpy(p, kPairs + 2 * v, 2);
  return p + 2;
}
inline char* four(char* p, std::uint32_t v) {  // exactly 4 digits, v < 10^4
  const std::uint32_t hi = v / 100;
  pair(p, hi);
  return pair(p + 2, v - hi * 100);
}
inline char* eight(char* p, std::uint32_t v) {  // exactly 8 digits, v < 10^8
  const std::uint32_t hi = v / 10000;
  four(p, hi);
  return four(p + 4, v - hi * 10000);
}
inline char* up_to_four(char* p, std::uint32_t v) {  // v < 10^4, no leading zeros
  if (v < 10) {
    *p = static_cast<char>('0' + v);
    return p + 1;
  }
  if (v < 100) return pair(p, v);
  if (v < 1000) {
    const std::uint32_t hi = v / 100;
    *p = static_cast<char>('0' + hi);
    return pair(p + 1, v - hi * 100);
  }
  return four(p, v);
}
inline char* up_to_eight(char* p, std::uint32_t v) {  // v < 10^8, no leading zeros
  if (v < 10000) return up_to_four(p, v);
  const std::uint32_t hi = v / 10000;
  return four(up_to_four(p, hi), v - hi * 10000);
}

// Writes `v` at `p` (at most 20 characters), returns the end.
inline char* write(char* p, std::uint64_t v) {
  constexpr std::uint64_t k8 = 100000000, k16 = k8 * k8;
  if (v < k8) return up_to_eight(p, static_cast<std::uint32_t>(v));
  if (v < k16) {
    const std::uint64_t hi = v / k8;
    return eight(up_to_eight(p, static_cast<std::uint32_t>(hi)), static_cast<std::uint32_t>(v - hi * k8));
  }
  const std::uint64_t top = v / k16, rest = v - top * k16, mid = rest / k8;
  p = up_to_four(p, static_cast<std::uint32_t>(top));
  p = eight(p, static_cast<std::uint32_t>(mid));
  return eight(p, static_cast<std::uint32_t>(rest - mid * k8));
}

// Any integer type, with a '-' for negative values; at most 20 characters.
template <typename Int>
char* write_int(char* p, Int v) {
  static_assert(std::is_integral_v<Int>);
  if constexpr (std::is_signed_v<Int>) {
    if (v < 0) {
      *p++ = '-';
      // Negate in unsigned arithmetic: -INT64_MIN overflows as a signed value.
      return write(p, std::uint64_t{0} - static_cast<std::uint64_t>(static_cast<std::int64_t>(v)));
    }
  }
  return write(p, static_cast<std::uint64_t>(v));
}

// Timestamps in consecutive lines share their leading digits: the part above
// 10^8 ns changes every 100 ms. It is formatted when it changes and copied
// otherwise, so a timestamp costs one 8-digit conversion. One per field.
class RepeatingPrefix {
 public:
  // Writes `v` at `p` (needs 20 bytes of room), returns the end.
  char* write(char* p, std::uint64_t v) {
    constexpr std::uint64_t k8 = 100000000;
    if (v < k8) return up_to_eight(p, static_cast<std::uint32_t>(v));
    const std::uint64_t hi = v / k8;  // at most 12 digits
    if (hi != hi_) {
      hi_ = hi;
      size_ = static_cast<std::size_t>(decimal::write(digits_, hi) - digits_);
    }
    std::memcpy(p, digits_, sizeof digits_);  // a fixed-size copy; only size_ bytes count
    return eight(p + size_, static_cast<std::uint32_t>(v - hi * k8));
  }

 private:
  std::uint64_t hi_ = ~std::uint64_t{0};  // no timestamp has this prefix
  std::size_t size_ = 0;
  char digits_[16] = {};
};

}  // namespace rankscope::detail::decimal
