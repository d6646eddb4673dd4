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
    assert s["python_complete"] is True                          # faulthandler, chained, said it had finished
    assert s["capture_us"] < 100_000                              # recorded; the budget is 100 ms


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
        # torchrun starts its workers in sessions of their own: killing its group leaves them
        # running (blocked in the all-reduce), so each rank is killed by its heartbeat's pid.
        for d in set(dirs.values()):
            for hb in d.glob("rank-*.heartbeat.json"):
                try:
                    os.kill(json.loads(hb.read_text())["pid"], signal.SIGKILL)
                except (OSError, ValueError, KeyError):
                    pass
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
