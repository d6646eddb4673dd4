// Phases timed on the device, through tests/fake_cudart.c: a CUDA runtime with
// the real call shape whose device time and completion the test controls. Its
// own binary: the runtime found at init() is process-wide.
#include <dlfcn.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "capture_sink.hpp"
#include "pending_collective.hpp"
#include "rank_config.hpp"
#include "rankscope/flight_recorder.hpp"
#include "rankscope/rankscope.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using rankscope::test::rank_config;
using rankscope::test::ScopedEnv;
using rankscope::test::ScopedRuntime;
using rankscope::test::slurp;
using rankscope::test::TempDir;

namespace {

// Before main: every init() of this binary finds the stand-in runtime.
const bool g_fake_runtime = ::setenv("RANKSCOPE_CUDA_RUNTIME", RANKSCOPE_FAKE_CUDART, 1) == 0;

// The stand-in's controls: the same library init() loaded (dlopen by path returns its handle).
struct FakeCuda {
  FakeCuda() {
    void* lib = ::dlopen(RANKSCOPE_FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
    REQUIRE(lib != nullptr);
    launch = reinterpret_cast<void (*)(void*, std::uint64_t)>(::dlsym(lib, "fake_cuda_launch"));
    block = reinterpret_cast<void (*)(void*)>(::dlsym(lib, "fake_cuda_block"));
    release = reinterpret_cast<void (*)(void*)>(::dlsym(lib, "fake_cuda_release"));
    events_created = reinterpret_cast<int (*)()>(::dlsym(lib, "fake_cuda_events_created"));
    REQUIRE((launch && block && release && events_created));
  }
  void (*launch)(void* stream, std::uint64_t ns);
  void (*block)(void* stream);
  void (*release)(void* stream);
  int (*events_created)();
};

void* stream(std::uintptr_t id) { return reinterpret_cast<void*>(id); }

std::vector<Event> phases_named(test::CaptureSink& sink, const std::string& name) {
  std::vector<Event> out;
  for (const Event& e : sink.of_kind(EventKind::kPhase)) {
    if (name == e.site->name) out.push_back(e);
  }
  return out;
}

}  // namespace

TEST_CASE("a phase on a CUDA thread carries the device's time next to the host's", "[device]") {
  REQUIRE(g_fake_runtime);
  FakeCuda cuda;
  TempDir tmp;
  REQUIRE(init(rank_config(tmp.path)).ok());
  {
    RANKSCOPE_PHASE("forward");
    cuda.launch(nullptr, 7'000'000);  // the kernels the host launched: 7 ms on the device
  }
  shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  CHECK_THAT(log, Catch::Contains(R"("name":"forward","phase_kind":"forward","dur":)") &&
                      Catch::Contains(R"(,"depth":0,"dev":7000000,"dev_queued":0})"));
}

// The fake device's clock stands still (kernels only queue), so a span's start
// is exactly its stream's backlog after the anchor; the host's clock moves
// between the anchor's stamp and the phase's start, by far less than the
// second of slack the bounds below leave.
TEST_CASE("a device-timed phase says how long its work waited in its stream's queue", "[device]") {
  FakeCuda cuda;
  ScopedRuntime rt;
  cuda.launch(stream(0x70), 100'000'000'000);  // 100 s of earlier work queued on the stream
  {
    RANKSCOPE_PHASE_ON("queued", stream(0x70));
    cuda.launch(stream(0x70), 5'000'000);
  }
  REQUIRE(flush());
  const auto got = phases_named(*rt.sink, "queued");
  REQUIRE(got.size() == 1);
  CHECK(got[0].device_ns == 5'000'000);
  CHECK(got[0].device_queued_ns <= 100'000'000'000);  // never more than the backlog
  CHECK(got[0].device_queued_ns > 99'000'000'000);
}

TEST_CASE("a collective on the device says how long it waited before the device started it", "[device]") {
  FakeCuda cuda;
  TempDir tmp;
  REQUIRE(init(rank_config(tmp.path)).ok());
  Communicator& world = communicator("queued_world", 2, 0);
  cuda.launch(stream(0x71), 100'000'000'000);  // the backward kernels the all-reduce is queued behind
  {
    python::PendingCollective ar(world, CollectiveOp::kAllReduce, 1024, DType::kFloat32, -1, stream(0x71), true);
    cuda.launch(stream(0x71), 250'000);
    ar.end(true, nullptr, stream(0x71));
  }
  shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  std::smatch m;
  REQUIRE(std::regex_search(log, m, std::regex(R"rx("dur":250000,.*"timing":"device".*"dev_queued":(\d+))rx")));
  const std::uint64_t queued = std::stoull(m[1].str());
  CHECK(queued <= 100'000'000'000);
  CHECK(queued > 99'000'000'000);
}

TEST_CASE("without a stream of its own a span has its device time but no device start", "[device]") {
  FakeCuda cuda;
  ScopedEnv no_streams("FAKE_CUDA_NO_STREAMS", "1");
  ScopedRuntime rt;
  {
    RANKSCOPE_PHASE_ON("unanchored", stream(0x72));
    cuda.launch(stream(0x72), 2'000'000);
  }
  REQUIRE(flush());
  const auto got = phases_named(*rt.sink, "unanchored");
  REQUIRE(got.size() == 1);
  CHECK(got[0].device_ns == 2'000'000);
  CHECK(got[0].device_queued_ns == -1);
}

TEST_CASE("the step breakdown counts a device-timed phase at its device time", "[device]") {
  FakeCuda cuda;
  ScopedRuntime rt;
  begin_step(5);
  {
    RANKSCOPE_PHASE("forward");
    cuda.launch(nullptr, 9'000'000);  // launched in microseconds, run for 9 ms
  }
  end_step();
  REQUIRE(flush());
  const StepBreakdown b = last_step_breakdown();
  CHECK(b.step == 5);
  CHECK(b.by_kind_ns[static_cast<int>(PhaseKind::kForward)] == 9'000'000);
}

TEST_CASE("a phase on a named stream is timed on that stream only", "[device]") {
  FakeCuda cuda;
  ScopedRuntime rt;
  {
    RANKSCOPE_PHASE_ON("backward", stream(0x51));
    cuda.launch(stream(0x51), 5'000'000);
    cuda.launch(nullptr, 3'000'000);  // another stream's work is not this phase's
  }
  REQUIRE(flush());
  const auto got = phases_named(*rt.sink, "backward");
  REQUIRE(got.size() == 1);
  CHECK(got[0].device_timed);
  CHECK(got[0].device_ns == 5'000'000);
}

TEST_CASE("a phase waits for the device to finish its work, and its thread's later events wait behind it",
          "[device]") {
  FakeCuda cuda;
  ScopedRuntime rt;
  begin_step(3);
  {
    RANKSCOPE_PHASE_ON("optimizer", stream(0x52));
    cuda.launch(stream(0x52), 1'000'000);
    cuda.block(stream(0x52));  // still running on the device when the host moved on
    cuda.launch(stream(0x52), 2'000'000);
  }
  end_step();  // a reader rebuilds the step from its phases before its end: the order must hold
  REQUIRE(flush());
  CHECK(phases_named(*rt.sink, "optimizer").empty());
  CHECK(rt.sink->of_kind(EventKind::kStepEnd).empty());
  cuda.release(stream(0x52));
  REQUIRE(flush());
  std::vector<EventKind> order;
  for (const Event& e : rt.sink->events) {
    if (e.kind == EventKind::kStepBegin || e.kind == EventKind::kPhase || e.kind == EventKind::kStepEnd) {
      order.push_back(e.kind);
    }
  }
  CHECK(order == std::vector<EventKind>{EventKind::kStepBegin, EventKind::kPhase, EventKind::kStepEnd});
  const auto got = phases_named(*rt.sink, "optimizer");
  REQUIRE(got.size() == 1);
  CHECK(got[0].device_ns == 3'000'000);
}

TEST_CASE("a phase the device never finished keeps its host time at shutdown", "[device]") {
  FakeCuda cuda;
  auto rt = std::make_unique<ScopedRuntime>();
  auto sink = rt->sink;
  {
    RANKSCOPE_PHASE_ON("all_reduce_wait", stream(0x53));
    cuda.block(stream(0x53));  // a collective whose peer never came
  }
  rt.reset();  // shutdown
  const auto got = phases_named(*sink, "all_reduce_wait");
  REQUIRE(got.size() == 1);
  CHECK_FALSE(got[0].device_timed);
  cuda.release(stream(0x53));
}

TEST_CASE("a thread without a current CUDA context is timed on the host only", "[device]") {
  FakeCuda cuda;
  ScopedRuntime rt;
  {
    ScopedEnv no_context("FAKE_CUDA_NO_CONTEXT", "1");  // a data-loading thread of a GPU process
    RANKSCOPE_PHASE("loader_wait");
    cuda.launch(nullptr, 1'000'000);
  }
  REQUIRE(flush());
  const auto got = phases_named(*rt.sink, "loader_wait");
  REQUIRE(got.size() == 1);
  CHECK_FALSE(got[0].device_timed);
}

TEST_CASE("RANKSCOPE_DEVICE_TIMING=0 turns device timing off", "[device]") {
  FakeCuda cuda;
  ScopedEnv off("RANKSCOPE_DEVICE_TIMING", "0");
  ScopedRuntime rt;
  const int events_before = cuda.events_created();
  {
    RANKSCOPE_PHASE_ON("forward_off", stream(0x54));
    cuda.launch(stream(0x54), 1'000'000);
  }
  REQUIRE(flush());
  const auto got = phases_named(*rt.sink, "forward_off");
  REQUIRE(got.size() == 1);
  CHECK_FALSE(got[0].device_timed);
  CHECK(cuda.events_created() == events_before);  // not one CUDA call
}

TEST_CASE("a thread far ahead of its device records host time until the device catches up", "[device]") {
  FakeCuda cuda;
  ScopedRuntime rt;
  cuda.block(stream(0x55));
  for (int i = 0; i < 300; ++i) {
    RANKSCOPE_PHASE_ON("ahead", stream(0x55));
    cuda.launch(stream(0x55), 1'000);
  }
  REQUIRE(flush());
  CHECK(phases_named(*rt.sink, "ahead").empty());  // all behind the first, which the device has not finished
  cuda.release(stream(0x55));
  REQUIRE(flush());
  const auto all = phases_named(*rt.sink, "ahead");
  REQUIRE(all.size() == 300);
  int device_timed = 0;
  for (const Event& e : all) device_timed += e.device_timed ? 1 : 0;
  CHECK(device_timed == 256);  // one pool of 256 spans in flight; the rest were host-timed
  CHECK(!all.back().device_timed);
}

TEST_CASE("phase_enter / phase_exit (Python's with-block) time the device too", "[device]") {
  FakeCuda cuda;
  ScopedRuntime rt;
  const Site* site = intern("python_forward", PhaseKind::kForward);
  detail::phase_enter(site, stream(0x56));
  cuda.launch(stream(0x56), 4'000'000);
  detail::phase_exit(site, stream(0x56));
  REQUIRE(flush());
  const auto got = phases_named(*rt.sink, "python_forward");
  REQUIRE(got.size() == 1);
  CHECK(got[0].device_ns == 4'000'000);
}

TEST_CASE("a GPU stuck in a phase's kernel holds its line back for 2 s, then it goes out with host time", "[device]") {
  FakeCuda cuda;
  ScopedRuntime rt;
  {
    RANKSCOPE_PHASE_ON("stuck", stream(0x57));
    cuda.block(stream(0x57));  // never released while the test waits
  }
  // Waits for the condition, however long the machine takes; the guard only stops a hang.
  std::vector<Event> got;
  for (int i = 0; i < 600 && got.empty(); ++i) {
    REQUIRE(flush());
    got = phases_named(*rt.sink, "stuck");
    if (got.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(got.size() == 1);
  CHECK_FALSE(got[0].device_timed);
  cuda.release(stream(0x57));
}

// What rankscope.torch does for a collective whose work runs on a CUDA stream (NCCL):
// bindings/python/pending_collective.hpp, with the stream torch would name.
TEST_CASE("a collective on the device completes when the device has finished it, in the flight recorder too",
          "[device]") {
  FakeCuda cuda;
  TempDir tmp;
  REQUIRE(init(rank_config(tmp.path)).ok());
  Communicator& world = communicator("device_world", 2, 0);
  {
    python::PendingCollective ar(world, CollectiveOp::kAllReduce, 1024, DType::kFloat32, -1, stream(0x60), true);
    REQUIRE(ar.on_device());
    cuda.launch(stream(0x60), 250'000);
    cuda.block(stream(0x60));  // NCCL's kernel, waiting for a peer that has not issued it yet
    ar.end(true, nullptr, stream(0x60));  // the host returned at once
  }
  REQUIRE(flush());
  CHECK(world.issued() == 1);
  CHECK(world.completed() == 0);  // on the device it is still running
  auto dump = dump_flight_recorder("test");
  REQUIRE(dump.ok());
  CHECK_THAT(slurp(*dump), Catch::Contains(R"("state":"issued")"));
  cuda.launch(stream(0x60), 0);
  cuda.release(stream(0x60));
  REQUIRE(flush());
  CHECK(world.completed() == 1);
  shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  CHECK_THAT(log, Catch::Contains(R"("op":"all_reduce","comm":"device_world")") &&
                      Catch::Contains(R"("dur":250000,)") && Catch::Contains(R"("timing":"device","enqueue_ns":)"));
}

TEST_CASE("a collective the device is stuck in is written after 2 s with host time and stays in flight", "[device]") {
  FakeCuda cuda;
  ScopedRuntime rt;
  Communicator& world = communicator("stuck_world", 2, 0);
  {
    python::PendingCollective ar(world, CollectiveOp::kAllReduce, 8, DType::kFloat32, -1, stream(0x61), true);
    cuda.block(stream(0x61));
    ar.end(true, nullptr, stream(0x61));
  }
  std::vector<Event> got;
  for (int i = 0; i < 600 && got.empty(); ++i) {  // waits for the condition; the guard only stops a hang
    REQUIRE(flush());
    got = rt.sink->of_kind(EventKind::kCollective);
    if (got.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(got.size() == 1);
  CHECK_FALSE(got[0].device_timed);
  CHECK(world.completed() == 0);  // still in flight: the GPU has not finished it
  cuda.release(stream(0x61));
  REQUIRE(flush());
  CHECK(world.completed() == 1);
}

TEST_CASE("a collective on a CPU thread of a GPU process completes when the host returns", "[device]") {
  FakeCuda cuda;
  ScopedRuntime rt;
  Communicator& world = communicator("host_world", 2, 0);
  ScopedEnv no_context("FAKE_CUDA_NO_CONTEXT", "1");
  python::PendingCollective ar(world, CollectiveOp::kBroadcast, 8, DType::kFloat32, 0, stream(0x62), true);
  CHECK_FALSE(ar.on_device());
  ar.end(true, nullptr, stream(0x62));
  CHECK(world.completed() == 1);
}

TEST_CASE("the heartbeat says, per stream, the oldest collective the host left and the GPU has not finished",
          "[device]") {
  FakeCuda cuda;
  TempDir tmp;
  REQUIRE(init(rank_config(tmp.path)).ok());
  Communicator& world = communicator("pending_world", 2, 0);
  Communicator& pipe = communicator("pending_pipe", 2, 0);
  const auto enqueue = [&](Communicator& c, CollectiveOp op, void* s) {
    python::PendingCollective coll(c, op, 8, DType::kFloat32, -1, s, true);
    cuda.block(s);  // NCCL's kernel, waiting for a peer
    coll.end(true, nullptr, s);  // the host returned at once
  };
  begin_step(3);
  enqueue(world, CollectiveOp::kAllReduce, stream(0x63));  // world #1, then #2 behind it on 0x63
  enqueue(world, CollectiveOp::kAllReduce, stream(0x63));
  enqueue(pipe, CollectiveOp::kBroadcast, stream(0x64));
  REQUIRE(flush());
  auto dump = dump_flight_recorder("test");
  REQUIRE(dump.ok());
  CHECK_THAT(slurp(*dump), Catch::Contains(R"("state":"issued")") && Catch::Contains(R"("on_device":true,"host_returned_ns":)"));
  shutdown();  // its last heartbeat: the GPU is still where it was
  const std::string beat = slurp(tmp.path + "/rank-0.heartbeat.json");
  CHECK_THAT(beat, Catch::Contains(R"("device_pending":[{"stream":"0x63","op":"all_reduce","comm":"pending_world","seq":1,"step":3,"age_ns":)") &&
                       Catch::Contains(R"({"stream":"0x64","op":"broadcast","comm":"pending_pipe","seq":1,"step":3,"age_ns":)") &&
                       !Catch::Contains(R"("seq":2,"step":3,"age_ns")"));
  CHECK_THAT(beat, Catch::Contains(R"("on_device":true)") && Catch::Contains("on the GPU: the host returned"));
  cuda.release(stream(0x63));
  cuda.release(stream(0x63));
  cuda.release(stream(0x64));
}
