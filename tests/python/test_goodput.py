"""`rankscope goodput`: a run with delays of known length injected into every category
(start-up, a 0.5 s "compilation" in the first step, loader wait, communication, compute, a
checkpoint, an evaluation pass, a 3 s hang the watchdog reports, an elastic restart that
repeats 10 steps) is accounted category by
category within 1 % of what the job itself measured (the time between steps: the evaluation
pass and Python's own time there), and the categories sum to the wall time."""
import json
import os
import subprocess
import sys
import time

RANKSCOPE = os.path.join(os.path.dirname(sys.executable), "rankscope")

JOB = r'''
import json, os, sys, time
import rankscope
session = int(sys.argv[1])
spent = dict.fromkeys(("startup", "warmup", "loader_wait", "communication", "compute", "checkpoint", "stall",
                       "other", "restart_recompute"), 0.0)
t_init = time.time()
rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
init_s = time.time() - t_init  # init stamps the session's start somewhere inside this
time.sleep(0.5)                                      # start-up
first, last = (0, 30) if session == 0 else (20, 40)  # the restart resumes from the step-20 checkpoint
def timed(name, seconds, into):
    with rankscope.phase(name):
        t = time.perf_counter()
        time.sleep(seconds)
        if into:
            spent[into] += time.perf_counter() - t
t_prev_end = None  # between steps is "other": an evaluation pass, and Python's own time between steps
for step in range(first, last):
    repeated = session == 1 and step < 30
    t_step = time.perf_counter()
    if t_prev_end is not None:
        spent["other"] += t_step - t_prev_end - ckpt_in_gap
    ckpt_in_gap = 0.0
    if step == first:
        spent["startup"] = time.time() - t_init
    rankscope.begin_step(step)
    hang = (session, step) == (0, 25)
    timed("data", 0.03, None if repeated else "loader_wait")
    if (session, step) == (0, first):  # the first step compiles: 0.5 s more than the others
        t = time.perf_counter()
        timed("forward", 0.54, None)
        spent["warmup"] += time.perf_counter() - t - 0.04
        spent["compute"] += 0.04
    else:
        timed("forward", 3.0 if hang else 0.04, "stall" if hang else None if repeated else "compute")
    timed("all_reduce", 0.03, None if repeated else "communication")
    rankscope.step(step)
    t_prev_end = time.perf_counter()
    if repeated:  # the whole step, phases and the gaps between them
        spent["restart_recompute"] += t_prev_end - t_step
    if session == 0 and step == 10:
        before = spent["checkpoint"]
        timed("checkpoint_save", 0.4, "checkpoint")
        ckpt_in_gap = spent["checkpoint"] - before
    if session == 0 and step == 12:
        time.sleep(0.3)                              # an evaluation pass
spent["other"] += time.perf_counter() - t_prev_end   # the last step to shutdown
t_shutdown = time.time()
rankscope.shutdown()
t_end = time.time()
json.dump({"spent": spent, "t_init": t_init, "t_end": t_end, "init_s": init_s, "shutdown_s": t_end - t_shutdown},
          open(sys.argv[2], "w"))
'''


def test_goodput_accounts_each_injected_delay_within_one_percent(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = dict(os.environ, RUN_DIR=str(tmp_path / "run"), RANKSCOPE_STALL_TIMEOUT="1")
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    measured = []
    for session in (0, 1):
        if session:
            env["TORCHELASTIC_RESTART_COUNT"] = "1"  # an elastic restart of the same job
            time.sleep(0.5)
        out = tmp_path / f"spent-{session}.json"
        p = subprocess.run([sys.executable, str(job), str(session), str(out)], env=env, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        measured.append(json.loads(out.read_text()))
    want = {k: sum(m["spent"][k] for m in measured) for k in measured[0]["spent"]}
    want["restart_downtime"] = measured[1]["t_init"] - measured[0]["t_end"]

    g = subprocess.run([RANKSCOPE, "goodput", "--json", str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=60)
    assert g.returncode == 0, g.stderr
    got = json.loads(g.stdout)
    cats = got["categories"]
    assert abs(sum(cats.values()) - got["wall_seconds"]) <= 0.005 * got["wall_seconds"], got
    # The job's start-up clock starts before init(), whose session stamp is inside it; the
    # downtime's ends are inside the first session's shutdown() and the second's init().
    unseen = {"startup": sum(m["init_s"] for m in measured),
              "restart_downtime": measured[0]["shutdown_s"] + measured[1]["init_s"]}
    for k, v in want.items():
        slack = 0.01 * v + unseen.get(k, 0.0)
        assert abs(cats[k] - v) <= slack, f"{k}: goodput says {cats[k]:.4f} s, the job spent {v:.4f} s\n{got}"
    print({k: (round(cats[k], 4), round(v, 4)) for k, v in want.items()}, unseen)

    text = subprocess.run([RANKSCOPE, "goodput", str(tmp_path / "run")], capture_output=True, text=True).stdout
    assert "goodput" in text and "stalls and hangs" in text and "restart recompute" in text, text
