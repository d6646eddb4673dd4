// The NCCL hooks through a test backend with NCCL's call shape (no GPU).
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <sstream>
#include <thread>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "capture_sink.hpp"
#include "holding_sink.hpp"
#include "rankscope/integrations/nccl.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using namespace rankscope::test;  // the helpers of tests/*.hpp

namespace fake {

struct Ev {
  std::atomic<bool> done{false};
  int records = 0;
  int device = 0;  // current when it was created
};
std::vector<std::unique_ptr<Ev>> events;
int device_count = 1;
thread_local int current_device = 0;      // cudaSetDevice, per thread as in CUDA
std::atomic<int> wrong_device_records{0};
ncclResult_t next_result = ncclSuccess;
std::map<ncclComm_t, ncclResult_t> async_errors;
struct Call {
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t dt;
  int root;
  ncclComm_t comm;
  cudaStream_t stream;
};
std::vector<Call> calls;

ncclResult_t all_reduce(const void* s, void* r, size_t n, ncclDataType_t dt, ncclRedOp_t, ncclComm_t c,
                        cudaStream_t st) {
  calls.push_back({s, r, n, dt, -1, c, st});
  return next_result;
}
ncclResult_t broadcast(const void* s, void* r, size_t n, ncclDataType_t dt, int root, ncclComm_t c, cudaStream_t st) {
  calls.push_back({s, r, n, dt, root, c, st});
  return next_result;
}
ncclResult_t reduce(const void* s, void* r, size_t n, ncclDataType_t dt, ncclRedOp_t, int root, ncclComm_t c,
                    cudaStream_t st) {
  calls.push_back({s, r, n, dt, root, c, st});
  return next_result;
}
ncclResult_t all_gather(const void* s, void* r, size_t n, ncclDataType_t dt, ncclComm_t c, cudaStream_t st) {
  calls.push_back({s, r, n, dt, -1, c, st});
  return next_result;
}
ncclResult_t reduce_scatter(const void* s, void* r, size_t n, ncclDataType_t dt, ncclRedOp_t, ncclComm_t c,
                            cudaStream_t st) {
  calls.push_back({s, r, n, dt, -1, c, st});
  return next_result;
}
ncclResult_t all_to_all(const void* s, void* r, size_t n, ncclDataType_t dt, ncclComm_t c, cudaStream_t st) {
  calls.push_back({s, r, n, dt, -1, c, st});
  return next_result;
}
ncclResult_t send(const void* s, size_t n, ncclDataType_t dt, int peer, ncclComm_t c, cudaStream_t st) {
  calls.push_back({s, nullptr, n, dt, peer, c, st});
  return next_result;
}
ncclResult_t recv(void* r, size_t n, ncclDataType_t dt, int peer, ncclComm_t c, cudaStream_t st) {
  calls.push_back({nullptr, r, n, dt, peer, c, st});
  return next_result;
}
ncclResult_t group_start() { return ncclSuccess; }
ncclResult_t group_end() { return next_result; }
ncclResult_t comm_init_rank(ncclComm_t* c, int, ncclUniqueId, int) {
  static int storage[16];
  static int k = 0;
  *c = reinterpret_cast<ncclComm_t>(&storage[k++ % 16]);
  return ncclSuccess;
}
ncclResult_t comm_destroy(ncclComm_t) { return ncclSuccess; }
ncclResult_t comm_abort(ncclComm_t) { return ncclSuccess; }
ncclResult_t comm_count(const ncclComm_t, int* n) {
  *n = 4;
  return ncclSuccess;
}
ncclResult_t comm_user_rank(const ncclComm_t, int* r) {
  *r = 1;
  return ncclSuccess;
}
ncclResult_t comm_get_async_error(ncclComm_t c, ncclResult_t* e) {
  auto it = async_errors.find(c);
  *e = it == async_errors.end() ? ncclSuccess : it->second;
  return ncclSuccess;
}
const char* get_error_string(ncclResult_t) { return "fake error"; }
const char* get_last_error(ncclComm_t) { return "peer rank 3 timed out"; }
cudaError_t get_device_count(int* n) {
  *n = device_count;
  return device_count > 0 ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t event_create(cudaEvent_t* ev, unsigned int) {
  events.push_back(std::make_unique<Ev>());
  events.back()->device = current_device;
  *ev = reinterpret_cast<cudaEvent_t>(events.back().get());
  return cudaSuccess;
}
cudaError_t event_record(cudaEvent_t ev, cudaStream_t) {
  auto* e = reinterpret_cast<Ev*>(ev);
  if (e->device != current_device) {  // CUDA refuses an event of another device's context
    wrong_device_records++;
    return cudaErrorInvalidResourceHandle;
  }
  e->records++;
  e->done.store(false);
  return cudaSuccess;
}
cudaError_t event_query(cudaEvent_t ev) {
  return reinterpret_cast<Ev*>(ev)->done.load() ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t event_elapsed_ms(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 2.5f;
  return cudaSuccess;
}
cudaError_t get_device(int* d) {
  *d = current_device;
  return cudaSuccess;
}
void complete_all() {
  for (auto& e : events) e->done.store(true);
}

const nccl::Api api = {all_reduce,     broadcast,      reduce,           all_gather,       reduce_scatter,
                       all_to_all,     send,           recv,             group_start,      group_end,
                       comm_init_rank, comm_destroy,   comm_abort,       comm_count,       comm_user_rank,
                       comm_get_async_error, get_error_string, get_last_error, get_device_count,
                       event_create,   event_record,   event_query,      event_elapsed_ms, get_device};

struct Scope {
  explicit Scope(int devices = 1) {
    device_count = devices;
    next_result = ncclSuccess;
    calls.clear();
    async_errors.clear();
    nccl::set_api(&api);
  }
  ~Scope() {
    complete_all();
    nccl::set_api(nullptr);
  }
};

}  // namespace fake

namespace {
// The flight recorder dumped now, as text.
std::string flight_dump(const char* reason) {
  auto dump = dump_flight_recorder(reason);
  REQUIRE(dump.ok());
  std::ifstream in(*dump);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ncclComm_t make_comm() {
  ncclComm_t c = nullptr;
  ncclUniqueId id{};
  REQUIRE(RANKSCOPE_NCCL(ncclCommInitRank(&c, 4, id, 1)) == ncclSuccess);
  return c;
}
}  // namespace

TEST_CASE("hooks pass arguments through unchanged and return the call's result", "[nccl]") {
  fake::Scope f;
  ScopedRuntime rt;
  ncclComm_t comm = make_comm();
  float send[4], recv[4];
  auto* stream = reinterpret_cast<cudaStream_t>(0x1234);
  CHECK(RANKSCOPE_NCCL(ncclAllReduce(send, recv, 4, ncclFloat, ncclSum, comm, stream)) == ncclSuccess);
  CHECK(RANKSCOPE_NCCL(ncclBroadcast(send, recv, 3, ncclBfloat16, 2, comm, stream)) == ncclSuccess);
  CHECK(RANKSCOPE_NCCL(ncclReduce(send, recv, 2, ncclInt64, ncclMax, 1, comm, stream)) == ncclSuccess);
  CHECK(RANKSCOPE_NCCL(ncclAllGather(send, recv, 1, ncclUint8, comm, stream)) == ncclSuccess);
  CHECK(RANKSCOPE_NCCL(ncclReduceScatter(send, recv, 1, ncclFloat16, ncclSum, comm, stream)) == ncclSuccess);
  CHECK(RANKSCOPE_NCCL(ncclAlltoAll(send, recv, 1, ncclInt32, comm, stream)) == ncclSuccess);
  CHECK(RANKSCOPE_NCCL(ncclSend(send, 4, ncclFloat, 3, comm, stream)) == ncclSuccess);
  CHECK(RANKSCOPE_NCCL(ncclRecv(recv, 4, ncclFloat, 0, comm, stream)) == ncclSuccess);
  REQUIRE(fake::calls.size() == 8);
  CHECK(fake::calls[0].send == send);
  CHECK(fake::calls[0].recv == recv);
  CHECK(fake::calls[0].count == 4);
  CHECK(fake::calls[0].comm == comm);
  CHECK(fake::calls[0].stream == stream);
  CHECK(fake::calls[1].root == 2);
  CHECK(fake::calls[1].dt == ncclBfloat16);
  CHECK(fake::calls[6].root == 3);
  fake::next_result = ncclInternalError;
  CHECK(RANKSCOPE_NCCL(ncclAllReduce(send, recv, 4, ncclFloat, ncclSum, comm, stream)) == ncclInternalError);
  fake::complete_all();
  REQUIRE(flush());
  std::map<std::uint64_t, Event> by_seq;
  for (const auto& e : rt.sink->of_kind(EventKind::kCollective)) by_seq[e.seq] = e;
  REQUIRE(by_seq.size() == 9);
  CHECK(by_seq[1].op == CollectiveOp::kAllReduce);
  CHECK(by_seq[2].op == CollectiveOp::kBroadcast);
  CHECK(by_seq[2].peer == 2);
  CHECK(by_seq[2].dtype == DType::kBFloat16);
  CHECK(by_seq[3].dtype == DType::kInt64);
  CHECK(by_seq[4].op == CollectiveOp::kAllGather);
  CHECK(by_seq[7].op == CollectiveOp::kSend);
  CHECK(by_seq[8].op == CollectiveOp::kRecv);
  CHECK(by_seq[1].comm->size() == 4);
  CHECK(by_seq[1].comm->name().rfind("nccl", 0) == 0);
  rankscope::nccl::hooks::ncclCommDestroy(comm);
}

TEST_CASE("device timing: the span completes when the device does / never by synchronizing", "[nccl]") {
  fake::Scope f;
  test::TempDir tmp;
  Config cfg;
  cfg.run_dir = tmp.path;
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  auto sink = std::make_shared<test::CaptureSink>();
  cfg.sinks = {sink};
  REQUIRE(init(cfg).ok());
  ncclComm_t comm = make_comm();
  float buf[8];
  REQUIRE(RANKSCOPE_NCCL(ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, comm, nullptr)) == ncclSuccess);
  REQUIRE(flush());
  CHECK(sink->of_kind(EventKind::kCollective).empty());  // still running on the device
  CHECK_THAT(flight_dump("in flight"), Catch::Contains(R"("state":"issued","op":"all_reduce")"));
  fake::complete_all();
  REQUIRE(flush());
  auto cs = sink->of_kind(EventKind::kCollective);
  REQUIRE(cs.size() == 1);
  CHECK(cs[0].device_timed);
  CHECK(cs[0].dur_ns == 2'500'000);
  CHECK(cs[0].result == CollectiveResult::kOk);
  // Events come from a pool: 2 created for the first call, reused later.
  const auto created = fake::events.size();
  for (int i = 0; i < 10; ++i) {
    RANKSCOPE_NCCL(ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, comm, nullptr));
    fake::complete_all();
    REQUIRE(flush());
  }
  CHECK(fake::events.size() <= created + 2 * 10);
  CHECK(sink->of_kind(EventKind::kCollective).size() == 11);
  rankscope::nccl::hooks::ncclCommDestroy(comm);
  shutdown();
}

TEST_CASE("event pools of exited threads are reused on the same device / never across devices", "[nccl]") {
  fake::Scope f(2);
  ScopedRuntime rt;
  ncclComm_t comm = make_comm();
  float buf[8];
  const std::size_t pools0 = nccl::event_pools();
  const std::size_t events0 = fake::events.size();
  // 600 short-lived threads on device 0, every tenth on device 1, one
  // collective each: each used to leave a pool of 256 pairs behind.
  for (int i = 0; i < 600; ++i) {
    std::thread([&, i] {
      fake::current_device = i % 10 == 9 ? 1 : 0;
      RANKSCOPE_NCCL(ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, comm, nullptr));
    }).join();
  }
  // A thread that moves to device 1 takes a pool of that device.
  std::thread([&] {
    RANKSCOPE_NCCL(ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, comm, nullptr));
    fake::current_device = 1;
    RANKSCOPE_NCCL(ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, comm, nullptr));
  }).join();
  CHECK(nccl::event_pools() - pools0 == 2);  // one per device
  CHECK(fake::wrong_device_records == 0);
  CHECK(fake::events.size() - events0 <= 2 * 2 * 256);  // at most every pair of both pools
  fake::complete_all();
  REQUIRE(flush());
  std::size_t device_timed = 0;
  for (const auto& e : rt.sink->of_kind(EventKind::kCollective)) device_timed += e.device_timed ? 1 : 0;
  CHECK(rt.sink->of_kind(EventKind::kCollective).size() == 602);
  CHECK(device_timed > 0);
  rankscope::nccl::hooks::ncclCommDestroy(comm);
}


TEST_CASE("a device-timed collective dropped by a full ring completes at return and frees its pair", "[nccl]") {
  fake::Scope f;
  test::TempDir tmp;
  auto hold = std::make_shared<HoldingSink>();
  ScopedRuntime rt([&] {
    Config c;
    c.run_dir = tmp.path;  // for the flight dump
    c.ring_capacity = 64;
    c.sinks.push_back(hold);
    return c;
  }());
  ReleaseAtExit release{*hold};
  ncclComm_t comm = make_comm();
  float buf[8];
  { RANKSCOPE_PHASE("hold"); }  // delivered at the next drain, which then stays in the sink
  REQUIRE(hold->wait_until_held());
  const auto dropped0 = stats().events_dropped;
  std::thread([&] {
    for (int i = 0; i < 100; ++i) {
      RANKSCOPE_PHASE("fill");  // the ring (64) overflows: nothing drains it now
    }
    RANKSCOPE_NCCL(ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, comm, nullptr));
  }).join();
  CHECK(stats().events_dropped > dropped0);
  hold->release();
  // The device never finished it (no complete_all): a recorded collective
  // would be issued until polled; a dropped one is completed at return.
  CHECK(flight_dump("check").find(R"("state":"issued")") == std::string::npos);
  rankscope::nccl::hooks::ncclCommDestroy(comm);
}

TEST_CASE("failures are recorded with NCCL's messages / counted and returned unchanged", "[nccl]") {
  fake::Scope f;
  ScopedRuntime rt;
  ncclComm_t comm = make_comm();
  const auto failed0 = rankscope::nccl::failed_collectives();
  fake::next_result = ncclRemoteError;
  float buf[2];
  CHECK(RANKSCOPE_NCCL(ncclAllReduce(buf, buf, 2, ncclFloat, ncclSum, comm, nullptr)) == ncclRemoteError);
  CHECK(rankscope::nccl::failed_collectives() == failed0 + 1);
  REQUIRE(flush());
  auto cs = rt.sink->of_kind(EventKind::kCollective);
  REQUIRE(cs.size() == 1);  // not deferred: nothing was launched
  CHECK(cs[0].result == CollectiveResult::kFailed);
  REQUIRE(cs[0].error != nullptr);
  CHECK(std::string(cs[0].error) == "fake error: peer rank 3 timed out");
  rankscope::nccl::hooks::ncclCommDestroy(comm);
}

TEST_CASE("asynchronous communicator errors are reported once per communicator", "[nccl]") {
  fake::Scope f;
  ScopedRuntime rt;
  ncclComm_t comm = make_comm();
  fake::async_errors[comm] = ncclSystemError;
  REQUIRE(flush());
  REQUIRE(flush());
  auto errs = rt.sink->of_kind(EventKind::kCommError);
  REQUIRE(errs.size() == 1);
  CHECK_THAT(std::string(errs[0].error), Catch::Contains("async: fake error"));
  rankscope::nccl::hooks::ncclCommDestroy(comm);
}

TEST_CASE("a group is recorded as one grouped operation as well as its members", "[nccl]") {
  fake::Scope f;
  ScopedRuntime rt;
  ncclComm_t comm = make_comm();
  float a[4], b[4];
  REQUIRE(RANKSCOPE_NCCL(ncclGroupStart()) == ncclSuccess);
  RANKSCOPE_NCCL(ncclSend(a, 4, ncclFloat, 2, comm, nullptr));
  RANKSCOPE_NCCL(ncclRecv(b, 4, ncclFloat, 2, comm, nullptr));
  REQUIRE(RANKSCOPE_NCCL(ncclGroupEnd()) == ncclSuccess);
  REQUIRE(flush());
  int members = 0, groups = 0;
  for (const auto& e : rt.sink->of_kind(EventKind::kCollective)) {
    if (e.op == CollectiveOp::kGroup) {
      ++groups;
      CHECK(e.count == 2);
    } else {
      ++members;
      CHECK(e.in_group);
      CHECK_FALSE(e.device_timed);
    }
  }
  CHECK(members == 2);
  CHECK(groups == 1);
  rankscope::nccl::hooks::ncclCommDestroy(comm);
}

TEST_CASE("without a device the hooks fall back to host timing", "[nccl]") {
  fake::Scope f(/*devices=*/0);
  ScopedRuntime rt;
  ncclComm_t comm = make_comm();
  auto records = [] {
    int n = 0;
    for (auto& e : fake::events) n += e->records;
    return n;
  };
  const int before = records();
  float buf[2];
  RANKSCOPE_NCCL(ncclAllReduce(buf, buf, 2, ncclFloat, ncclSum, comm, nullptr));
  RANKSCOPE_NCCL(ncclAllReduce(buf, buf, 2, ncclFloat, ncclSum, comm, nullptr));
  REQUIRE(flush());  // host-timed spans are not deferred
  auto cs = rt.sink->of_kind(EventKind::kCollective);
  REQUIRE(cs.size() == 2);
  CHECK_FALSE(cs[0].device_timed);
  CHECK(records() == before);  // no CUDA event was recorded for these calls
  rankscope::nccl::hooks::ncclCommDestroy(comm);
}

TEST_CASE("communicator init and destroy keep the live count", "[nccl]") {
  fake::Scope f;
  ScopedRuntime rt;
  const auto before = live_communicators();
  ncclComm_t a = make_comm();
  ncclComm_t b = make_comm();
  CHECK(live_communicators() == before + 2);
  rankscope::nccl::hooks::ncclCommDestroy(a);
  rankscope::nccl::hooks::ncclCommAbort(b);
  CHECK(live_communicators() == before);
}
