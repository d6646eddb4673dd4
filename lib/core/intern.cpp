// Interned sites for names known only at run time; leaked on purpose so the
// pointers stay valid in records until the process exits.
#include <deque>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "rankscope/site.hpp"

namespace rankscope {

const Site* intern(std::string_view name, PhaseKind kind) noexcept {
  static std::mutex* mu = new std::mutex;
  static auto* table = new absl::flat_hash_map<std::string, const Site*>;
  static auto* names = new std::deque<std::string>;  // stable addresses, reachable (no leak report)
  try {
    std::string key(name);
    key.push_back(static_cast<char>('0' + static_cast<int>(kind)));
    std::lock_guard<std::mutex> lk(*mu);
    auto [it, inserted] = table->try_emplace(std::move(key), nullptr);
    if (inserted) {
      const std::string& stored = names->emplace_back(name);
      it->second = new Site{stored.c_str(), "", "", 0, kind};
    }
    return it->second;
  } catch (...) {
    return nullptr;
  }
}

}  // namespace rankscope
