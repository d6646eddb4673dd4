"""Straggler findings as a live monitor would raise them: triage a finished run's
logs as they stood every K steps (`rankscope triage --until`, cut at rank 0's
step_end), and print each distinct finding once - rank, phase, onset and the
step at which it was first named. On a clean run every one is a false alarm.

    benchmarks/live_triage.py [--every K] [--cli build/lib/rankscope] RUN_DIR...

One line per run: `RUN_DIR STEPS N finding(s): rank R phase from ONSET named at STEP; ...`.
Used by benchmarks/straggler_eval.sh.
"""
import argparse
import glob
import json
import os
import subprocess


def step_ends(run_dir):
    """Rank 0's step -> wall-clock ns of its step_end."""
    ends = {}
    with open(sorted(glob.glob(os.path.join(run_dir, "rank-0*.jsonl")))[0]) as f:
        for line in f:
            if '"kind":"step_end"' in line:
                e = json.loads(line)
                ends[e["step"]] = e["t"]
    return ends


def stragglers(cli, run_dir, until):
    out = subprocess.run([cli, "triage", "--json", "--until", str(until), run_dir],
                         capture_output=True, text=True, check=False).stdout
    for f in json.loads(out)["findings"]:
        if f["kind"] == "straggler":
            phase = f["summary"].split(":")[0].rsplit(" in ", 1)[-1]
            yield f["ranks"][0], phase, f["step"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--every", type=int, default=30, help="triage every this many steps")
    p.add_argument("--cli", default="build/lib/rankscope")
    p.add_argument("--first", type=int, default=60, help="the first step to cut at")
    p.add_argument("runs", nargs="+")
    a = p.parse_args()
    for run in a.runs:
        ends = step_ends(run)
        found = []  # (rank, phase, onset, named at); one per slow spell
        for step in sorted(ends)[a.first::a.every]:
            for rank, phase, onset in stragglers(a.cli, run, ends[step]):
                # The same spell, named again at a later cut (its onset may move a little).
                if not any(r == rank and ph == phase and abs(o - onset) <= 150 for r, ph, o, _ in found):
                    found.append((rank, phase, onset, step))
        spells = "; ".join("rank %d %s from %d named at %d" % f for f in found)
        print("%s %d steps %d finding(s)%s" % (run, len(ends), len(found), ": " + spells if found else ""))


if __name__ == "__main__":
    main()
