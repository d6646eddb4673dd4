"""Is the training healthy: faults injected into the real DDP example on 2 torchrun ranks,
each named by `rankscope triage` with its rank and step, at default settings."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

RANKSCOPE = os.path.join(os.path.dirname(sys.executable), "rankscope")
EXAMPLE = os.path.join(ROOT, "examples", "python", "train_ddp.py")


def _triage(tmp_path, p):
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = str(tmp_path / p.stdout.strip().splitlines()[-1])
    t = subprocess.run([RANKSCOPE, "triage", "--json", run_dir], capture_output=True, text=True, timeout=60)
    assert t.returncode == 1, t.stdout[-3000:] + t.stderr[-2000:]
    return run_dir, json.loads(t.stdout)["findings"]


# Findings that only cost time: a rank slowed by this shared 2-core host (CI runs another test
# beside this one) is a real straggler, and triage lists such findings after the faults.
TIME_ONLY = {"straggler", "slow_steps", "throughput", "resource_growth"}


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


# Timing: this host's vCPUs change speed 1.3-2x for tens of steps at a time
# (benchmarks/README.md, Stragglers); a real regression fails all three runs.
@pytest.mark.flaky(reruns=2)
def test_a_job_wide_throughput_drop_is_named_with_the_step_it_began(tmp_path, torchrun):
    p = torchrun(EXAMPLE, 2, "--samples", "8192", "--epochs", "2", "--slow-data-from", "64", "--slow-data-ms", "20")
    _, findings = _triage(tmp_path, p)
    f = _one(findings, "throughput")
    # 20 ms more per batch from step 64 (this shared host's own slow stretches reach 10 ms)
    assert f["ranks"] == [0, 1] and 62 <= f["step"] <= 66, f
    assert "what grew: loader_wait" in f["evidence"][0], f
    assert not [x for x in findings if x["kind"] == "straggler"], findings  # every rank slowed: nobody's fault


# Timing: this host's vCPUs change speed 1.3-2x for tens of steps at a time
# (benchmarks/README.md, Stragglers); a real regression fails all three runs.
@pytest.mark.flaky(reruns=2)
def test_a_rank_slower_in_forward_is_a_straggler_with_the_wait_it_costs_the_others(tmp_path, torchrun):
    # 2x from step 10 of 96: under CI's load (ctest -j2 beside multi-process jobs) the peers'
    # own slowdowns drowned 1.5x's first windows once (onset found at 42 of a 64-step run).
    p = torchrun(EXAMPLE, 2, "--samples", "12288", "--epochs", "1", "--hidden", "512", "--fault-rank", "1",
                 "--fault-step", "10", "--slow-factor", "2")
    _, findings = _triage(tmp_path, p)
    f = _one(findings, "straggler")
    # From step 10 on; on this busy host rank 1 is sometimes slower from the first steps already.
    assert f["ranks"] == [1] and 0 <= f["step"] <= 25, f
    # Forward is named: as the headline, or - when a busy host slowed the spinning rank's
    # backward even more (the scheduler makes a busy-waiting process pay later) - as "also slower".
    assert f["summary"].startswith("rank 1 is a straggler in forward: ") or \
        any(e.startswith("also slower in forward: ") for e in f["evidence"]), f
    assert f["evidence"][0].startswith("the other ranks wait about "), f


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
