"""How ranks end, told from evidence: an uncaught Python exception is an `exit` line naming the
exception (not "finished"), and triage names that rank as the culprit; the other rank's end
(gloo's error after its peer vanished, or torchrun's SIGTERM) is a consequence, not a second
culprit. A real run ends either way (a race between gloo and torchrun); a run log written here
tests each ending every time."""
import json
import os
import re
import subprocess

import pytest

from conftest import RANKSCOPE, TORCHRUN, kill_job, wait_for
from synthetic_run import MS, S, RankLog, write_json, write_run_json

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
            if sys.argv[1:] == ["reset"]:  # how a DataLoader worker's death can reach the main thread
                raise ConnectionResetError(104, "Connection reset by peer")
            if sys.argv[1:] == ["exit"]:  # caught and printed, then a failure of the program's own choosing
                try:
                    raise RuntimeError("bad batch 5")
                except RuntimeError as e:
                    print(f"giving up: {e}", file=sys.stderr)
                    sys.exit(3)
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


def _rank_0_followed(findings):
    """Rank 0 ended after rank 1 and because of it: gloo's error when rank 1's connection closed
    (an exit line: peer_lost, no rank of its own), or torchrun's SIGTERM when that came first
    (its flight dump says so: a dead_rank "stopped by SIGTERM", never "died" - it is named so only
    once its heartbeat is older than 3 intervals when triage reads it). Which of the two comes
    first is a race between gloo and torchrun: either is fine."""
    for f in findings[1:]:
        assert f["ranks"] in ([1], []) or (f["ranks"] == [0] and f["kind"] == "dead_rank" and
                                            f["summary"].startswith("rank stopped by SIGTERM: ")), findings


def _cli(*args):
    return subprocess.run([os.path.join(os.path.dirname(os.sys.executable), "rankscope"), *args],
                          capture_output=True, text=True, timeout=120)


def _triage(run_dir):
    """`rankscope triage --json` of the run, which must report findings (exit 1): (the report,
    its rank rows by rank)."""
    t = _cli("triage", "--json", run_dir)
    assert t.returncode == 1, t.stdout + t.stderr
    report = json.loads(t.stdout)
    return report, {r["rank"]: r for r in report["ranks"]}


def _status(run_dir):
    """`rankscope status` of a run that failed (exit 1): its output."""
    st = _cli("status", run_dir)
    assert st.returncode == 1, st.stdout + st.stderr
    return st.stdout


@pytest.mark.parametrize("how,exception,msg", [
    ("", "RuntimeError", "RuntimeError: bad batch 5"),
    # Worded as a lost peer, yet no peer was gone: once in a few runs a DataLoader worker's death
    # reaches the main thread so. The order of the ranks' ends decides, not the words.
    ("reset", "ConnectionResetError", "ConnectionResetError: [Errno 104] Connection reset by peer"),
], ids=["RuntimeError", "ConnectionResetError"])
def test_an_uncaught_exception_is_the_culprit_and_not_finished(tmp_path, torchrun, how, exception, msg):
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    p = torchrun(script, 2, *([how] if how else []), env={"RANKSCOPE_DIR": str(tmp_path / "run")})
    assert p.returncode != 0
    run_dir = str(tmp_path / "run")
    ex = _exit_lines(run_dir, 1)
    assert len(ex) == 1, p.stderr[-3000:]
    assert ex[0]["cause"] == "exception" and ex[0]["exception"] == exception
    assert ex[0]["msg"] == msg
    assert "raise " + exception in ex[0]["traceback"]
    beat = json.load(open(os.path.join(run_dir, "rank-1.heartbeat.json")))
    assert beat["state"] == "failed" and beat["exit_cause"] == "exception"
    report, rows = _triage(run_dir)
    status = _status(run_dir)
    first = report["findings"][0]
    assert first["kind"] == "exception" and first["ranks"] == [1], report
    assert msg in first["summary"]
    # Rank 0 is never a culprit of its own: gloo's error or torchrun's SIGTERM followed rank 1.
    _rank_0_followed(report["findings"])
    assert rows[1]["state"] == "exception"
    assert "rank 1 FAILED: it exited after an uncaught exception" in status, status


def test_a_caught_error_then_sys_exit_3_is_the_culprit_and_not_finished(tmp_path, torchrun):
    """No exception reaches sys.excepthook: rank 1 catches its error and calls sys.exit(3).
    rankscope's exit handler learns the status from exit() (Python calls it after finalizing):
    an `exit` line of cause exit_status, a heartbeat that says failed, and triage names rank 1."""
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    p = torchrun(script, 2, "exit", env={"RANKSCOPE_DIR": str(tmp_path / "run")})
    assert p.returncode != 0
    assert "giving up: bad batch 5" in p.stderr
    run_dir = str(tmp_path / "run")
    ex = _exit_lines(run_dir, 1)
    assert len(ex) == 1, p.stderr[-3000:]
    assert ex[0]["cause"] == "exit_status" and ex[0]["exit_status"] == 3, ex
    assert ex[0]["msg"] == "exited with status 3" and ex[0]["step"] == 5, ex
    beat = json.load(open(os.path.join(run_dir, "rank-1.heartbeat.json")))
    assert beat["state"] == "failed" and beat["exit_cause"] == "exit_status" and beat["exit_status"] == 3, beat
    report, rows = _triage(run_dir)
    status = _status(run_dir)
    first = report["findings"][0]
    assert first["kind"] == "exception" and first["ranks"] == [1], report
    assert first["summary"].startswith("rank 1 exited with status 3 at step 5, no uncaught exception"), first
    _rank_0_followed(report["findings"])
    assert rows[1]["state"] == "exit 3"
    assert "rank 1 FAILED: it exited with status 3 at step 5" in status, status


TIMES_OUT = r"""
import datetime, time, torch, torch.distributed as dist
import rankscope, rankscope.torch
rankscope.init()
rankscope.torch.instrument()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
rank = dist.get_rank()
x = torch.ones(4)
for step in range(1, 50):
    with rankscope.phase("forward"):
        if rank == 1 and step == 5:
            time.sleep(120)  # stuck in its forward: rank 0's all-reduce gives up after 5 s
    dist.all_reduce(x)
    rankscope.step(step, loss=1.0)
"""


def test_a_collective_timeout_names_the_rank_that_never_joined_not_the_one_that_timed_out(tmp_path, torchrun):
    """gloo's timeout (5 s here) ends rank 0 with "Timed out waiting 5000ms for recv ...": an uncaught
    exception, but a consequence. triage names rank 1, which never reached that all-reduce."""
    script = tmp_path / "times_out.py"
    script.write_text(TIMES_OUT)
    p = torchrun(script, 2, env={"RANKSCOPE_DIR": str(tmp_path / "run")})
    assert p.returncode != 0
    run_dir = str(tmp_path / "run")
    ex = _exit_lines(run_dir, 0)
    assert len(ex) == 1 and "Timed out waiting" in ex[0]["msg"], (ex, p.stderr[-3000:])
    report, _ = _triage(run_dir)
    kinds = [f["kind"] for f in report["findings"]]
    assert "exception" not in kinds, report["findings"]  # rank 0 is not a culprit of its own
    f = next(f for f in report["findings"] if f["kind"] == "collective_timeout")
    assert f["ranks"] == [1], report["findings"]
    assert f["summary"].startswith("rank 0 gave up waiting in a collective at step 5 for rank 1, which never joined it"), f
    assert report["findings"][0]["ranks"] == [1], report["findings"]


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


def _ended_run(run_dir, rank_0_ending):
    """Rank 1 raises in forward at step 5 while rank 0 waits for it in the all-reduce; rank 0
    then ends by gloo's error ("gloo") or by torchrun's SIGTERM ("sigterm"), as a real run of
    RAISES does (whichever comes first), written here so that each ending is tested every time."""
    write_run_json(run_dir, 2)
    logs = [RankLog(run_dir, r, 2) for r in range(2)]
    at = 500 * MS
    for log in logs:
        log.run_start(0)
        log.step_begin(at, 1)
    for step in range(1, 5):
        for log in logs:
            log.phase(at, step, "forward", "forward", MS)
            log.step_end(at + 2 * MS, step, dur=2 * MS, loss=1.0)
        at += 2 * MS
    logs[1].exit(at + MS, 5, "RuntimeError", "bad batch 5")
    logs[1].run_end(at + 2 * MS, 5)
    logs[1].heartbeat(5, state="failed", exit_cause="exception")
    if rank_0_ending == "gloo":
        logs[0].exit(at + S, 5, "RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection "
                     "closed by peer [127.0.0.1]:39810. This is typically caused by a remote worker crashing.")
        logs[0].heartbeat(5, state="failed", exit_cause="exception")
    else:  # what its SIGTERM handler writes: the stacks, then the flight dump; the heartbeat still says running
        logs[0].line("stacks", at + 600 * MS, 5, reason="signal SIGTERM", threads=6, answered=6, capture_us=900.0,
                     native='thread 5000 "python" (main)\n  #0 poll+0x4 (libc.so.6)', python_complete=True,
                     python='Current thread 0x1 (most recent call first):\n  File "raises.py", line 12 in <module>\n')
        logs[0].heartbeat(5, state="running")
        write_json(os.path.join(run_dir, "rank-0.flight.json"),
                   {"schema": 1, "kind": "flight_recorder", "reason": "signal SIGTERM", "rank": 0, "world_size": 2,
                    "local_rank": 0, "pid": logs[0].pid, "run_id": "synthetic", "host": "node-0", "step": 5,
                    "collectives": []})
    for log in logs:
        log.close()
    return str(run_dir)


@pytest.mark.parametrize("rank_0_ending", ["gloo", "sigterm"])
def test_whichever_way_the_peer_ends_the_rank_that_raised_is_the_culprit(tmp_path, rank_0_ending):
    run_dir = _ended_run(tmp_path / "run", rank_0_ending)
    t = subprocess.run([RANKSCOPE, "triage", "--json", run_dir], capture_output=True, text=True, timeout=120)
    assert t.returncode == 1, t.stdout + t.stderr
    findings = json.loads(t.stdout)["findings"]
    assert findings[0]["kind"] == "exception" and findings[0]["ranks"] == [1], findings
    assert findings[0]["summary"].startswith("rank 1 died of an uncaught exception at step 5: RuntimeError: bad batch 5")
    _rank_0_followed(findings)
    if rank_0_ending == "gloo":
        assert [(f["kind"], f["ranks"]) for f in findings] == [("exception", [1]), ("peer_lost", [])], findings
        assert findings[0]["summary"].endswith("(rank 0 failed after it: a consequence)"), findings[0]
    else:
        assert [(f["kind"], f["ranks"]) for f in findings] == [("exception", [1]), ("dead_rank", [0])], findings
        assert any("flight dump says signal SIGTERM" in e for e in findings[1]["evidence"]), findings[1]


KILLED_WHILE_HUNG = r"""
import threading, torch, torch.distributed as dist
import rankscope, rankscope.torch as rst
rankscope.init()
dist.init_process_group("gloo")
rst.instrument()
rank = dist.get_rank()
t = torch.ones(256)
for step in range(1000):
    with rankscope.phase("data"):
        if rank == 1 and step == 6:
            threading.Event().wait()   # rank 1 blocks in its data loading; rank 0 waits in the all-reduce
    with rankscope.phase("forward"):
        t.fill_(1.0)
    dist.all_reduce(t)
    rankscope.step(step)
"""


def test_a_job_killed_while_hung_is_read_from_its_last_picture_at_once(tmp_path):
    """Both ranks SIGKILLed (a scheduler's hard limit, kill -9) well before the stall timeout
    (default settings: 15 s) while rank 1 blocks in its data loading and rank 0 waits for it in
    an all-reduce. Read the moment they are gone: each rank is dead - its process is gone, on
    this host, however fresh its heartbeat - never "still running", and triage names the
    picture the ranks left: who waited in which collective for whom."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED_WHILE_HUNG)
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", RANKSCOPE_DIR=str(run))
    job = subprocess.Popen([TORCHRUN, "--standalone", "--nproc-per-node", "2", str(script)], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def beat(rank):
        try:
            with open(run / f"rank-{rank}.heartbeat.json") as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    try:  # the hang as the heartbeats show it, then the kill: no stall has been reported
        wait_for(lambda: beat(0).get("in_flight") and any(p["name"] == "data" for p in beat(1).get("open_phases", [])),
                 "rank 0 in the all-reduce and rank 1 in data", proc=job)
    finally:
        kill_job(job, [str(run)])
    assert not any(beat(r).get("stalls") for r in (0, 1))
    status = subprocess.run([RANKSCOPE, "status", "--json", str(run)], capture_output=True, text=True, timeout=120)
    ranks = {r["rank"]: r for r in json.loads(status.stdout)["ranks"]}
    assert not ranks[0]["alive"] and not ranks[1]["alive"], status.stdout
    tri = subprocess.run([RANKSCOPE, "triage", "--json", str(run)], capture_output=True, text=True, timeout=120)
    report = json.loads(tri.stdout)
    assert "still running" not in report["headline"], report["headline"]
    assert {r["state"] for r in report["ranks"]} == {"dead"}, report["ranks"]
    f = report["findings"][0]
    assert f["kind"] == "stopped" and f["ranks"] == [1], f
    assert f["summary"].startswith("the job was killed at step 6 without a trace"), f
    assert re.search(r"while rank 0 waited in all_reduce seq \d+ on 'world' \([0-9.]+ s\) for rank 1, in data "
                     r"\([0-9.]+ s\) outside any collective$", f["summary"]), f
    assert any("its process is gone" in e for e in f["evidence"]), f


# An elastic job's attempt: RDZV_DIR holds its rendezvous files.
ELASTIC_ATTEMPT = r"""
import os, torch, torch.distributed as dist
import rankscope
rankscope.init()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
# A store of its own per attempt: torchrun's store keeps the failed attempt's gloo addresses,
# and the new attempt's ranks then often connect to the dead ones (torch 2.15, with or without
# rankscope: 3 of 4 restarts failed so).
dist.init_process_group("gloo", init_method=f"file://{os.environ['RDZV_DIR']}/attempt-{attempt}",
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
rank = dist.get_rank()
"""

ELASTIC = ELASTIC_ATTEMPT + r"""
x = torch.ones(4)
for step in range(10):
    with rankscope.phase("forward"):
        if rank == 1 and attempt == 0 and step == 5:
            raise RuntimeError("bad batch 5")
    dist.all_reduce(x)
    rankscope.step(step)
dist.destroy_process_group()
rankscope.shutdown()
"""


STALE_RESUME = ELASTIC_ATTEMPT + r"""
def meta(step):
    return dict(id=f"ckpt-{step}", step=step, consumed_samples=step * 8, world_size=2, global_batch=8,
                optimizer_step=step)
start, steps = 0, 12
if attempt == 1:  # the newest checkpoint is step 8; rank 1's resume path still names step 4's
    start, steps = (4 if rank == 1 else 8), 4
    rankscope.check_resume(**meta(start))
x = torch.ones(4)
for step in range(start, start + steps):
    with rankscope.phase("forward"):
        if rank == 1 and attempt == 0 and step == 10:
            raise RuntimeError("bad batch 10")
    dist.all_reduce(x)
    rankscope.step(step)
    if step + 1 in (4, 8):
        with rankscope.checkpoint("save", f"ckpt-{step + 1}"):
            pass
        rankscope.record_checkpoint_save(**meta(step + 1))
dist.destroy_process_group()
rankscope.shutdown()
"""


def _elastic_findings(tmp_path, torchrun, script_text):
    """The script on 2 ranks under torchrun --max-restarts=1, then triage's findings."""
    script = tmp_path / "elastic.py"
    script.write_text(script_text)
    (tmp_path / "rdzv").mkdir()
    p = torchrun(script, 2, extra=["--max-restarts", "1"], timeout=300,
                 env={"RANKSCOPE_DIR": str(tmp_path / "run"), "RDZV_DIR": str(tmp_path / "rdzv")})
    assert p.returncode == 0, p.stderr[-3000:]
    tri = subprocess.run([RANKSCOPE, "triage", "--json", str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=120)
    return json.loads(tri.stdout)["findings"]


def test_a_rank_that_resumed_older_than_every_rank_saved_is_named(tmp_path, torchrun):
    """torchrun --max-restarts=1: both ranks save steps 4 and 8, rank 1 raises at step 10; in the
    second attempt rank 0 resumes from 8 and rank 1 from 4. The resume points alone hold no
    majority (two ranks); the save history says rank 1 resumed wrong."""
    findings = _elastic_findings(tmp_path, torchrun, STALE_RESUME)
    assert sorted(f["kind"] for f in findings) == ["desync", "restart"], findings
    f = next(f for f in findings if f["kind"] == "desync")
    assert f["ranks"] == [1], f
    assert f["summary"] == ("resume: rank 1 resumed from an older checkpoint than the one every rank had saved, step 8 "
                            "('ckpt-8'): rank 1 from step 4 ('ckpt-4'); rank 0 from step 8"), f
    assert f["evidence"][0] == ("the save history: steps 4,8 saved by every rank that saved (ranks 0,1) before the "
                                "resume"), f
    assert any(e.startswith("resume: ranks 0,1 disagree on id") for e in f["evidence"]), f
    restart = next(f for f in findings if f["kind"] == "restart")
    assert restart["summary"].endswith("ranks 0,1 restarted and resumed at different steps: rank 1 at 4, rank 0 at 8"), \
        restart


def test_an_elastic_restart_is_explained_by_the_exception_that_caused_it(tmp_path, torchrun):
    """torchrun --max-restarts=1: rank 1 raises in the first attempt, torchrun restarts both
    ranks, the second attempt finishes. The restart finding names rank 1 and its exception
    (rank 0's own end - a lost peer, or torchrun's stop - is its evidence), and where the new
    attempt resumed."""
    findings = _elastic_findings(tmp_path, torchrun, ELASTIC)
    assert [f["kind"] for f in findings] == ["restart"], findings
    f = findings[0]
    assert f["ranks"] == [1] and f["step"] == 5, f
    assert f["summary"] == ("restart 1: rank 1 raised RuntimeError: bad batch 5 at step 5; ranks 0,1 restarted and "
                            "resumed at step 0"), f
    assert f["evidence"][-1].startswith("then rank 0 "), f
