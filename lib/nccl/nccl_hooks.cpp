// NCCL hook implementations: collective spans with device timing from pooled
// CUDA events, error capture, async-error polling, communicator lifecycle.

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "device_pools.hpp"
#include "diagnostics.hpp"
#include "environment.hpp"
#include "rankscope/detail/clock.hpp"
#include "rankscope/detail/extension.hpp"
#include "rankscope/detail/gate.hpp"
#include "rankscope/detail/thread_state.hpp"
#include "rankscope/integrations/nccl.hpp"
#include "rankscope/metrics.hpp"
#include "rankscope/timer.hpp"

namespace rankscope::nccl {
namespace {

const Api kReal = {
    ::ncclAllReduce,     ::ncclBroadcast,         ::ncclReduce,          ::ncclAllGather,   ::ncclReduceScatter,
    ::ncclAlltoAll,      ::ncclSend,              ::ncclRecv,            ::ncclGroupStart,  ::ncclGroupEnd,
    ::ncclCommInitRank,  ::ncclCommDestroy,       ::ncclCommAbort,       ::ncclCommCount,   ::ncclCommUserRank,
    ::ncclCommGetAsyncError, ::ncclGetErrorString, ::ncclGetLastError,   ::cudaGetDeviceCount,
    ::cudaEventCreateWithFlags, ::cudaEventRecord, ::cudaEventQuery,     ::cudaEventElapsedTime,
    ::cudaGetDevice,
};

std::atomic<const Api*> g_api{&kReal};
std::atomic<std::uint64_t> g_failed{0};
std::atomic<int> g_device_timing{0};  // 0 unknown, 1 CUDA events, 2 host timing only

const Api& api() { return *g_api.load(std::memory_order_acquire); }

// Two CUDA events around one call. Pairs belong to the issuing thread's pool;
// `busy` is cleared by the background thread once the end event completed.
struct EventPair {
  cudaEvent_t start = nullptr;
  cudaEvent_t end = nullptr;
  std::atomic<bool> busy{false};
  bool created = false;
};

constexpr int kPairsPerThread = 256;

using ThreadPool = detail::SlotPool<EventPair, kPairsPerThread>;  // a thread's pairs, on one device
using ThreadPools = detail::DevicePools<ThreadPool>;

thread_local int t_group_depth = 0;
thread_local std::uint64_t t_group_t0 = 0;
thread_local std::uint64_t t_group_ops = 0;
thread_local const Site* t_group_phase = nullptr;

// Communicators by handle, with a one-entry per-thread cache so the hot path
// takes no lock; `g_comm_gen` invalidates caches when a handle is released.
struct CommEntry {
  Communicator* comm;
  bool async_reported = false;
};
std::mutex g_comm_mu;
absl::flat_hash_map<const void*, CommEntry>* g_comms = new absl::flat_hash_map<const void*, CommEntry>;
std::atomic<std::uint64_t> g_comm_gen{1};
thread_local const void* t_cache_handle = nullptr;
thread_local Communicator* t_cache_comm = nullptr;
thread_local std::uint64_t t_cache_gen = 0;

Communicator& comm_for(ncclComm_t h) {
  const std::uint64_t gen = g_comm_gen.load(std::memory_order_acquire);
  if (t_cache_handle == h && t_cache_gen == gen && t_cache_comm != nullptr) return *t_cache_comm;
  std::lock_guard<std::mutex> lk(g_comm_mu);
  auto it = g_comms->find(h);
  if (it == g_comms->end()) {
    // A communicator created without the init hook: learn its shape from NCCL.
    int n = 1, r = 0;
    api().comm_count(h, &n);
    api().comm_user_rank(h, &r);
    Communicator& c = register_communicator(h, "nccl", n, r);
    it = g_comms->emplace(h, CommEntry{&c}).first;
  }
  t_cache_handle = h;
  t_cache_comm = it->second.comm;
  t_cache_gen = gen;
  return *it->second.comm;
}

bool device_timing() {
  int state = g_device_timing.load(std::memory_order_acquire);
  if (state != 0) return state == 1;
  int n = 0;
  const cudaError_t err = api().get_device_count(&n);
  const int decided = (err == cudaSuccess && n > 0) ? 1 : 2;
  int expected = 0;
  if (g_device_timing.compare_exchange_strong(expected, decided) && decided == 2) {
    detail::diagnose(detail::Topic::kCollectives,
                     "NCCL hooks: no usable CUDA device (cudaGetDeviceCount returned {}, {} devices); "
                     "collective spans use host timing",
                     static_cast<int>(err), n);
  }
  return decided == 1;
}

// Takes a free pair and records its start event; null when none is free (the
// device is far behind) or event creation fails: host timing for this call.
EventPair* acquire_pair(cudaStream_t stream) {
  int device = 0;  // a backend table without get_device: one device
  if (api().get_device != nullptr && api().get_device(&device) != cudaSuccess) return nullptr;
  ThreadPool* pool = ThreadPools::instance().for_thread(device);
  EventPair& p = pool->slots[pool->next];
  if (p.busy.load(std::memory_order_acquire)) return nullptr;
  if (!p.created) {
    if (api().event_create(&p.start, cudaEventDefault) != cudaSuccess ||
        api().event_create(&p.end, cudaEventDefault) != cudaSuccess) {
      return nullptr;
    }
    p.created = true;
  }
  if (api().event_record(p.start, stream) != cudaSuccess) return nullptr;
  pool->next = (pool->next + 1) % kPairsPerThread;
  p.busy.store(true, std::memory_order_relaxed);
  return &p;
}

// Failures: count, intern the message for the record, one stderr line per second.
const Site* note_failure(ncclResult_t res, ncclComm_t comm, CollectiveOp op, std::uint64_t seq) {
  g_failed.fetch_add(1, std::memory_order_relaxed);
  static Counter& failed = counter("rankscope_collectives_failed_total", "Collectives that returned an error");
  failed.add(1);
  const char* es = api().get_error_string(res);
  const char* last = comm != nullptr ? api().get_last_error(comm) : nullptr;
  const std::string msg = absl::StrCat(es != nullptr ? es : "unknown NCCL error", (last && *last) ? ": " : "",
                                       (last && *last) ? last : "");
  static std::atomic<std::uint64_t> last_log_ns{0};
  const std::uint64_t now = detail::monotonic_ns();
  std::uint64_t prev = last_log_ns.load(std::memory_order_relaxed);
  if (now - prev >= 1'000'000'000ull && last_log_ns.compare_exchange_strong(prev, now)) {
    detail::diagnose(detail::Topic::kCollectives, "{} seq {} failed: {} (result {})", collective_op_name(op), seq, msg,
                     static_cast<int>(res));
  }
  return intern(msg, PhaseKind::kCollective);
}

template <typename Call>
ncclResult_t run(ncclComm_t handle, CollectiveOp op, size_t count, ncclDataType_t dt, int peer, cudaStream_t stream,
                 Call&& call) noexcept {
  if (!detail::gate_open()) return call();
  detail::ThreadState* st = detail::thread_state();
  if (st == nullptr) return call();
  Communicator* c = nullptr;
  try {
    c = &comm_for(handle);
  } catch (...) {
    return call();
  }
  const DType dtype = to_dtype(dt);
  const std::uint64_t seq = c->next_sequence();
  const Site* phase = detail::current_phase(st);
  const std::uint64_t t0 = detail::now_ticks();
  const std::uint64_t flight = detail::flight_issue(*c, op, seq, count, dtype, peer, t0, phase, st->tid);
  const bool in_group = t_group_depth > 0;
  // Inside a group NCCL launches nothing until GroupEnd: events would time nothing.
  EventPair* pair = (!in_group && device_timing()) ? acquire_pair(stream) : nullptr;
  const ncclResult_t res = call();
  const std::uint64_t t1 = detail::now_ticks();
  if (in_group) ++t_group_ops;
  const Site* error = nullptr;
  CollectiveResult result = CollectiveResult::kOk;
  if (res != ncclSuccess && res != ncclInProgress) {
    result = CollectiveResult::kFailed;
    error = note_failure(res, handle, op, seq);
  }
  if (pair != nullptr && (result != CollectiveResult::kOk || api().event_record(pair->end, stream) != cudaSuccess)) {
    pair->busy.store(false, std::memory_order_release);
    pair = nullptr;
  }
  if (pair == nullptr) {  // host timing: complete now
    detail::flight_complete(flight, t1, result);
    c->note_completed(seq);
  } else {  // in flight until the device has finished it (poll)
    detail::flight_on_device(flight, t1, stream);
  }
  if (!detail::record_collective(st, *c, op, seq, count, dtype, peer, t0, t1, result, phase, pair, flight, error,
                                 in_group) &&
      pair != nullptr) {
    // Dropped (ring full): nobody will poll this pair. Free it, and complete
    // the collective at the call's return rather than leave it issued.
    pair->busy.store(false, std::memory_order_release);
    detail::flight_complete(flight, t1, result);
    c->note_completed(seq);
  }
  return res;
}

// ---- background thread side -------------------------------------------------

struct Pending {
  Event event;
  EventPair* pair;
  std::uint64_t flight_id;  // the collective's flight-recorder entry
};
std::vector<Pending>* g_pending = new std::vector<Pending>;  // background thread only

bool defer(const Event& e, const void* handle, std::uint64_t flight_id) {
  auto* pair = static_cast<EventPair*>(const_cast<void*>(handle));
  g_pending->push_back(Pending{e, pair, flight_id});
  return true;
}

void poll(std::vector<Event>& out) {
  // Device completions, in issue order per pair.
  auto& pending = *g_pending;
  std::size_t keep = 0;
  for (std::size_t i = 0; i < pending.size(); ++i) {
    Pending& p = pending[i];
    const cudaError_t q = api().event_query(p.pair->end);
    if (q == cudaErrorNotReady) {
      pending[keep++] = p;
      continue;
    }
    Event e = p.event;
    float ms = 0;
    if (q == cudaSuccess && api().event_elapsed_ms(&ms, p.pair->start, p.pair->end) == cudaSuccess) {
      e.device_timed = true;
      e.dur_ns = static_cast<std::uint64_t>(static_cast<double>(ms) * 1e6);
    } else {
      e.result = CollectiveResult::kFailed;
      e.error = "CUDA event query failed";
    }
    p.pair->busy.store(false, std::memory_order_release);
    // The collective is done when the device says so, not when the call returned.
    detail::flight_complete(p.flight_id, detail::now_ticks(), e.result);
    if (e.comm != nullptr) const_cast<Communicator*>(e.comm)->note_completed(e.seq);
    out.push_back(e);
  }
  pending.resize(keep);

  // Async communicator errors, once per communicator.
  std::lock_guard<std::mutex> lk(g_comm_mu);
  for (auto& [h, entry] : *g_comms) {
    if (entry.async_reported) continue;
    ncclResult_t err = ncclSuccess;
    if (api().comm_get_async_error(static_cast<ncclComm_t>(const_cast<void*>(h)), &err) != ncclSuccess) continue;
    if (err == ncclSuccess || err == ncclInProgress) continue;
    entry.async_reported = true;
    const char* es = api().get_error_string(err);
    const char* last = api().get_last_error(static_cast<ncclComm_t>(const_cast<void*>(h)));
    const std::string msg =
        absl::StrCat("async: ", es != nullptr ? es : "error", (last && *last) ? ": " : "", (last && *last) ? last : "");
    Event e;
    e.kind = EventKind::kCommError;
    e.comm = entry.comm;
    e.error = intern(msg, PhaseKind::kCollective)->name;
    const auto t = detail::convert_ticks(detail::now_ticks());
    e.mono_ns = t.mono_ns;
    e.wall_ns = t.wall_ns;
    e.step = detail::g_step.load(std::memory_order_relaxed);
    detail::diagnose(detail::Topic::kCollectives, "communicator '{}' reported an asynchronous error: {}",
                     entry.comm->name(), msg);
    out.push_back(e);
  }
}

struct Installer {
  Installer() {
    detail::set_collective_extension(&defer, &poll);
    ThreadPools::instance();  // its fork handlers, registered before any thread can hold its lock
    // Versions for the environment summary; none of these needs a GPU, and
    // none initialises a CUDA context (forking after this stays safe).
    int nccl = 0, rt = 0, drv = 0;
    if (::ncclGetVersion(&nccl) == ncclSuccess) {
      detail::add_environment_entry("nccl", absl::StrCat(nccl / 10000, ".", (nccl / 100) % 100, ".", nccl % 100));
    }
    if (::cudaRuntimeGetVersion(&rt) == cudaSuccess) {
      detail::add_environment_entry("cuda_runtime", absl::StrCat(rt / 1000, ".", (rt % 1000) / 10));
    }
    detail::add_environment_entry(
        "cuda_driver", ::cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0
                           ? absl::StrCat(drv / 1000, ".", (drv % 1000) / 10)
                           : std::string("none"));
  }
};
const Installer g_installer;

}  // namespace

const Api& real_api() noexcept { return kReal; }
void set_api(const Api* a) noexcept {
  g_api.store(a != nullptr ? a : &kReal, std::memory_order_release);
  g_device_timing.store(0, std::memory_order_release);  // re-detect with the new backend
}
std::uint64_t failed_collectives() noexcept { return g_failed.load(std::memory_order_relaxed); }
std::size_t event_pools() noexcept { return ThreadPools::instance().made(); }

DType to_dtype(ncclDataType_t t) noexcept {
  switch (t) {
    case ncclInt8: return DType::kInt8;
    case ncclUint8: return DType::kUInt8;
    case ncclInt32: return DType::kInt32;
    case ncclUint32: return DType::kUInt32;
    case ncclInt64: return DType::kInt64;
    case ncclUint64: return DType::kUInt64;
    case ncclFloat16: return DType::kFloat16;
    case ncclFloat32: return DType::kFloat32;
    case ncclFloat64: return DType::kFloat64;
    case ncclBfloat16: return DType::kBFloat16;
    case ncclFloat8e4m3: return DType::kFloat8E4M3;
    case ncclFloat8e5m2: return DType::kFloat8E5M2;
    default: return DType::kUnknown;
  }
}

namespace hooks {

ncclResult_t ncclAllReduce(const void* s, void* r, size_t count, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) noexcept {
  return run(comm, CollectiveOp::kAllReduce, count, dt, -1, stream,
             [&] { return api().all_reduce(s, r, count, dt, op, comm, stream); });
}
ncclResult_t ncclBroadcast(const void* s, void* r, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                           cudaStream_t stream) noexcept {
  return run(comm, CollectiveOp::kBroadcast, count, dt, root, stream,
             [&] { return api().broadcast(s, r, count, dt, root, comm, stream); });
}
ncclResult_t ncclReduce(const void* s, void* r, size_t count, ncclDataType_t dt, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) noexcept {
  return run(comm, CollectiveOp::kReduce, count, dt, root, stream,
             [&] { return api().reduce(s, r, count, dt, op, root, comm, stream); });
}
ncclResult_t ncclAllGather(const void* s, void* r, size_t sendcount, ncclDataType_t dt, ncclComm_t comm,
                           cudaStream_t stream) noexcept {
  return run(comm, CollectiveOp::kAllGather, sendcount, dt, -1, stream,
             [&] { return api().all_gather(s, r, sendcount, dt, comm, stream); });
}
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t recvcount, ncclDataType_t dt, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) noexcept {
  return run(comm, CollectiveOp::kReduceScatter, recvcount, dt, -1, stream,
             [&] { return api().reduce_scatter(s, r, recvcount, dt, op, comm, stream); });
}
ncclResult_t ncclAlltoAll(const void* s, void* r, size_t count, ncclDataType_t dt, ncclComm_t comm,
                          cudaStream_t stream) noexcept {
  return run(comm, CollectiveOp::kAllToAll, count, dt, -1, stream,
             [&] { return api().all_to_all(s, r, count, dt, comm, stream); });
}
ncclResult_t ncclSend(const void* s, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                      cudaStream_t stream) noexcept {
  return run(comm, CollectiveOp::kSend, count, dt, peer, stream,
             [&] { return api().send(s, count, dt, peer, comm, stream); });
}
ncclResult_t ncclRecv(void* r, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                      cudaStream_t stream) noexcept {
  return run(comm, CollectiveOp::kRecv, count, dt, peer, stream,
             [&] { return api().recv(r, count, dt, peer, comm, stream); });
}

ncclResult_t ncclGroupStart() noexcept {
  const ncclResult_t res = api().group_start();
  if (res == ncclSuccess && t_group_depth++ == 0 && detail::g_gate.load(std::memory_order_relaxed) == detail::kActive) {
    t_group_t0 = detail::now_ticks();
    t_group_ops = 0;
    detail::ThreadState* st = detail::thread_state();
    t_group_phase = st != nullptr ? detail::current_phase(st) : nullptr;
  }
  return res;
}

ncclResult_t ncclGroupEnd() noexcept {
  const ncclResult_t res = api().group_end();
  if (t_group_depth > 0 && --t_group_depth == 0 && t_group_t0 != 0 && detail::gate_open()) {
    // The whole group as one grouped operation, on a communicator of its own.
    detail::ThreadState* st = detail::thread_state();
    if (st != nullptr) {
      static Communicator& groups = communicator("nccl_group", 1, 0);
      const std::uint64_t seq = groups.next_sequence();
      const std::uint64_t t1 = detail::now_ticks();
      const CollectiveResult r =
          (res == ncclSuccess || res == ncclInProgress) ? CollectiveResult::kOk : CollectiveResult::kFailed;
      const Site* error = r == CollectiveResult::kOk ? nullptr : note_failure(res, nullptr, CollectiveOp::kGroup, seq);
      groups.note_completed(seq);
      detail::record_collective(st, groups, CollectiveOp::kGroup, seq, t_group_ops, DType::kUnknown, -1, t_group_t0,
                                t1, r, t_group_phase, nullptr, 0, error, false);
    }
    t_group_t0 = 0;
  }
  return res;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) noexcept {
  ncclResult_t res;
  {  // in flight while it waits for the other ranks (heartbeat, stall, flight dump)
    RANKSCOPE_PHASE("nccl_comm_init");
    res = api().comm_init_rank(comm, nranks, id, rank);
  }
  if (res == ncclSuccess && comm != nullptr && *comm != nullptr) {
    try {
      std::lock_guard<std::mutex> lk(g_comm_mu);
      Communicator& c = register_communicator(*comm, "nccl", nranks, rank);
      (*g_comms)[*comm] = CommEntry{&c};
    } catch (...) {
    }
  }
  return res;
}

namespace {
void forget(ncclComm_t comm) {
  try {
    std::lock_guard<std::mutex> lk(g_comm_mu);
    g_comms->erase(comm);
  } catch (...) {
  }
  release_communicator(comm);
  g_comm_gen.fetch_add(1, std::memory_order_acq_rel);
}
}  // namespace

ncclResult_t ncclCommDestroy(ncclComm_t comm) noexcept {
  forget(comm);
  return api().comm_destroy(comm);
}
ncclResult_t ncclCommAbort(ncclComm_t comm) noexcept {
  forget(comm);
  return api().comm_abort(comm);
}

}  // namespace hooks
}  // namespace rankscope::nccl
