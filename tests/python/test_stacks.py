"""Stacks on a stall: the Python frames of every thread (CPython's faulthandler, without the
GIL) and the native ones, in the run log's `stacks` line."""
import json
import os
import subprocess
import sys
import textwrap

from conftest import TORCHRUN, kill_job, wait_for


def stacks_lines(run_dir):
    """The `stacks` lines of every run log under run_dir, as far as they are written (a log
    being appended to may end in half a line)."""
    out = []
    for root, _, files in os.walk(run_dir):
        for f in files:
            if f.endswith(".jsonl"):
                with open(os.path.join(root, f)) as fh:
                    whole = fh.read().split("\n")[:-1]
                out += [json.loads(l) for l in whole if '"kind":"stacks"' in l]
    return out


GIL_HELD = """
    import ctypes, os, threading
    import rankscope
    rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])

    def hold_the_gil():
        # A C call through PyDLL keeps the GIL for its whole length: this read() returns when
        # the test writes to our stdin, once the stall's stacks line is in the run log.
        ctypes.PyDLL(None).read(0, ctypes.create_string_buffer(1), 1)

    class Dataset:
        def __getitem__(self, i):
            if i == 3:
                holder = threading.Thread(target=hold_the_gil, name="gil-holder")
                holder.start()
                holder.join()
            return i

    ds = Dataset()
    for i in range(5):
        with rankscope.phase("loader_wait"):
            ds[i]
        rankscope.step(i)
    rankscope.shutdown()
"""


def test_a_stall_in_getitem_shows_the_frame_while_another_thread_holds_the_gil(tmp_path):
    """The process makes no progress until the test has seen its stall's stacks: whenever the
    watchdog gets to it, the main thread is in __getitem__ and the other thread holds the GIL."""
    env = dict(os.environ, RUN_DIR=str(tmp_path / "run"), RANKSCOPE_STALL_TIMEOUT="2")
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(GIL_HELD)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        # (A stall before it - init to the first step on a frozen host - would be a line of its own.)
        lines = wait_for(lambda: [l for l in stacks_lines(tmp_path / "run")
                                  if l["reason"] == "stall" and "in __getitem__" in l["python"]],
                         "stall's stacks line with __getitem__'s frame", proc=p)
    finally:
        out, err = p.communicate("x", timeout=300)  # the GIL holder's read() returns; the loop goes on
    assert p.returncode == 0, err[-3000:]
    s = lines[0]
    assert "in __getitem__" in s["python"], s["python"]          # the waiting rank's own frame
    assert "in hold_the_gil" in s["python"], s["python"]         # the thread holding the GIL, too
    assert "(main)" in s["native"] and s["answered"] >= 2, s
    assert s["python_complete"] is True, s                       # faulthandler, chained, said it had finished
    assert s["capture_us"] > 0, s                                # what it cost: benchmarks/stack_capture.py


COORDINATED = '''
import os, time
import torch, torch.distributed as dist
rank = int(os.environ["RANK"])
# Only rank 1's watchdog is quick: the others would see the stall only after 10 minutes on their own.
os.environ["RANKSCOPE_STALL_TIMEOUT"] = "2" if rank == 1 else "600"
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


def test_the_first_rank_to_see_a_stall_has_every_rank_dump(tmp_path):
    """4 ranks under torchrun. Rank 1 stops at step 5 and is the only one with a short stall
    timeout: its request makes ranks 0, 2 and 3 dump (flight recorder and stacks) - rank 0
    shares its run directory, ranks 2 and 3 have their own and hear it through the job's c10d
    store. (How soon: benchmarks/hang_latency.sh; the dumps' reason says whose request it was.)"""
    script = tmp_path / "coordinated.py"
    script.write_text(COORDINATED)
    run = tmp_path / "run"
    dirs = {0: run, 1: run, 2: tmp_path / "run-node2", 3: tmp_path / "run-node3"}
    env = dict(os.environ, OMP_NUM_THREADS="1", RANKSCOPE_DIR=str(run))
    job = subprocess.Popen([TORCHRUN, "--standalone", "--nproc-per-node", "4", str(script)], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # Every rank's flight dump, and its stacks line in its run log (written before the dump,
        # reaching the log at the next drain).
        wait_for(lambda: all((dirs[r] / f"rank-{r}.flight.json").exists() for r in range(4))
                 and sorted({l["rank"] for l in stacks_lines(tmp_path)}) == [0, 1, 2, 3],
                 "every rank's flight dump and stacks line", proc=job)
    finally:
        kill_job(job, set(dirs.values()))
    request = json.loads((run / "dump-request.json").read_text())
    assert request["rank"] == 1 and request["reason"] == "stall", request
    dumps = {r: json.loads((dirs[r] / f"rank-{r}.flight.json").read_text()) for r in range(4)}
    assert dumps[1]["reason"] == "stall"
    for r in (0, 2, 3):
        assert dumps[r]["reason"] == "requested by rank 1 (stall)", dumps[r]["reason"]
        print(f"rank {r} dumped {(dumps[r]['clock']['wall_ns'] - request['t']) / 1e9:.2f} s after rank 1 asked")
    stacks = {l["rank"]: l for l in stacks_lines(tmp_path)}
    assert sorted(stacks) == [0, 1, 2, 3]
    assert "in <module>" in stacks[0]["python"] and "all_reduce" in stacks[0]["python"]
