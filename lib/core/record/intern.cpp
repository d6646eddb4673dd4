// Interned sites for names known only at run time; leaked on purpose so the
// pointers stay valid in records until the process exits.
#include <atomic>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "diagnostics.hpp"
#include "rankscope/site.hpp"

namespace rankscope {
namespace {
std::atomic<std::size_t> g_intern_limit{kMaxInternedNames};  // also read by the Python handle cache
}  // namespace

const Site* intern(std::string_view name, PhaseKind kind) noexcept {
  static std::mutex* mu = new std::mutex;
  static auto* table = new absl::flat_hash_map<std::string, const Site*>;
  static auto* names = new std::deque<std::string>;  // stable addresses, reachable (no leak report)
  static Site* overflow[kPhaseKindCount] = {};
  try {
    std::string key(name);
    key.push_back(static_cast<char>('0' + static_cast<int>(kind)));
    std::lock_guard<std::mutex> lk(*mu);
    if (auto it = table->find(key); it != table->end()) return it->second;
    const std::size_t limit = g_intern_limit.load(std::memory_order_relaxed);
    if (table->size() >= limit) {
      // A name made per step or per sample would grow this table for ever:
      // past the limit every new name shares one site per kind.
      Site*& o = overflow[static_cast<int>(kind)];
      if (o == nullptr) {
        detail::diagnose(detail::Topic::kNames,
                 "more than {} distinct run-time names (e.g. '{}'): new names are recorded as "
                 "'(too many names)'; use a fixed set of names and put varying values in fields",
                 limit, name);
        o = new Site{"(too many names)", "", "", 0, kind};
      }
      return o;
    }
    const std::string& stored = names->emplace_back(name);
    const Site* site = new Site{stored.c_str(), "", "", 0, kind};
    table->emplace(std::move(key), site);
    return site;
  } catch (...) {
    return nullptr;
  }
}

namespace detail {
// For tests: lower the limit to exercise the overflow without 65536 names.
void set_intern_limit(std::size_t n) noexcept { g_intern_limit.store(n, std::memory_order_relaxed); }
std::size_t intern_limit() noexcept { return g_intern_limit.load(std::memory_order_relaxed); }
}  // namespace detail

}  // namespace rankscope
