"""Stacks on a stall: the Python frames of every thread (CPython's faulthandler, without the
GIL) and the native ones, in the run log's `stacks` line."""
import json
import os


def stacks_lines(run_dir):
    out = []
    for root, _, files in os.walk(run_dir):
        for f in files:
            if f.endswith(".jsonl"):
                with open(os.path.join(root, f)) as fh:
                    out += [json.loads(l) for l in fh if '"kind":"stacks"' in l]
    return out


def test_a_stall_in_getitem_shows_the_frame_while_another_thread_holds_the_gil(run_py, tmp_path):
    run_py("""
        import ctypes, os, threading, time
        import rankscope
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])

        def hold_the_gil():
            ctypes.PyDLL(None).sleep(4)   # a C call through PyDLL keeps the GIL for its whole length

        class Dataset:
            def __getitem__(self, i):
                if i == 3:
                    threading.Thread(target=hold_the_gil, name="gil-holder").start()
                    time.sleep(6)
                return i

        ds = Dataset()
        for i in range(5):
            with rankscope.phase("loader_wait"):
                ds[i]
            rankscope.step(i)
        rankscope.shutdown()
    """, env={"RANKSCOPE_STALL_TIMEOUT": "2"})
    lines = stacks_lines(tmp_path / "run")
    stall = [l for l in lines if l["reason"] == "stall"]
    assert stall, lines
    s = stall[0]
    assert "in __getitem__" in s["python"], s["python"]          # the sleeping rank's own frame
    assert "in hold_the_gil" in s["python"], s["python"]         # the thread holding the GIL, too
    assert "(main)" in s["native"] and s["answered"] >= 2
    assert s["capture_us"] < 100_000                              # recorded; the budget is 100 ms


def test_a_torchrun_job_hung_in_its_loader_names_the_frame(tmp_path):
    """2 ranks under torchrun; rank 1 blocks in its Dataset at step 5 while rank 0 waits in DDP's
    all-reduce. `rankscope stacks` groups the main threads and triage says where each one was."""
    import signal
    import subprocess
    import sys
    import time
    from conftest import ROOT, TORCHRUN
    env = dict(os.environ, OMP_NUM_THREADS="1", RANKSCOPE_STALL_TIMEOUT="2", RANKSCOPE_DIR=str(tmp_path / "run"))
    job = subprocess.Popen([TORCHRUN, "--standalone", "--nproc-per-node", "2",
                            os.path.join(ROOT, "examples/python/train_ddp.py"), "--epochs", "100",
                            "--fault-rank", "1", "--fault-step", "5", "--hang", "loader"],
                           cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len({l["rank"] for l in stacks_lines(tmp_path / "run")}) < 2:
            time.sleep(0.5)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    cli = os.path.join(os.path.dirname(sys.executable), "rankscope")
    out = subprocess.run([cli, "stacks", str(tmp_path / "run")], capture_output=True, text=True).stdout
    assert "main thread (Python), whole stack - rank 1" in out, out
    assert "in hang_forever" in out and "in timed_loader" in out, out          # rank 1: inside the loader
    assert "c10d::Reducer" in out, out                                          # rank 0: DDP's all-reduce, native
    tri = subprocess.run([cli, "triage", str(tmp_path / "run")], capture_output=True, text=True).stdout
    assert "where the main threads were at the last stack capture: rank 1: File" in tri, tri
    assert "in hang_forever" in tri, tri
