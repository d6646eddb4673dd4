"""Is the training healthy: faults injected into the real DDP example on 2 torchrun ranks,
each named by `rankscope triage` with its rank and step, at default settings. Slowdowns (a
straggler, a throughput drop) are injected into run logs the test writes itself: their
verdicts must not depend on how fast this machine runs the real example."""
import json
import os
import random
import subprocess

import pytest

from conftest import RANKSCOPE, ROOT, TIME_ONLY
from synthetic_run import MS, lockstep_run

EXAMPLE = os.path.join(ROOT, "examples", "python", "train_ddp.py")


def _triage(tmp_path, p):
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = str(tmp_path / p.stdout.strip().splitlines()[-1])
    t = subprocess.run([RANKSCOPE, "triage", "--json", run_dir], capture_output=True, text=True, timeout=120)
    assert t.returncode == 1, t.stdout[-3000:] + t.stderr[-2000:]
    return run_dir, json.loads(t.stdout)["findings"]


def _one(findings, kind):
    of_kind = [f for f in findings if f["kind"] == kind]
    assert len(of_kind) == 1, findings
    return of_kind[0]


def test_a_nan_loss_on_one_rank_is_named_with_its_step_and_the_rank_that_followed(tmp_path, torchrun):
    p = torchrun(EXAMPLE, 2, "--epochs", "2", "--fault-rank", "1", "--fault-step", "10", "--nan")
    _, findings = _triage(tmp_path, p)
    f = findings[0]
    assert f["kind"] == "numerics" and f["ranks"] == [1] and f["step"] == 10, findings
    assert f["summary"] == "rank 1: loss is NaN from step 10; rank 0 followed (the all-reduce spreads it)"
    assert any("grad_norm non-finite on every rank from step 10" in e for e in f["evidence"]), f
    assert "E loss is NaN at step 10" in p.stderr  # the console says it as it happens


def test_a_corrupt_batch_a_failed_save_and_a_different_knob_on_one_rank_are_each_named(tmp_path, torchrun):
    p = torchrun(EXAMPLE, 2, "--epochs", "2", "--fault-rank", "1", "--fault-step", "20", "--spike", "--fail-save",
                 "--env", "NCCL_ALGO=Tree")
    run_dir, findings = _triage(tmp_path, p)
    faults = [f["kind"] for f in findings if f["kind"] not in TIME_ONLY]
    assert sorted(faults) == ["checkpoint_failed", "config_drift", "numerics"], findings
    assert [f["kind"] for f in findings[:3]] == faults, findings  # the faults before any time-only finding

    spike = _one(findings, "numerics")
    assert spike["ranks"] == [1] and spike["step"] == 20, spike
    assert spike["summary"].startswith("rank 1: loss spike at step 20: "), spike
    assert spike["summary"].endswith("(no other rank followed)"), spike
    assert any(e.startswith("grad_norm exploded on every rank at step 20") for e in spike["evidence"]), spike

    ckpt = _one(findings, "checkpoint_failed")
    assert ckpt["ranks"] == [1] and ckpt["step"] == 16, ckpt  # the first epoch's end: 2048 / 64 / 2 steps
    assert "failed to save checkpoint" in ckpt["summary"] and "does not exist" in ckpt["summary"], ckpt
    assert "(2 failures, at steps 16,32)" in ckpt["summary"], ckpt

    drift = _one(findings, "config_drift")
    assert drift["ranks"] == [0, 1], drift  # two ranks that differ: both named
    assert "NCCL_ALGO: (unset) on rank 0, Tree on rank 1" in drift["summary"], drift

    # The good saves are on disk, the failed ones are not; rank 0 saved both epochs.
    saved = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))
    assert saved == ["epoch-0-rank-0.pt", "epoch-1-rank-0.pt"], saved


def test_a_rank_started_with_another_learning_rate_is_named_by_its_config_and_its_steps(tmp_path, torchrun):
    """Rank 1 trains with lr 0.05 where rank 0 has 0.1 (a per-node launch script with a stale
    value): its run config and the lr it reports with every step both differ. Two ranks: no
    majority, so both are named and the finding says why."""
    p = torchrun(EXAMPLE, 2, "--epochs", "1", "--fault-rank", "1", "--fault-lr", "0.05")
    _, findings = _triage(tmp_path, p)
    assert [f["kind"] for f in findings if f["kind"] not in TIME_ONLY] == ["config_drift"], findings
    drift = findings[0]
    # Step 0 has no duration (rankscope.step() alone: nothing began it), so the series that
    # carries the learning rates starts at step 1.
    assert drift["ranks"] == [0, 1] and drift["step"] == 1, drift
    assert drift["summary"] == ("ranks 0,1 have a different configuration (no value holds a majority, so every rank "
                                "is named): config.lr: 0.05 on rank 1, 0.1 on rank 0"), drift
    assert drift["evidence"][0] == ("ranks 0,1 reported different learning rates from step 1 (no value holds a "
                                    "majority, so every rank is named): 0.05 on rank 1, 0.1 on rank 0"), drift


# What a rule decides from time alone is tested on run logs written here (synthetic_run.py),
# where nothing varies but the injected slowdown: a real run's timing depends on the machine
# (this host's cores slow down 1.3-2x for tens of steps at a time). How often real runs of the
# DDP example are named, and from which step: benchmarks/python/timing_findings.py.
LOADER, FORWARD, BACKWARD, OPTIMIZER = 500_000, 1_000_000, 1_500_000, 500_000  # ns: a 3.7 ms step


def _synthetic_triage(run_dir):
    t = subprocess.run([RANKSCOPE, "triage", "--json", str(run_dir)], capture_output=True, text=True, timeout=120)
    assert t.returncode in (0, 1), t.stderr[-2000:]
    report = json.loads(t.stdout)
    assert report["exit_code"] == t.returncode and not report["warnings"], report
    return report["findings"]


def test_a_job_wide_throughput_drop_is_named_with_the_step_it_began(tmp_path):
    """Every rank's batches come 20 ms later from step 64 of 160 (a slower filesystem for the
    whole job, as the DDP example's --slow-data-from 64 --slow-data-ms 20): the job's
    throughput fell, loader wait grew, and no rank is the straggler."""
    def phases(rank, step):
        return LOADER + (20 * MS if step >= 64 else 0), FORWARD, BACKWARD, OPTIMIZER

    findings = _synthetic_triage(lockstep_run(tmp_path / "run", 2, 160, phases))
    assert [f["kind"] for f in findings] == ["throughput"], findings  # every rank slowed: nobody's fault
    f = findings[0]
    assert f["ranks"] == [0, 1] and f["step"] == 64, f
    assert f["summary"] == ("throughput fell 84 % from step 64: 3.70 -> 23.70 ms per step, 34595 -> 5401 samples/s "
                            "for the job"), f
    assert f["evidence"][0] == "what grew: loader_wait by 20.00 ms per step (the median rank's)", f


@pytest.mark.parametrize("spread,slow_until,found", [(0.01, 300, True), (0.4, 300, False), (0.01, 200, False)],
                         ids=["steady steps", "steps that vary 40 %", "recovered"])
def test_a_ten_percent_throughput_drop_is_said_where_it_stands_out_of_the_steps_spread(tmp_path, spread, slow_until,
                                                                                      found):
    """Every rank's forward 4 ms longer from step 100 of 300 (a 33.5 ms step: 11 % fewer steps per
    second). Said where the steps vary by 1 %; not where they vary by 40 % (a CPU job on a busy
    host: the drop is within their own spread), nor when it is over before the log ends."""
    rnd = random.Random(47)
    noise = [1 + spread * (2 * rnd.random() - 1) for _ in range(300)]  # the job's, per step

    def phases(rank, step):
        forward = 30 * MS * noise[step] + (4 * MS if 100 <= step < slow_until else 0)
        return LOADER, int(forward), BACKWARD, OPTIMIZER

    findings = _synthetic_triage(lockstep_run(tmp_path / "run", 2, 300, phases))
    if not found:
        assert findings == [], findings
        return
    assert [f["kind"] for f in findings] == ["throughput"], findings
    f = findings[0]
    assert f["ranks"] == [0, 1] and 98 <= f["step"] <= 102, f
    assert f["summary"].startswith("throughput fell 11 % from step"), f
    grew = f["evidence"][0]
    assert grew.startswith("what grew: forward by ") and 3.5 < float(grew.split()[4]) < 4.5, f


@pytest.mark.parametrize("factor,mine,waits,on_device", [(2, "2.00 ms", "1.00 ms", False),
                                                         (1.2, "1.20 ms", "0.200 ms", False),
                                                         (2, "2.00 ms", "1.00 ms", True)],
                         ids=["2x", "1.2x", "2x on the GPU"])
def test_a_rank_slower_in_forward_is_a_straggler_with_the_wait_it_costs_the_others(tmp_path, factor, mine, waits,
                                                                                    on_device):
    """Rank 1's forward takes 2x (or a subtle 1.2x) from step 40 of 120, as the DDP example's
    --fault-rank 1 --slow-factor 2: rank 0 waits for it in DDP's all-reduce at the end of its
    backward, which is communication, not backward - so rank 1 alone is named, in forward,
    from step 40, with what it costs rank 0. On a GPU the same, from the phases' device time:
    the host's (the launch) is the same on both ranks."""
    def phases(rank, step):
        return LOADER, int(FORWARD * (factor if rank == 1 and step >= 40 else 1)), BACKWARD, OPTIMIZER

    findings = _synthetic_triage(lockstep_run(tmp_path / "run", 2, 120, phases, on_device=on_device))
    assert [f["kind"] for f in findings] == ["straggler"], findings  # the job's slowdown is its consequence
    f = findings[0]
    assert f["ranks"] == [1] and f["step"] == 40, f
    assert f["summary"] == (f"rank 1 is a straggler in forward: {mine} per step vs 1.00 ms on the other ranks "
                            f"({factor:.2f}x), from step 40"), f
    assert f["evidence"][0].startswith(f"the other ranks wait about {waits} per step for it in the next collective"), f
    assert f["evidence"][1].endswith("(they wait for it)"), f


@pytest.mark.parametrize("spell", ["none", "one rank 2x for 40 steps", "the job 6x for 30 steps"])
def test_steady_steps_or_a_slow_spell_that_passes_are_no_finding(tmp_path, spell):
    """What a busy host does to a healthy job - a rank or every rank slower for a while, then
    normal again - is neither a straggler (a spell that ended must last 200 steps) nor a
    throughput drop (it must last to the end of the log)."""
    def phases(rank, step):
        if spell == "one rank 2x for 40 steps" and rank == 1 and 60 <= step < 100:
            return LOADER, 2 * FORWARD, BACKWARD, OPTIMIZER
        if spell == "the job 6x for 30 steps" and 60 <= step < 90:
            return LOADER + 20 * MS, FORWARD, BACKWARD, OPTIMIZER
        return LOADER, FORWARD, BACKWARD, OPTIMIZER

    assert _synthetic_triage(lockstep_run(tmp_path / "run", 2, 200, phases)) == []


def test_a_flipped_bit_in_one_replica_is_named_with_rank_tensor_and_step(tmp_path, torchrun):
    """3 ranks (a majority says which replica is wrong), replicas compared every 10 steps."""
    p = torchrun(EXAMPLE, 3, "--epochs", "3", "--fault-rank", "2", "--fault-step", "20", "--bitflip",
                 "--check-replicas", "10")
    _, findings = _triage(tmp_path, p)
    f = findings[0]
    assert f["kind"] == "silent_corruption" and f["ranks"] == [2], findings
    assert f["step"] == 29, f  # flipped after step 20's update; the next check ends step 29
    assert f["summary"].startswith("replicas disagree on 'module.0.weight' at step 29: rank 2 differs"), f


def test_with_two_replicas_a_flipped_bit_names_both(tmp_path, torchrun):
    p = torchrun(EXAMPLE, 2, "--epochs", "2", "--fault-rank", "1", "--fault-step", "5", "--bitflip",
                 "--check-replicas", "10")
    _, findings = _triage(tmp_path, p)
    f = _one(findings, "silent_corruption")
    assert f["ranks"] == [0, 1] and f["step"] == 9, f
    assert "no majority says which is right" in f["summary"], f
