"""`rankscope goodput`: where the wall time went, category by category.

The accounting is checked exactly on a run log written here (two sessions of one rank: start-up,
a 0.5 s "compilation" in the first step, loader wait, communication, compute, a checkpoint, an
evaluation pass, a 3 s hang the watchdog reports, an elastic restart that repeats 10 steps),
where every duration is known to the nanosecond. A real job with the same shape then shows
what holds at any machine speed: the categories sum to the wall time, and each category holds
at least the time the job slept in it."""
import json
import os
import subprocess
import sys

import pytest

from conftest import RANKSCOPE
from synthetic_run import MS, S, RankLog, write_run_json


def _goodput(run_dir):
    g = subprocess.run([RANKSCOPE, "goodput", "--json", str(run_dir)], capture_output=True, text=True, timeout=120)
    assert g.returncode == 0, g.stderr
    return json.loads(g.stdout)


def _session(log, at, restart, first, last, hang_step=None, ckpt_after=None, eval_after=None):
    """One session of the job below, from its run_start at `at`; returns where it ended."""
    log.run_start(at, restart=restart)
    at += 500 * MS                                   # start-up: init to the first step
    log.step_begin(at, first)
    for step in range(first, last):
        begin = at
        log.phase(at, step, "data", "loader_wait", 30 * MS)
        at += 30 * MS
        forward = 540 * MS if step == first and restart == 0 else 3 * S if step == hang_step else 40 * MS
        if step == hang_step:  # no progress from the data phase's end: the watchdog (1 s timeout) says so
            log.stall(at + 1100 * MS, step, since=at, timeout=S, inside="forward")
        log.phase(at, step, "forward", "forward", forward)
        at += forward
        if step == hang_step:                        # its next tick, 20 ms after the forward ended
            log.stall_end(at + 20 * MS, step, dur=forward + 20 * MS)
        log.phase(at, step, "all_reduce", "collective", 30 * MS)
        at += 30 * MS
        log.step_end(at, step, dur=at - begin, next_step=False)
        if step == ckpt_after:
            log.phase(at, step, "checkpoint_save", "checkpoint", 400 * MS)
            at += 400 * MS
        if step == eval_after:
            at += 300 * MS                           # an evaluation pass: between steps
        if step + 1 < last:
            log.step_begin(at, step + 1)
    at += 50 * MS                                    # the last step to shutdown
    log.run_end(at, last - 1)
    return at


def test_goodput_accounts_each_category_exactly(tmp_path):
    run = tmp_path / "run"
    write_run_json(run, 1, restart_count=1)
    log = RankLog(run, 0, 1)
    end = _session(log, 0, 0, 0, 30, hang_step=25, ckpt_after=10, eval_after=12)
    _session(log, end + 500 * MS, 1, 20, 40)         # restarted 0.5 s later from the step-20 checkpoint
    log.heartbeat(39)
    log.close()

    got = _goodput(run)
    # Every step is data 30 ms + forward 40 ms + all-reduce 30 ms, but for the first one's 540 ms forward
    # and step 25's 3 s hang; steps 20-29 of the second session repeat the first's.
    want = {
        "startup": 2 * 0.5,
        "warmup": 0.5,                               # the first step's excess over the median step
        "loader_wait": (30 + 10) * 0.030,            # 30 steps + the 10 new ones after the restart
        "communication": (30 + 10) * 0.030,
        "compute": (29 + 10) * 0.040,                # step 25's forward was the hang
        "checkpoint": 0.4,
        "stall": 3.0,                                # from the forward's start until its end, out of compute
        "restart_recompute": 10 * 0.100,
        "restart_downtime": 0.5,
        "other": 0.3 + 2 * 0.05,                     # the evaluation pass, and each session's end
    }
    assert got["wall_seconds"] == pytest.approx(10.76, abs=1e-9), got
    assert got["categories"] == pytest.approx(want, abs=1e-6), got  # the JSON has microseconds
    assert sum(want.values()) == pytest.approx(got["wall_seconds"], abs=1e-9)
    assert [r["rank"] for r in got["ranks"]] == [0] and got["ranks"][0]["categories"] == got["categories"], got

    text = subprocess.run([RANKSCOPE, "goodput", str(run)], capture_output=True, text=True, timeout=120).stdout
    assert "goodput" in text and "stalls and hangs" in text and "restart recompute" in text, text

    # Triage reads the same log: the hang, from the watchdog's line, and the restart.
    t = subprocess.run([RANKSCOPE, "triage", "--json", str(run)], capture_output=True, text=True, timeout=120)
    findings = json.loads(t.stdout)["findings"]
    assert [f["kind"] for f in findings] == ["stall", "restart"], findings
    assert findings[0]["summary"] == ("stall: rank 0 held up the next collective: it was blocked in forward at step 25 "
                                      "(recovered after 3.0 s)"), findings[0]


JOB = r'''
import os, sys, time
import rankscope
session = int(sys.argv[1])
rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
time.sleep(0.5)                                      # start-up
first, last = (0, 30) if session == 0 else (20, 40)  # the restart resumes from the step-20 checkpoint
def timed(name, seconds):
    with rankscope.phase(name):
        time.sleep(seconds)
for step in range(first, last):
    rankscope.begin_step(step)
    timed("data", 0.03)
    timed("forward", 0.54 if (session, step) == (0, first) else 0.04)
    timed("all_reduce", 0.03)
    rankscope.step(step)
    if session == 0 and step == 10:
        timed("checkpoint_save", 0.4)
    if session == 0 and step == 12:
        time.sleep(0.3)                              # an evaluation pass
rankscope.shutdown()
'''


def test_a_real_job_is_accounted_to_its_wall_time_and_each_category_holds_what_it_slept(tmp_path):
    """The job above, for real (no hang: the watchdog's timing is not what this checks).
    A sleep lasts at least its length on any machine, so each category holds at least the
    sleeps injected into it; how far above is the machine's business."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = dict(os.environ, RUN_DIR=str(tmp_path / "run"))
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    for session in (0, 1):
        if session:
            env["TORCHELASTIC_RESTART_COUNT"] = "1"  # an elastic restart of the same job
        p = subprocess.run([sys.executable, str(job), str(session)], env=env, capture_output=True, text=True,
                           timeout=600, cwd=tmp_path)
        assert p.returncode == 0, p.stderr[-3000:]
    got = _goodput(tmp_path / "run")
    cats = got["categories"]
    # The categories partition the wall time (each rounded to a microsecond in the JSON).
    assert sum(cats.values()) == pytest.approx(got["wall_seconds"], abs=2e-5), got
    at_least = {
        "startup": 2 * 0.5,                          # init() to the first step in each session
        "loader_wait": (30 + 10) * 0.03,             # not in the 10 repeated steps: those are recompute
        "communication": (30 + 10) * 0.03,
        "compute": (29 + 10) * 0.04,                 # the first step's excess is warm-up
        "checkpoint": 0.4,
        "restart_recompute": 10 * (0.03 + 0.04 + 0.03),
        "other": 0.3,
    }
    for k, v in at_least.items():
        # 0.1 %: the ticks-to-ns rate is calibrated at init, within 500 ppm.
        assert cats[k] >= 0.999 * v, f"{k}: goodput says {cats[k]:.4f} s, the job slept {v:.4f} s in it\n{got}"
    assert cats["restart_downtime"] > 0 and cats["stall"] == 0, got
