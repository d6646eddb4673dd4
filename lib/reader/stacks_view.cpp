#include "stacks_view.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "json_util.hpp"
#include "rankscope/exchange.hpp"
#include "schema.hpp"

namespace rankscope::reader {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// "#3 pthread_mutex_lock+0x111 (libc.so.6)" -> "pthread_mutex_lock (libc.so.6)";
// "#0 libc.so.6+0x85f16" stays "libc.so.6+0x85f16" (a module offset is all there is).
std::string native_frame(std::string_view line) {
  line = trim(line);
  if (!line.empty() && line.front() == '#') {
    const auto sp = line.find(' ');
    line = sp == std::string_view::npos ? std::string_view() : line.substr(sp + 1);
  }
  const auto paren = line.rfind(" (");
  if (paren == std::string_view::npos) return std::string(line);
  std::string_view sym = line.substr(0, paren);
  if (const auto plus = sym.rfind("+0x"); plus != std::string_view::npos) sym = sym.substr(0, plus);
  return fmt::format("{}{}", sym, line.substr(paren));
}

const ThreadStack* main_of(const std::vector<ThreadStack>& v) {
  for (const auto& t : v) {
    if (t.main) return &t;
  }
  return nullptr;
}

constexpr std::size_t kFramesShown = 12;

// The innermost frame that says something: past the C and C++ runtimes
// (clock_nanosleep, pthread_cond_wait, std::condition_variable::wait), and
// past frames without a name ("librankscope.so.0+0x6b9f3": a hidden or static
// function, a signal handler's) when a named one follows.
const std::string& telling_frame(const StackGroup& g) {
  if (g.python) return g.frames.front();
  const auto runtime = [](const std::string& f) {
    return f.find("libc.so") != std::string::npos || f.find("libstdc++.so") != std::string::npos ||
           f.find("libgcc_s.so") != std::string::npos || f.find("libpthread.so") != std::string::npos;
  };
  const auto unnamed = [](const std::string& f) {
    return f.find(" (") == std::string::npos && f.find("+0x") != std::string::npos;
  };
  for (const auto& f : g.frames) {
    if (!runtime(f) && !unnamed(f)) return f;
  }
  for (const auto& f : g.frames) {
    if (!runtime(f)) return f;
  }
  return g.frames.front();
}

// "ns::f(std::basic_string_view<...>, long) [clone .lto_priv.0] (lib.so)" ->
// "ns::f(...) (lib.so)": a one-line summary names the function, not its signature.
std::string without_parameters(const std::string& frame) {
  const auto module = frame.rfind(" (");
  if (module == std::string::npos || module == 0) return frame;
  std::string fn = frame.substr(0, module);
  if (const auto clone = fn.find(" [clone "); clone != std::string::npos) fn.resize(clone);
  if (fn.empty() || fn.back() != ')') return fn + frame.substr(module);
  int depth = 0;
  for (std::size_t i = fn.size(); i-- > 0;) {
    depth += fn[i] == ')' ? 1 : fn[i] == '(' ? -1 : 0;
    if (depth == 0) {
      if (i + 2 < fn.size()) fn = fn.substr(0, i) + "(...)";
      break;
    }
  }
  return fn + frame.substr(module);
}

std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    out.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return out;
}

}  // namespace

std::vector<ThreadStack> parse_python_stacks(std::string_view text) {
  std::vector<ThreadStack> out;
  for (std::string_view line : lines_of(text)) {
    const std::string_view t = trim(line);
    if (t.starts_with("Thread ") || t.starts_with("Current thread ")) {
      ThreadStack& s = out.emplace_back();
      s.python = true;
      s.main = t.starts_with("Current thread ");
      s.label = std::string(t.substr(0, t.find(" (")));
    } else if (t.starts_with("File ") && !out.empty()) {
      out.back().frames.emplace_back(t);
    } else if (t.starts_with("...") && !out.empty()) {
      out.back().frames.emplace_back(t);  // "<truncated>" / "..." from faulthandler
    }
  }
  return out;
}

std::vector<ThreadStack> parse_native_stacks(std::string_view text) {
  std::vector<ThreadStack> out;
  for (std::string_view line : lines_of(text)) {
    if (line.starts_with("thread ")) {
      ThreadStack& s = out.emplace_back();
      s.main = line.ends_with(" (main)");
      s.label = std::string(s.main ? line.substr(0, line.size() - 7) : line);
    } else if (line.starts_with("  #") && !out.empty()) {
      out.back().frames.push_back(native_frame(line));
    } else if (line.starts_with("  (") && !out.empty()) {
      out.back().frames.emplace_back(trim(line));  // "(no answer: ...)"
    }
  }
  return out;
}

std::vector<StackGroup> group_stacks(const RunSummary& s) {
  std::map<std::tuple<bool, bool, std::vector<std::string>>, StackGroup> groups;
  for (const auto& r : s.ranks) {
    if (!r.stacks) continue;
    std::vector<ThreadStack> threads = parse_python_stacks(r.stacks->python);
    const bool has_python = !threads.empty();
    std::vector<ThreadStack> native = parse_native_stacks(r.stacks->native);
    if (!has_python) {
      threads = std::move(native);
    } else if (const ThreadStack* m = main_of(native)) {  // where inside the interpreter (a C extension, a lock)
      threads.push_back(*m);
    }
    for (const ThreadStack& t : threads) {
      std::vector<std::string> frames(t.frames.begin(), t.frames.begin() + std::min(t.frames.size(), kFramesShown));
      StackGroup& g = groups[{!t.main, !t.python, frames}];
      g.main = t.main;
      g.python = t.python;
      g.frames = std::move(frames);
      if (g.ranks.empty() || g.ranks.back() != r.rank) g.ranks.push_back(r.rank);
      ++g.threads;
    }
  }
  std::vector<StackGroup> out;
  for (auto& [key, g] : groups) out.push_back(std::move(g));
  std::stable_sort(out.begin(), out.end(), [](const StackGroup& a, const StackGroup& b) {
    if (a.main != b.main) return a.main;
    if (a.python != b.python) return a.python;
    return a.ranks.size() > b.ranks.size();
  });
  return out;
}

std::string format_stacks(const RunSummary& s) {
  std::vector<int> with, without;
  std::map<std::string, std::vector<int>> reasons;
  for (const auto& r : s.ranks) {
    (r.stacks ? with : without).push_back(r.rank);
    if (r.stacks) reasons[fmt::format("{} at step {}", r.stacks->reason, r.stacks->step)].push_back(r.rank);
  }
  if (with.empty()) {
    return "no stacks in this run: they are captured at a stall, at dump_flight_recorder() or SIGUSR1, and at a "
           "terminating signal\n";
  }
  std::string out = fmt::format("stacks of {} rank{} (the last capture of each:", with.size(), with.size() > 1 ? "s" : "");
  for (const auto& [why, ranks] : reasons) out += fmt::format(" {} on rank {};", why, join_ranks(ranks));
  out.back() = ')';
  if (!without.empty()) out += fmt::format("; none from rank {}", join_ranks(without));
  out += "\n";
  const auto groups = group_stacks(s);
  std::size_t most[2] = {0, 0};  // the largest main-thread group, native and Python
  for (const auto& g : groups) {
    if (g.main) most[g.python] = std::max(most[g.python], g.ranks.size());
  }
  bool others = false;
  for (const auto& g : groups) {
    if (!g.main && !others) {
      out += "\nother threads\n";
      others = true;
    }
    const bool odd = g.main && g.ranks.size() < most[g.python];
    const std::string who = g.main ? "main thread" : fmt::format("{} thread{}", g.threads, g.threads > 1 ? "s" : "");
    out += fmt::format("\n{}{}, {} - rank{} {}{}\n", who, g.python ? " (Python)" : " (native)",
                       g.frames.size() < kFramesShown ? "whole stack" : "innermost frames", g.ranks.size() > 1 ? "s" : "",
                       join_ranks(g.ranks), odd ? "   <- the odd one out" : "");
    for (const auto& f : g.frames) out += fmt::format("    {}\n", f);
  }
  return out;
}

std::string format_stacks_json(const RunSummary& s) {
  detail::JsonWriter w;
  w.begin_object().field("schema", "rankscope.stacks/1").field("run_dir", s.run_dir).key("groups").begin_array();
  for (const auto& g : group_stacks(s)) {
    w.begin_object().field("main", g.main).field("python", g.python).field("threads", g.threads);
    w.key("ranks").begin_array();
    for (int r : g.ranks) w.value(r);
    w.end_array().key("frames").begin_array();
    for (const auto& f : g.frames) w.value(f);
    w.end_array().end_object();
  }
  return w.end_array().end_object().take() + "\n";
}

std::string stack_evidence(const RunSummary& s, const std::vector<int>& ranks) {
  const auto groups = group_stacks(s);
  const bool python_main = std::any_of(groups.begin(), groups.end(), [](const StackGroup& g) { return g.main && g.python; });
  std::string out;
  for (const auto& g : groups) {
    if (!g.main || g.frames.empty() || (!g.python && python_main)) continue;
    // The finding's ranks first: their group leads the line.
    const bool named = std::any_of(g.ranks.begin(), g.ranks.end(), [&](int r) {
      return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
    });
    const std::string part =
        fmt::format("rank {}: {}", join_ranks(g.ranks), g.python ? telling_frame(g) : without_parameters(telling_frame(g)));
    out = named ? (out.empty() ? part : part + "; " + out) : (out.empty() ? part : out + "; " + part);
    if (out.size() > 600) break;
  }
  return out.empty() ? out : "where the main threads were at the last stack capture: " + out + " (rankscope stacks RUN_DIR shows the whole stacks)";
}

}  // namespace rankscope::reader
