// Who a process is, beyond its pid: its start time (pids come round again)
// and its pid namespace (a pid means something else in another container).
// The heartbeat carries both for its process; a reader on the same host and
// in the same pid namespace then knows at once whether that process still
// exists, instead of waiting three heartbeat intervals to call it dead.
// Linux /proc only; elsewhere nothing is known (nullopt, "").
#pragma once

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace rankscope::detail {

// Field 22 of /proc/<pid>/stat: when the process started, in clock ticks
// since boot. nullopt when there is no such process (or no /proc), or it has
// died and waits to be reaped (a zombie: its launcher was killed with it).
inline std::optional<std::uint64_t> process_start_ticks(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!f || !std::getline(f, stat)) return std::nullopt;
  const auto paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(paren + 1));
  std::string v;
  for (int field = 3; field <= 22 && fields >> v; ++field) {
    if (field == 3 && (v == "Z" || v == "X")) return std::nullopt;
    if (field == 22) {
      try {
        return std::stoull(v);
      } catch (...) {
        return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

// "pid:[4026531836]" for `pid` ("self" for the calling process); "" unknown.
inline std::string pid_namespace(const std::string& pid) {
  char buf[64] = {};
  const ssize_t n = ::readlink(("/proc/" + pid + "/ns/pid").c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

}  // namespace rankscope::detail
