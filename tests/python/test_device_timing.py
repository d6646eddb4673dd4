"""Phases timed on the device, on real multi-process runs with default settings, through
tests/fake_cudart.c: a CUDA runtime with the real call shape (events, streams, elapsed time)
whose device the test controls. RANKSCOPE_CUDA_RUNTIME points rankscope at it, as a trainer's
own libcudart would be found on a GPU machine; every phase of such a run is then timed on the
device too, each phase's kernels taking exactly FAKE_CUDA_PHASE_KERNEL_NS of device time."""
import glob
import json
import os
import shutil
import subprocess

import pytest

from conftest import RANKSCOPE, ROOT, TORCHRUN, kill_job, run_log_events, wait_for

KERNEL_NS = 3_000_000


@pytest.fixture(scope="module")
def fake_cudart(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    out = tmp_path_factory.mktemp("fake_cudart") / "libfake_cudart.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), os.path.join(ROOT, "tests", "fake_cudart.c"),
                    "-lpthread"], check=True)
    return str(out)


def _device_env(fake_cudart):
    return {"RANKSCOPE_CUDA_RUNTIME": fake_cudart, "FAKE_CUDA_PHASE_KERNEL_NS": str(KERNEL_NS)}


def test_a_ddp_run_on_a_cuda_device_writes_each_phases_device_time_next_to_its_host_time(tmp_path, torchrun,
                                                                                     fake_cudart):
    p = torchrun(os.path.join(ROOT, "examples", "python", "train_ddp.py"), 2, "--epochs", "1",
                 env=_device_env(fake_cudart))
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = str(tmp_path / p.stdout.strip().splitlines()[-1])
    phases = run_log_events(run_dir, "phase")
    assert {e["rank"] for e in phases} == {0, 1}
    # Every phase was device-timed: its kernels' time, and its nested phases' (whole kernels each).
    assert all(e.get("dev", 0) >= KERNEL_NS and e["dev"] % KERNEL_NS == 0 for e in phases), \
        [e for e in phases if e.get("dev", 0) < KERNEL_NS or e["dev"] % KERNEL_NS][:3]
    forward = [e for e in phases if e["name"] == "forward"]
    assert len(forward) == 2 * 16, len(forward)  # 16 steps per rank (train_ddp's defaults)
    assert {e["dev"] for e in forward} == {KERNEL_NS}  # nothing nested: exactly its own kernels
    s = subprocess.run([RANKSCOPE, "summary", run_dir], capture_output=True, text=True, timeout=120)
    assert s.returncode == 0, s.stderr[-2000:]
    assert "phases timed on the GPU count their device time" in s.stdout, s.stdout[-3000:]
    j = subprocess.run([RANKSCOPE, "summary", "--json", run_dir], capture_output=True, text=True, timeout=120)
    for r in json.loads(j.stdout)["ranks"]:
        # The breakdown is rebuilt from the lines' order, which device timing keeps (a phase's
        # line waits for its device time, and its thread's later lines behind it).
        # The breakdown counts the device's time of a phase timed there; the host's is beside it.
        assert r["median_phase_ms"]["forward"] == KERNEL_NS / 1e6, r
        assert r["median_phase_ms"]["optimizer"] == KERNEL_NS / 1e6, r
        assert r["median_host_phase_ms"]["forward"] > 0 and r["median_host_phase_ms"]["optimizer"] > 0, r
        assert r["device_timed_phases"] > 0, r
    _check_device_tracks(run_dir, tmp_path, phases, [])


def _check_device_tracks(run_dir, tmp_path, phases, colls):
    """Every device-timed line says where the device started it, and the timeline draws it
    there: on a GPU track, `dev_queued` after the host's start, for `dev`."""
    assert all(e.get("dev_queued", -1) >= 0 for e in phases + colls), \
        [e for e in phases + colls if "dev_queued" not in e][:2]
    trace = tmp_path / "trace.json"
    t = subprocess.run([RANKSCOPE, "timeline", run_dir, "-o", str(trace)], capture_output=True, text=True,
                       timeout=120)
    assert t.returncode == 0 and "on GPU tracks" in t.stderr + t.stdout, t.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    gpu = [e for e in events if e["ph"] == "X" and tracks.get((e["pid"], e["tid"]), "").endswith("on the GPU")]
    host = [e for e in events if e["ph"] == "X" and e not in gpu]
    assert len(gpu) == len(phases) + len(colls), (len(gpu), len(phases), len(colls))
    assert sum(1 for e in gpu if e["cat"] == "collective on the GPU") == len(colls)
    # Each device slice is its line's device time, drawn `dev_queued` after the host's slice
    # of the same work (the trace's times are µs with ns decimals; queued_ms is rounded to µs).
    def name(e):
        return e["name"] if e["kind"] == "phase" else f"{e['op']} #{e['seq']}"
    assert sorted((e["rank"], name(e), e["step"], e["dev" if e["kind"] == "phase" else "dur"] / 1e3)
                  for e in phases + colls) == sorted((e["pid"], e["name"], e["args"]["step"], e["dur"]) for e in gpu)
    host_at = {}
    for e in host:
        host_at.setdefault((e["pid"], e["name"], e["args"].get("step")), []).append(e["ts"])
    for e in gpu:
        shifted = e["ts"] - e["args"]["queued_ms"] * 1e3
        assert any(abs(shifted - ts) <= 1 for ts in host_at[(e["pid"], e["name"], e["args"]["step"])]), e


def test_device_timing_off_leaves_host_time_only(tmp_path, torchrun, fake_cudart):
    p = torchrun(os.path.join(ROOT, "examples", "python", "train_ddp.py"), 2, "--epochs", "1",
                 env=dict(_device_env(fake_cudart), RANKSCOPE_DEVICE_TIMING="0"))
    assert p.returncode == 0, p.stderr[-3000:]
    phases = run_log_events(str(tmp_path / p.stdout.strip().splitlines()[-1]), "phase")
    assert phases and not any("dev" in e for e in phases)


_COLLECTIVES = """
import sys
import torch, torch.distributed as dist
import rankscope, rankscope.torch as rst
rankscope.init()
dist.init_process_group("gloo")
rst.instrument()
rst.stream_ordered_backends.add("gloo")  # the stand-in: its collectives "run on a CUDA stream"
t = torch.ones(256)
for step in range(4):
    dist.all_reduce(t)                           # synchronous: ends on the device
    dist.all_reduce(t, async_op=True).wait()     # async: the current stream after wait()
    fc = torch.ops._c10d_functional              # functional (DTensor, compiled graphs): after wait_tensor()
    fc.wait_tensor(fc.all_reduce(t, "sum", dist.group.WORLD.group_name))
    rankscope.step(step)
dist.destroy_process_group()
rankscope.shutdown()
"""


def test_torch_collectives_on_a_stream_ordered_backend_are_timed_on_the_device(tmp_path, torchrun, fake_cudart):
    script = tmp_path / "collectives.py"
    script.write_text(_COLLECTIVES)
    p = torchrun(script, 2, env=_device_env(fake_cudart))
    assert p.returncode == 0, p.stderr[-3000:]
    runs = glob.glob(str(tmp_path / "rankscope-runs" / "*"))  # the job's run directory, its only one
    assert len(runs) == 1, runs
    run_dir = runs[0]
    colls = [e for e in run_log_events(run_dir, "collective") if e["op"] == "all_reduce"]
    assert len(colls) == 2 * 12, colls
    # Each has an event on the stream at issue and at its end, each behind one 3 ms "kernel":
    # a synchronous one is exactly that; an async or functional one also holds the wait phase's
    # two events when its wait had to block.
    assert all(e.get("timing") == "device" and "enqueue_ns" in e and e["dur"] % KERNEL_NS == 0 for e in colls), \
        colls[:2]
    for rank in (0, 1):
        mine = sorted((e for e in colls if e["rank"] == rank), key=lambda e: e["seq"])
        assert [e["dur"] for e in mine[0::3]] == [KERNEL_NS] * 4, mine
    _check_device_tracks(run_dir, tmp_path, [e for e in run_log_events(run_dir, "phase") if "dev" in e],
                         [e for e in run_log_events(run_dir, "collective") if e.get("timing") == "device"])


_WRAPPED = """
import sys
import torch, torch.distributed as dist, torch.nn as nn
from torch.distributed.fsdp import fully_shard
import rankscope, rankscope.torch as rst
rankscope.init()
dist.init_process_group("gloo")
rst.instrument()
rst.stream_ordered_backends.add("gloo")  # the stand-in: the model's collectives "run on a CUDA stream"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
if sys.argv[1] == "fsdp2":
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
else:
    model = nn.parallel.DistributedDataParallel(model)
    rst.instrument_ddp(model, per_bucket=sys.argv[1] == "ddp_per_bucket")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    model(torch.randn(16, 64)).sum().backward()
    opt.step()
    opt.zero_grad()
    rankscope.step(step)
dist.destroy_process_group()
rankscope.shutdown()
"""


@pytest.mark.parametrize("mode,ops", [("ddp_per_backward", {"all_reduce"}), ("ddp_per_bucket", {"all_reduce"}),
                                      ("fsdp2", {"all_gather", "reduce_scatter"})])
def test_a_wrapped_models_collectives_on_a_stream_ordered_backend_end_on_the_device(tmp_path, torchrun, fake_cudart,
                                                                                    mode, ops):
    """DDP's gradient all-reduce - one span per backward (C++ hooks) or per bucket (a comm
    hook) - and FSDP2's all-gathers and reduce-scatters (torch 2.10+: dist.all_gather_single /
    reduce_scatter_single on its own streams, waited for with work.wait()): each timed on the
    stream, from its first event to its last behind whole 3 ms "kernels"."""
    script = tmp_path / "wrapped.py"
    script.write_text(_WRAPPED)
    p = torchrun(script, 2, mode, env=_device_env(fake_cudart))
    assert p.returncode == 0, p.stderr[-3000:]
    runs = glob.glob(str(tmp_path / "rankscope-runs" / "*"))
    assert len(runs) == 1, runs
    colls = [e for e in run_log_events(runs[0], "collective") if e["op"] in ops]
    assert {e["op"] for e in colls} == ops, colls
    if mode.startswith("ddp"):
        assert len(colls) == 2 * 4, colls  # one per backward (one bucket here), 4 steps, 2 ranks
    assert all(e.get("timing") == "device" and e["dur"] >= KERNEL_NS and e["dur"] % KERNEL_NS == 0 for e in colls), \
        [e for e in colls if e.get("timing") != "device"][:2]

# NCCL's shape (tests/python/stream_ordered_backend.py): a collective is enqueued on the stream
# and the host returns at once; the host waits for its GPU at the next sync. Rank 1 never
# enqueues all-reduce #K (it blocks in its data loading at step 8); rank 0 enqueues #K, returns,
# and blocks at its sync while its GPU is stuck in #K. Default stall settings.
_GPU_HANG = """
import sys, threading
sys.path.insert(0, sys.argv[1])
import stream_ordered_backend as sob
import torch, torch.distributed as dist
import rankscope, rankscope.torch as rst
sob.register()
rankscope.init()
dist.init_process_group(sob.NAME)
rst.instrument()
rst.stream_ordered_backends.add(sob.NAME)  # what it is: NCCL's shape
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(256)
for step in range(1000):
    with rankscope.phase("data"):
        if rank == 1 and step == 8:
            threading.Event().wait()   # never returns: rank 1 never enqueues this step's all-reduce
        t.fill_(1.0)
    dist.all_reduce(t)                 # enqueued on the stream; returns before it ran
    sob.synchronize()                  # the host's sync (loss.item()): waits for its GPU
    assert t[0].item() == world, t[0].item()  # the result is there after the sync, not before
    rankscope.step(step)
"""


def test_a_gpu_stuck_in_a_collective_the_peer_never_enqueued_is_named_as_such(tmp_path, fake_cudart):
    script = tmp_path / "gpu_hang.py"
    script.write_text(_GPU_HANG)
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", RANKSCOPE_DIR=str(run), **_device_env(fake_cudart))
    job = subprocess.Popen([TORCHRUN, "--standalone", "--nproc-per-node", "2", str(script),
                            os.path.join(ROOT, "tests", "python")], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        # Both ranks' watchdogs have reported their stall (the learned 15 s timeout).
        wait_for(lambda: {e["rank"] for e in run_log_events(str(run), "stall")} == {0, 1}, "both ranks' stalls",
                 proc=job)
        hb = json.loads((run / "rank-0.heartbeat.json").read_text())
        status = subprocess.run([RANKSCOPE, "status", str(run)], capture_output=True, text=True, timeout=120)
        tri = subprocess.run([RANKSCOPE, "triage", str(run)], capture_output=True, text=True, timeout=120)
    finally:
        kill_job(job, [str(run)])
    print(tri.stdout, status.stdout)
    stalls = {e["rank"]: e for e in run_log_events(str(run), "stall")}
    # Rank 0's host left all-reduce #K at once; its watchdog found #K unfinished on the device.
    stuck = stalls[0]["in_flight"]
    assert len(stuck) == 1 and stuck[0]["op"] == "all_reduce" and stuck[0]["on_device"], stalls[0]
    assert stuck[0]["step"] == 8 and "on the GPU: the host returned" in stalls[0]["inside"], stalls[0]
    seq = stuck[0]["seq"]
    assert stalls[1]["in_flight"] == [] and stalls[1]["open_phases"][-1]["name"] == "data", stalls[1]
    # The heartbeat: per stream, the oldest collective its GPU has not finished.
    assert [(d["op"], d["seq"], d["step"]) for d in hb["device_pending"]] == [("all_reduce", seq, 8)], hb
    assert f"waits in all_reduce seq {seq} on 'world'" in status.stdout and "on the GPU" in status.stdout, \
        status.stdout
    # The culprit is the rank that never enqueued it, exactly as without a GPU; the waiting
    # rank's GPU, not its host, is what waits in it.
    assert f"HANG: rank 1 did not reach all_reduce seq {seq} on 'world' while rank 0 waits in it: it is blocked " \
           f"in data at step 8" in tri.stdout, tri.stdout
    assert f"rank 0's GPU is stuck in all_reduce seq {seq} on 'world' (enqueued in step 8): its host returned " \
           f"from the call and is blocked at a later sync" in tri.stdout, tri.stdout
    # Before the hang, each all-reduce ended on the device: its line waited for the kernel.
    colls = [e for e in run_log_events(str(run), "collective") if e["op"] == "all_reduce" and e["seq"] < seq]
    assert len(colls) == 2 * 8 and all(e.get("timing") == "device" and e["dur"] == KERNEL_NS for e in colls), \
        colls[:2]
