// Collective-op vocabulary (names, sizes, nccl-tests bandwidth), the
// communicator registry, and the record a closed span writes.
#include "rankscope/collective.hpp"

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "fnv1a.hpp"
#include "ring_file.hpp"

namespace rankscope {

std::string_view collective_op_name(CollectiveOp op) noexcept {
  switch (op) {
    case CollectiveOp::kAllReduce: return "all_reduce";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kReduce: return "reduce";
    case CollectiveOp::kAllGather: return "all_gather";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kAllToAll: return "all_to_all";
    case CollectiveOp::kSend: return "send";
    case CollectiveOp::kRecv: return "recv";
    case CollectiveOp::kBarrier: return "barrier";
    case CollectiveOp::kGroup: return "group";
    case CollectiveOp::kOther: break;
  }
  return "other";
}

std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kInt8: case DType::kUInt8: case DType::kBool: case DType::kFloat8E4M3: case DType::kFloat8E5M2:
      return 1;
    case DType::kFloat16: case DType::kBFloat16: return 2;
    case DType::kInt32: case DType::kUInt32: case DType::kFloat32: return 4;
    case DType::kInt64: case DType::kUInt64: case DType::kFloat64: return 8;
    case DType::kUnknown: break;
  }
  return 0;
}

std::string_view collective_result_name(CollectiveResult r) noexcept {
  switch (r) {
    case CollectiveResult::kOk: return "ok";
    case CollectiveResult::kFailed: return "failed";
    case CollectiveResult::kTimedOut: return "timed_out";
  }
  return "ok";
}

std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt32: return "int32";
    case DType::kUInt32: return "uint32";
    case DType::kInt64: return "int64";
    case DType::kUInt64: return "uint64";
    case DType::kFloat16: return "float16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat8E4M3: return "float8_e4m3";
    case DType::kFloat8E5M2: return "float8_e5m2";
    case DType::kBool: return "bool";
    case DType::kUnknown: break;
  }
  return "unknown";
}

std::uint64_t collective_bytes(CollectiveOp op, std::uint64_t count, DType dtype, int group_size) noexcept {
  const std::uint64_t per = count * dtype_size(dtype);
  const std::uint64_t n = group_size > 0 ? static_cast<std::uint64_t>(group_size) : 1;
  switch (op) {
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllToAll:
      return per * n;  // S is the whole array: the per-rank count times n (nccl-tests)
    case CollectiveOp::kBarrier:
    case CollectiveOp::kGroup:
      return 0;
    default:
      return per;
  }
}

double bus_bandwidth_factor(CollectiveOp op, int group_size) noexcept {
  const double n = group_size > 0 ? group_size : 1;
  switch (op) {
    case CollectiveOp::kAllReduce: return 2.0 * (n - 1) / n;
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllGather:
    case CollectiveOp::kAllToAll: return (n - 1) / n;
    case CollectiveOp::kBarrier:
    case CollectiveOp::kGroup: return 0.0;
    default: return 1.0;
  }
}

Bandwidth collective_bandwidth(CollectiveOp op, std::uint64_t count, DType dtype, int group_size,
                               double seconds) noexcept {
  Bandwidth b;
  if (!(seconds > 0)) return b;
  b.algbw_gbps = static_cast<double>(collective_bytes(op, count, dtype, group_size)) / 1e9 / seconds;
  b.busbw_gbps = b.algbw_gbps * bus_bandwidth_factor(op, group_size);
  return b;
}

std::uint64_t collective_fingerprint(CollectiveOp op, std::uint64_t count, DType dtype, int root_or_peer) noexcept {
  std::uint64_t h = detail::fnv1a_u64(static_cast<std::uint64_t>(op), detail::kStableIdSeed);
  h = detail::fnv1a_u64(count, h);
  h = detail::fnv1a_u64(static_cast<std::uint64_t>(dtype), h);
  return detail::fnv1a_u64(static_cast<std::uint64_t>(static_cast<std::int64_t>(root_or_peer)), h);
}

class CommunicatorRegistry {
 public:
  static CommunicatorRegistry& get() {
    static auto* r = new CommunicatorRegistry;  // leaked: records point at communicators
    return *r;
  }
  Communicator& by_name(std::string_view name, int size, int rank) {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = by_name_.find(std::string(name)); it != by_name_.end()) return *it->second;
    return make(std::string(name), size, rank);
  }
  Communicator& for_handle(const void* h, std::string_view name, int size, int rank) {
    std::lock_guard<std::mutex> lk(mu_);
    std::string n(name);
    // Every NCCL communicator is "nccl": number them with one counter per
    // base name (probing #1, #2, ... made the k-th registration O(k)).
    if (by_name_.contains(n)) {
      int& k = suffix_[n];
      do n = absl::StrCat(std::string(name), "#", ++k);
      while (by_name_.contains(n));
    }
    Communicator& c = make(std::move(n), size, rank);
    by_handle_[h] = &c;
    return c;
  }
  Communicator* find(const void* h) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_handle_.find(h);
    return it == by_handle_.end() ? nullptr : it->second;
  }
  void release(const void* h) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_handle_.find(h);
    if (it == by_handle_.end()) return;
    it->second->destroyed_.store(true, std::memory_order_relaxed);
    by_handle_.erase(it);
  }
  std::size_t live() {
    std::lock_guard<std::mutex> lk(mu_);
    std::size_t n = 0;
    for (Communicator* c : all_) n += !c->destroyed_.load(std::memory_order_relaxed);
    return n;
  }
  // Every live communicator and the kDestroyedListed most recently created
  // destroyed ones: a job that re-creates communicators (after an abort, per
  // restore) must not make every heartbeat and dump list them all.
  std::vector<const Communicator*> all() {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<const Communicator*> out;
    std::size_t destroyed = 0;
    for (auto it = all_.rbegin(); it != all_.rend(); ++it) {
      if ((*it)->destroyed_.load(std::memory_order_relaxed) && ++destroyed > kDestroyedListed) continue;
      out.push_back(*it);
    }
    std::reverse(out.begin(), out.end());
    return out;
  }
  const Communicator* by_id(std::uint32_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    return id < all_.size() ? all_[id] : nullptr;
  }
  static bool destroyed(const Communicator& c) { return c.destroyed_.load(std::memory_order_relaxed); }
  static std::unique_ptr<Communicator> detached(std::uint32_t id, std::string name, int size, int rank) {
    return std::unique_ptr<Communicator>(new Communicator(id, std::move(name), size, rank));
  }

 private:
  Communicator& make(std::string name, int size, int rank) {  // Requires mu_ held.
    auto* c = new Communicator(static_cast<std::uint32_t>(all_.size()), std::move(name), size, rank);
    all_.push_back(c);
    by_name_[c->name()] = c;
    detail::ring_file_note_communicator(*c);  // its records stay readable if the process is killed
    return *c;
  }
  static constexpr std::size_t kDestroyedListed = 16;
  std::mutex mu_;
  absl::flat_hash_map<std::string, int> suffix_;  // base name -> last #k given
  std::deque<Communicator*> all_;
  absl::flat_hash_map<std::string, Communicator*> by_name_;
  absl::flat_hash_map<const void*, Communicator*> by_handle_;
};

Communicator& communicator(std::string_view name, int size, int rank_in_group) {
  return CommunicatorRegistry::get().by_name(name, size, rank_in_group);
}
Communicator* communicator_for(const void* handle) noexcept {
  try {
    return CommunicatorRegistry::get().find(handle);
  } catch (...) {
    return nullptr;
  }
}
Communicator& register_communicator(const void* handle, std::string_view name, int size, int rank_in_group) {
  return CommunicatorRegistry::get().for_handle(handle, name, size, rank_in_group);
}
void release_communicator(const void* handle) noexcept {
  try {
    CommunicatorRegistry::get().release(handle);
  } catch (...) {
  }
}
std::size_t live_communicators() noexcept {
  try {
    return CommunicatorRegistry::get().live();
  } catch (...) {
    return 0;
  }
}

namespace detail {

std::vector<const Communicator*> all_communicators() { return CommunicatorRegistry::get().all(); }
const Communicator* communicator_by_id(std::uint32_t id) { return CommunicatorRegistry::get().by_id(id); }
bool communicator_destroyed(const Communicator& c) { return CommunicatorRegistry::destroyed(c); }
std::unique_ptr<Communicator> detached_communicator(std::uint32_t id, std::string name, int size, int rank) {
  return CommunicatorRegistry::detached(id, std::move(name), size, rank);
}

bool record_collective(ThreadState* st, const Communicator& c, CollectiveOp op, std::uint64_t seq, std::uint64_t count,
                       DType dtype, int peer, std::uint64_t t0, std::uint64_t t1, CollectiveResult r,
                       const Site* phase, const void* device, std::uint64_t flight_id, const Site* error,
                       bool in_group, const CollectiveWait* wait, DeviceSpan* span) noexcept {
  if (wait != nullptr && wait->phase == nullptr) wait = nullptr;
  if (span != nullptr) device = span;
  const bool extra = device != nullptr || error != nullptr || in_group || wait != nullptr;
  if (!st->try_reserve(extra ? 2 : 1)) return false;
  Record& rec = st->slot(0);
  set_header(rec, RecordKind::kCollective, t0, t1, phase, g_step.load(std::memory_order_relaxed),
             static_cast<std::uint8_t>(r),
             static_cast<std::uint16_t>(static_cast<unsigned>(op) | (static_cast<unsigned>(dtype) << 8)));
  rec.pad = static_cast<std::uint32_t>(peer);
  rec.v[0].i = static_cast<std::int64_t>(seq);
  rec.v[1].i = static_cast<std::int64_t>(count);
  rec.v[2].ptr = &c;
  if (extra) {
    Record& x = st->slot(1);
    set_header(x, RecordKind::kCollectiveExtra, wait != nullptr ? wait->t0 : t0, t1,
               wait != nullptr ? wait->phase : nullptr, rec.step,
               static_cast<std::uint8_t>(wait != nullptr ? wait->depth : 0),
               static_cast<std::uint16_t>((in_group ? 1 : 0) | (wait != nullptr ? 2 : 0) | (span != nullptr ? 4 : 0)));
    x.pad = 0;
    x.v[0].ptr = device;
    x.v[1].i = static_cast<std::int64_t>(flight_id);
    x.v[2].site = error;
  }
  st->commit(extra ? 2 : 1);
  return true;
}

}  // namespace detail
}  // namespace rankscope
