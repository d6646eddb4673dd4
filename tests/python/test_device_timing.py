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

from conftest import RANKSCOPE, ROOT, run_log_events

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
    assert len(colls) == 2 * 8, colls
    # Each has an event on the stream at issue and at its end, each behind one 3 ms "kernel":
    # a synchronous one is exactly that; an async one also holds the wait phase's two events
    # when wait() had to block.
    assert all(e.get("timing") == "device" and "enqueue_ns" in e and e["dur"] % KERNEL_NS == 0 for e in colls), \
        colls[:2]
    for rank in (0, 1):
        mine = sorted((e for e in colls if e["rank"] == rank), key=lambda e: e["seq"])
        assert [e["dur"] for e in mine[0::2]] == [KERNEL_NS] * 4, mine
