"""How ranks end, told from evidence: an uncaught Python exception is an `exit` line naming the
exception (not "finished"), and triage names that rank as the culprit; the other rank's end
(gloo's error after its peer vanished, or torchrun's SIGTERM) is a consequence, not a second
culprit."""
import json
import os
import subprocess

from conftest import ROOT  # noqa: F401

RAISES = r"""
import os, sys, time, torch, torch.distributed as dist
import rankscope
rankscope.init()
dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
for step in range(1, 50):
    with rankscope.phase("forward"):
        if rank == 1 and step == 5:
            raise RuntimeError("bad batch 5")
    dist.all_reduce(x)
    rankscope.step(step, loss=1.0)
"""


def _exit_lines(run_dir, rank):
    out = []
    with open(os.path.join(run_dir, f"rank-{rank}.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            if d["kind"] == "exit":
                out.append(d)
    return out


def test_an_uncaught_exception_is_the_culprit_and_not_finished(tmp_path, torchrun):
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    p = torchrun(script, 2, env={"RANKSCOPE_DIR": str(tmp_path / "run")})
    assert p.returncode != 0
    run_dir = str(tmp_path / "run")
    ex = _exit_lines(run_dir, 1)
    assert len(ex) == 1, p.stderr[-3000:]
    assert ex[0]["cause"] == "exception" and ex[0]["exception"] == "RuntimeError"
    assert ex[0]["msg"] == "RuntimeError: bad batch 5"
    assert 'raise RuntimeError("bad batch 5")' in ex[0]["traceback"]
    beat = json.load(open(os.path.join(run_dir, "rank-1.heartbeat.json")))
    assert beat["state"] == "failed" and beat["exit_cause"] == "exception"
    cli = [os.path.join(os.path.dirname(os.sys.executable), "rankscope")]
    t = subprocess.run(cli + ["triage", "--json", run_dir], capture_output=True, text=True)
    assert t.returncode == 1, t.stdout + t.stderr
    report = json.loads(t.stdout)
    first = report["findings"][0]
    assert first["kind"] == "exception" and first["ranks"] == [1], t.stdout
    assert "RuntimeError: bad batch 5" in first["summary"]
    # Rank 0 is never a culprit of its own: gloo's error or torchrun's SIGTERM followed rank 1.
    assert all(f["ranks"] in ([1], []) for f in report["findings"]), t.stdout
    rows = {r["rank"]: r for r in report["ranks"]}
    assert rows[1]["state"] == "exception"
    st = subprocess.run(cli + ["status", run_dir], capture_output=True, text=True)
    assert st.returncode == 1 and "rank 1 FAILED: it exited after an uncaught exception" in st.stdout, st.stdout


def test_an_uncaught_exception_in_a_thread_is_recorded_and_the_process_goes_on(run_py, tmp_path):
    """threading.excepthook: a worker thread that dies of an exception is an `exit` line of cause
    thread_exception (type, message, traceback), Python still prints it, and the process lives on."""
    p = run_py("""
        import os, threading
        import rankscope
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        def prefetch():
            raise ValueError("shard 7 is missing")
        t = threading.Thread(target=prefetch, name="prefetcher")
        t.start()
        t.join()
        rankscope.begin_step(0)
        rankscope.step(0)
        rankscope.shutdown()
        print("still here")
    """)
    assert "still here" in p.stdout
    assert "ValueError: shard 7 is missing" in p.stderr  # the previous hook still ran
    lines = [json.loads(l) for l in open(tmp_path / "run" / "rank-0.jsonl")]
    exits = [l for l in lines if l["kind"] == "exit"]
    assert len(exits) == 1, exits
    e = exits[0]
    assert e["cause"] == "thread_exception" and e["exception"] == "ValueError", e
    assert e["msg"] == "ValueError: shard 7 is missing" and "in prefetch" in e["traceback"], e
    assert any(l["kind"] == "step_end" for l in lines)  # recording went on after it
