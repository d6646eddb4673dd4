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


COORDINATED = '''
import os, time
import torch, torch.distributed as dist
rank = int(os.environ["RANK"])
# Only rank 1's watchdog is quick: the others would see the stall after 60 s on their own.
os.environ["RANKSCOPE_STALL_TIMEOUT"] = "2" if rank == 1 else "60"
if rank >= 2:  # as on another node with a node-local run directory: only the store reaches them
    os.environ["RANKSCOPE_DIR"] += f"-node{rank}"
import rankscope
rankscope.init()
dist.init_process_group("gloo")
x = torch.ones(1000)
for step in range(1000):
    with rankscope.phase("forward"):
        if rank == 1 and step == 5:
            while True:
                time.sleep(1)          # rank 1 stops; ranks 0, 2, 3 wait in the all-reduce
    with rankscope.phase("sync"):
        dist.all_reduce(x)
    rankscope.step(step)
'''


def test_the_first_rank_to_see_a_stall_has_every_rank_dump_within_5_s(tmp_path):
    """4 ranks under torchrun. Rank 1 stops at step 5 and is the only one with a short stall
    timeout: its request makes ranks 0, 2 and 3 dump (flight recorder and stacks) within 5 s -
    rank 0 shares its run directory, ranks 2 and 3 have their own and hear it through the job's
    c10d store."""
    import signal
    import subprocess
    import time
    from conftest import TORCHRUN
    script = tmp_path / "coordinated.py"
    script.write_text(COORDINATED)
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", RANKSCOPE_DIR=str(run))
    job = subprocess.Popen([TORCHRUN, "--standalone", "--nproc-per-node", "4", str(script)], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        dirs = {0: run, 1: run, 2: tmp_path / "run-node2", 3: tmp_path / "run-node3"}
        while time.time() < deadline and not all((dirs[r] / f"rank-{r}.flight.json").exists() for r in range(4)):
            time.sleep(0.25)
        time.sleep(0.5)  # the last stacks lines written
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    request = json.loads((run / "dump-request.json").read_text())
    assert request["rank"] == 1 and request["reason"] == "stall", request
    dumps = {r: json.loads((dirs[r] / f"rank-{r}.flight.json").read_text()) for r in range(4)}
    assert dumps[1]["reason"] == "stall"
    for r in (0, 2, 3):
        assert dumps[r]["reason"] == "requested by rank 1 (stall)", dumps[r]["reason"]
        dumped_at = dumps[r]["clock"]["wall_ns"]
        print(f"rank {r} dumped {(dumped_at - request['t']) / 1e9:.2f} s after rank 1 asked")
        assert 0 <= dumped_at - request["t"] <= 5e9, (r, (dumped_at - request["t"]) / 1e9)
    stacks = {l["rank"]: l for l in stacks_lines(tmp_path)}
    assert sorted(stacks) == [0, 1, 2, 3]
    assert "in <module>" in stacks[0]["python"] and "all_reduce" in stacks[0]["python"]


INIT_HANG = '''
import os, time
import torch, torch.distributed as dist
import rankscope
rankscope.init()
if int(os.environ["RANK"]) == 1:
    while True:
        time.sleep(1)        # never reaches init_process_group: rank 0 waits for it there
dist.init_process_group("gloo")
'''


def test_a_rank_that_never_joins_init_process_group_is_named_before_the_first_step(tmp_path):
    """Joining the job is an operation in flight like any other: rank 0 waits in
    init_process_group (the wrapped torch.distributed function), rank 1 never calls it. With the
    learned timeout (no fixed one): inside init_process_group it is 4 x the floor - 60 s by
    default, here 4 s with the floor scaled down to 1 s - not the warm-up's 300 s."""
    import signal
    import subprocess
    import sys
    import time
    from conftest import TORCHRUN
    script = tmp_path / "init_hang.py"
    script.write_text(INIT_HANG)
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", RANKSCOPE_DIR=str(run), RANKSCOPE_STALL_FLOOR="1")
    env.pop("RANKSCOPE_STALL_TIMEOUT", None)
    job = subprocess.Popen([TORCHRUN, "--standalone", "--nproc-per-node", "2", str(script)], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        # Rank 0 stalls after 4 s; rank 1 (outside any phase) would wait for the warm-up:
        # its stack comes with rank 0's request to dump.
        while time.time() < deadline and len({l["rank"] for l in stacks_lines(run)}) < 2:
            time.sleep(0.25)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    cli = os.path.join(os.path.dirname(sys.executable), "rankscope")
    tri = subprocess.run([cli, "triage", str(run)], capture_output=True, text=True).stdout
    assert "rank 1 did not reach init_process_group while rank 0 waits in it" in tri, tri  # a hang, or a dead rank once killed
    assert 'rank 1: File "' in tri and "init_hang.py\", line 8 in <module>" in tri, tri
