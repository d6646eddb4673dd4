"""Judges one real run of the subtle straggler case: rank 1's forward 1.2x from step 300 of 600
(examples/cpp/launch.sh --ranks 2 --steps 600 --bind -- --hidden 1024 --slow-rank 1
--slow-from-step 300 --slow-factor 1.2), for benchmarks/README.md's rates.

  subtle_straggler.py CLI RUN_DIR  ->  one line: "ok", "miss: why" or "disturbed X: why"

Triage must name rank 1 as a straggler in forward from step 285-315, from the
whole log and from the log as it stood 60 steps in (rank 0's step 360). Other
straggler findings may come with it: this host has slow spells of its own.

A run the host disturbed does not count against triage: here a vCPU's speed
swings 1.3-2x for tens of steps at a time (a neighbour on its sibling
hyperthread, measured 2026-11-27), which a 1.2x rank cannot be told from. The
disturbance is the largest max/min of 30-step medians of each rank's forward
and backward (rank 1's forward before and from step 300 apart); runs up to
1.25x are quiet enough to be judged (of 20 bound runs that day, all 6 such
runs named it; of the 14 above, 11 missed).
"""
import json
import statistics
import subprocess
import sys

QUIET = 1.25


def stragglers(cli, run, until=None):
    args = [cli, "triage", "--json"] + (["--until", str(until)] if until else []) + [run]
    out = subprocess.run(args, capture_output=True, text=True).stdout
    return [f for f in json.loads(out)["findings"] if f["kind"] == "straggler"]


def named(findings):
    return any(f["ranks"] == [1] and 285 <= f["step"] <= 315 and " in forward: " in f["summary"]
               for f in findings)


def read(run):
    """(rank, phase kind) -> {step: duration ns} of top-level forward/backward; rank 0's step_end times."""
    phases, ends = {}, {}
    for r in (0, 1):
        with open(f"{run}/rank-{r}.jsonl") as fh:
            for line in fh:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("kind") == "phase" and e.get("depth", 0) == 0 and e.get("phase_kind") in ("forward", "backward"):
                    phases.setdefault((r, e["phase_kind"]), {})[e["step"]] = e["dur"]
                elif r == 0 and e.get("kind") == "step_end":
                    ends[e["step"]] = e["t"]
    return phases, ends


def disturbance(phases):
    worst, where = 1.0, ""
    for (r, kind), durs in phases.items():
        spans = [(0, 300), (300, 600)] if (r, kind) == (1, "forward") else [(0, 600)]
        for lo, hi in spans:
            meds = []
            for a in range(lo, hi, 30):
                v = [durs[s] for s in range(a, min(a + 30, hi)) if s in durs]
                if v:
                    meds.append(statistics.median(v))
            if len(meds) >= 2 and max(meds) / min(meds) > worst:
                worst, where = max(meds) / min(meds), f"rank {r}'s {kind}, steps {lo}-{hi}"
    return worst, where


def main():
    cli, run = sys.argv[1], sys.argv[2]
    phases, ends = read(run)
    whys = []
    for label, until in (("whole log", None), ("60 steps in", ends.get(360))):
        found = stragglers(cli, run, until)
        if not named(found):
            whys.append("%s: %s" % (label, "; ".join("%s (step %d)" % (f["summary"], f["step"]) for f in found)
                                    or "no straggler"))
    if not whys:
        print("ok")
        return
    worst, where = disturbance(phases)
    verdict = "miss" if worst <= QUIET else "disturbed %.2fx (%s)" % (worst, where)
    print("%s: %s" % (verdict, " | ".join(whys)))


if __name__ == "__main__":
    main()
