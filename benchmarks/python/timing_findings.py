"""How often `rankscope triage` names a real slowdown on this machine, and from which step: the
real-run side of the synthetic straggler and throughput tests (tests/python/test_training_health.py,
which decide the rules' verdicts on run logs they write themselves). Each run is the DDP example
(examples/python/train_ddp.py) on 2 torchrun ranks with one injected slowdown, or none:

    throughput  every rank's batches 20 ms later from step 64 of 256: a job-wide throughput drop
    straggler   rank 1's forward 2x from step 10 of 192 (a busy-wait, as a slower device)
    clean       nothing injected: what this host's own slow spells make triage say

    .venv/bin/python benchmarks/python/timing_findings.py [--runs N] [--cases throughput,straggler,clean]
    .venv/bin/python benchmarks/python/timing_findings.py --quick     # one run of each (the ctest smoke run)

It prints, per run, what triage found (kind, ranks, step, summary) and per case how many runs
named the injected slowdown and at which steps. It never fails on those numbers - a busy host
moves them (benchmarks/README.md, Stragglers) - only when a run itself fails.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "python", "train_ddp.py")
BIN = os.path.dirname(sys.executable)

# case -> (the example's arguments, the finding it should give, its ranks, the step it was injected at)
CASES = {
    "throughput": (["--samples", "8192", "--epochs", "2", "--slow-data-from", "64", "--slow-data-ms", "20"],
                   "throughput", [0, 1], 64),
    "straggler": (["--samples", "12288", "--epochs", "1", "--hidden", "512", "--fault-rank", "1", "--fault-step", "10",
                   "--slow-factor", "2"], "straggler", [1], 10),
    "clean": (["--epochs", "2"], None, [], None),
}


def one_run(args, workdir):
    """Runs the example once; returns triage's findings (a list of dicts) and the seconds it took."""
    t = time.monotonic()
    p = subprocess.run([os.path.join(BIN, "torchrun"), "--standalone", "--nproc-per-node", "2", EXAMPLE, *args],
                       cwd=workdir, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0:
        sys.exit(f"the example failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    run_dir = os.path.join(workdir, p.stdout.strip().splitlines()[-1])
    tr = subprocess.run([os.path.join(BIN, "rankscope"), "triage", "--json", run_dir], capture_output=True, text=True,
                        timeout=600)
    if tr.returncode not in (0, 1):
        sys.exit(f"triage failed (exit {tr.returncode}):\n{tr.stderr[-3000:]}")
    return json.loads(tr.stdout)["findings"], time.monotonic() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per case")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    ap.add_argument("--quick", action="store_true", help="one run of each case (it still runs, numbers aside)")
    a = ap.parse_args()
    runs = 1 if a.quick else a.runs
    cases = a.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}")
    summary = []
    for case in cases:
        args, kind, ranks, injected = CASES[case]
        named, onsets, others, noisy = 0, [], [], 0
        for i in range(runs):
            with tempfile.TemporaryDirectory(prefix=f"rankscope-timing-{case}-") as d:
                findings, secs = one_run(args, d)
            hit = [f for f in findings if f["kind"] == kind and f["ranks"] == ranks]
            if hit:
                named += 1
                onsets.append(hit[0]["step"])
            rest = [f"{f['kind']} {f['ranks']}" for f in findings if not (hit and f is hit[0])]
            others += rest
            noisy += bool(rest)
            print(f"{case} run {i + 1}/{runs} ({secs:.0f} s): "
                  + ("; ".join(f"[{f['kind']}] ranks {f['ranks']} step {f['step']}: {f['summary']}" for f in findings)
                     or "no findings"), flush=True)
        if kind:
            where = (f", onset steps {sorted(onsets)} (median {statistics.median(onsets):g}; injected at {injected})"
                     if onsets else "")
            line = f"{case}: named in {named}/{runs} runs{where}"
        else:
            line = f"{case}: no findings in {runs - noisy}/{runs} runs"
        if others:
            line += (f"; {'' if kind is None else 'other '}findings in {noisy} run(s): "
                     f"{', '.join(sorted(set(others)))} ({len(others)} in all)")
        summary.append(line)
    print("\n".join(["", "summary (what this host did this time; nothing is asserted):", *summary]), flush=True)


if __name__ == "__main__":
    main()
