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
