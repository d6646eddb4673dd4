// FNV-1a, 64-bit: the one hash for ids and fingerprints that must be the same
// on every build, host and language (collective fingerprints compared across
// ranks, the config hash compared across runs, OTLP trace ids, timeline flows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace rankscope::detail {

inline constexpr std::uint64_t kFnv1aOffset = 14695981039346656037ull;
inline constexpr std::uint64_t kFnv1aPrime = 1099511628211ull;
// The seed of collective fingerprints and the config hash: the first builds
// wrote FNV's offset basis a digit short. Kept, because both are compared
// across builds and with outside tools (a golden value guards it).
inline constexpr std::uint64_t kStableIdSeed = 1469598103934665603ull;

// `h` continues an earlier hash (or seeds an independent one).
constexpr std::uint64_t fnv1a(std::string_view s, std::uint64_t h = kFnv1aOffset) noexcept {
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * kFnv1aPrime;
  return h;
}

inline std::uint64_t fnv1a_bytes(const void* data, std::size_t n, std::uint64_t h = kFnv1aOffset) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnv1aPrime;
  return h;
}

// A 64-bit value as its 8 little-endian bytes, whatever the host's byte order.
constexpr std::uint64_t fnv1a_u64(std::uint64_t v, std::uint64_t h = kFnv1aOffset) noexcept {
  for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * kFnv1aPrime;
  return h;
}

}  // namespace rankscope::detail
