// rankscope/site.hpp — static call-site records and dynamic (interned) names.
//
// Each instrumentation macro places a `static constexpr Site` beside the call;
// its address identifies the site for the whole run. Names that are only known
// at run time (Python phases, generated names) are interned once with
// `intern()` and live until the process exits.
// Thread-safety: Sites are immutable; intern() takes a lock (not for hot paths).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace rankscope {

/// Where step time goes. Phases are grouped into these for the step-time
/// breakdown; the macro infers the kind from the name (see classify_phase).
enum class PhaseKind : std::uint8_t {
  kOther = 0,
  kLoaderWait,
  kForward,
  kBackward,
  kOptimizer,
  kCheckpoint,
  kCollective,
};

inline constexpr int kPhaseKindCount = 7;

/// Stable lower-case spelling used in the run log and exports.
constexpr std::string_view phase_kind_name(PhaseKind k) noexcept {
  switch (k) {
    case PhaseKind::kLoaderWait: return "loader_wait";
    case PhaseKind::kForward: return "forward";
    case PhaseKind::kBackward: return "backward";
    case PhaseKind::kOptimizer: return "optimizer";
    case PhaseKind::kCheckpoint: return "checkpoint";
    case PhaseKind::kCollective: return "collective";
    case PhaseKind::kOther: break;
  }
  return "other";
}

namespace detail {
constexpr bool icontains(std::string_view hay, std::string_view needle) noexcept {
  if (needle.size() > hay.size()) return false;
  for (std::size_t i = 0; i + needle.size() <= hay.size(); ++i) {
    bool ok = true;
    for (std::size_t j = 0; j < needle.size() && ok; ++j) {
      char c = hay[i + j];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      ok = c == needle[j];
    }
    if (ok) return true;
  }
  return false;
}
}  // namespace detail

/// Infers a PhaseKind from common phase names ("forward", "bwd", "loader_wait",
/// "optimizer.step", "checkpoint_save", "all_reduce", ...). Evaluated at
/// compile time for literal names.
constexpr PhaseKind classify_phase(std::string_view name) noexcept {
  using detail::icontains;
  // Before "load": "checkpoint_load" is a checkpoint, not loader wait.
  if (icontains(name, "checkpoint") || icontains(name, "ckpt")) return PhaseKind::kCheckpoint;
  if (icontains(name, "load") || icontains(name, "data") || icontains(name, "batch_wait"))
    return PhaseKind::kLoaderWait;
  if (icontains(name, "backward") || icontains(name, "bwd")) return PhaseKind::kBackward;
  if (icontains(name, "forward") || icontains(name, "fwd")) return PhaseKind::kForward;
  if (icontains(name, "optim") || icontains(name, "opt_step")) return PhaseKind::kOptimizer;
  if (icontains(name, "save")) return PhaseKind::kCheckpoint;
  if (icontains(name, "reduce") || icontains(name, "gather") || icontains(name, "broadcast") ||
      icontains(name, "all_to_all") || icontains(name, "alltoall") || icontains(name, "barrier") ||
      icontains(name, "collective") || icontains(name, "comm"))
    return PhaseKind::kCollective;
  return PhaseKind::kOther;
}

/// A call site: what the hot path records instead of a string.
struct Site {
  const char* name;
  const char* file;
  const char* function;
  std::uint32_t line;
  PhaseKind kind;
};

/// Interns a run-time name as a Site (allocated once per distinct name and
/// kind, never freed). Use for names that are not string literals:
///   static const rankscope::Site* s = rankscope::intern("layer" + std::to_string(i));
/// Memory stays bounded: past kMaxInternedNames distinct names, new names
/// share one "(too many names)" site per kind (with a warning once).
inline constexpr std::size_t kMaxInternedNames = 65536;
const Site* intern(std::string_view name, PhaseKind kind) noexcept;
inline const Site* intern(std::string_view name) noexcept { return intern(name, classify_phase(name)); }
namespace detail {
std::size_t intern_limit() noexcept;
void set_intern_limit(std::size_t n) noexcept;  // tests only
}  // namespace detail

/// Explicit marker for phase names that are not literals (see PhaseTimer).
struct DynamicName {
  std::string_view name;
};

}  // namespace rankscope

#define RANKSCOPE_DETAIL_SITE(var, name_literal, kind_value)                                  \
  static constexpr ::rankscope::Site var {                                                    \
    name_literal, __FILE__, __FUNCTION__, static_cast<std::uint32_t>(__LINE__), kind_value \
  }
