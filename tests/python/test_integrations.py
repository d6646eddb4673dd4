"""The framework callbacks with the real frameworks (requirements/frameworks.txt): a tiny
model built from a config (nothing is downloaded), 2 ranks under torchrun on the CPU with
gloo, the user's one added line and default settings. For each framework: a clean run
has no fault; a rank that hangs in its data, an exception on one rank, and a NaN loss on
one rank are each named by triage, with the rank and the step.

Each fault is on rank 1 and keyed to what rank 1 has done (items it served, its step), never
to time: what the test waits for is the stall record itself (default stall timeout)."""
import collections
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import RANKSCOPE, ROOT, TORCHRUN, kill_job, run_log_events, wait_for

# What every job below trains on: rank 1's 81st sample (after the warm-up steps, so the learned
# stall timeout is the default's 15 s) hangs or raises, as FAULT says. Prepended to each script.
DATA = r"""
import os, threading, torch
FAULT, RANK = os.environ.get("FAULT", ""), int(os.environ["RANK"])

class Faulty(torch.utils.data.Dataset):
    def __init__(self):
        self.served = 0
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        if RANK == 1 and self.served == 80:
            if FAULT == "hang":
                threading.Event().wait()
            if FAULT == "raise":
                raise ValueError(f"corrupt sample {i}")
        self.served += 1
        return self.sample(i, torch.Generator().manual_seed(i))

class Samples(Faulty):  # x -> sum(x)
    def sample(self, i, g):
        x = torch.randn(8, generator=g)
        return x, x.sum(0, keepdim=True)
"""

TRAINER = DATA + r"""
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from rankscope.integrations.transformers import RankscopeCallback

class Tokens(Faulty):
    def sample(self, i, g):
        ids = torch.randint(0, 64, (16,), generator=g)
        return {"input_ids": ids, "labels": ids}

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
if FAULT == "nan" and RANK == 1:
    def poison(module, args, output):  # rank 1's loss in step 7 (global_step 6 until it ends)
        if module.training and trainer.state.global_step == 6:
            output.loss = output.loss * float("nan")
        return output
    model.register_forward_hook(poison)
args = TrainingArguments(output_dir="out", max_steps=1000 if FAULT == "hang" else 20,
                         per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=1e-3,
                         logging_steps=5, save_steps=10, eval_strategy="steps", eval_steps=10,
                         per_device_eval_batch_size=8, report_to=[], use_cpu=True, ddp_backend="gloo",
                         dataloader_num_workers=0, disable_tqdm=True, save_only_model=True)
trainer = Trainer(model=model, args=args, train_dataset=Tokens(),
                  eval_dataset=torch.utils.data.Subset(Tokens(), range(32)),
                  callbacks=[RankscopeCallback()])            # the one line
trainer.train()
"""


LIGHTNING = DATA + r"""
import lightning.pytorch as L
from rankscope.integrations.lightning import RankscopeCallback

class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if FAULT == "nan" and RANK == 1 and self.trainer.global_step == 6:
            loss = loss * float("nan")
        return loss
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.95)}
    def train_dataloader(self):
        return torch.utils.data.DataLoader(Samples(), batch_size=4)
    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.Subset(Samples(), range(32)), batch_size=8)

torch.manual_seed(0)
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=1000 if FAULT == "hang" else 20,
                    accumulate_grad_batches=2, val_check_interval=20, limit_val_batches=2, num_sanity_val_steps=1,
                    enable_progress_bar=False, logger=False, default_root_dir=".",
                    callbacks=[RankscopeCallback()])                       # the one line
trainer.fit(Regression())
"""


# Accelerate has no callbacks (its trackers get only what the main process logs): its users
# keep their own loop, instrumented as any loop is, plus DDP found where prepare() builds it.
ACCELERATE = DATA + r"""
from accelerate import Accelerator
import rankscope, rankscope.torch as rst

rankscope.init(); rst.instrument(); rst.instrument_ddp_when_built()     # before prepare() builds DDP
accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
model, opt, loader = accelerator.prepare(model, opt, torch.utils.data.DataLoader(Samples(), batch_size=8))
for step, (x, y) in enumerate(rst.timed_loader(loader)):
    with rankscope.phase("forward"):
        loss = torch.nn.functional.mse_loss(model(x), y)
        if FAULT == "nan" and RANK == 1 and step == 7:
            loss = loss * float("nan")
    with rankscope.phase("backward"):
        accelerator.backward(loss)
    with rankscope.phase("optimizer"):
        opt.step()
        opt.zero_grad()
    rankscope.step(step, loss=loss, lr=opt.param_groups[0]["lr"], samples=len(x))
    if step + 1 == (1000 if FAULT == "hang" else 20):
        break
accelerator.end_training()
"""


# No code at all: an unmodified DDP script under `rankscope run -- torchrun ...` (the hang: under
# RANKSCOPE_AUTO=1 instead, the form for launchers that own the command line).
PLAIN = DATA + r"""
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = torch.utils.data.DataLoader(Samples(), batch_size=8)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    if FAULT == "nan" and RANK == 1 and step == 7:
        loss = loss * float("nan")
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step + 1 == (1000 if FAULT == "hang" else 20):
        break
dist.destroy_process_group()
"""


# FSDP2 without code: fully_shard found where the script calls it (layers, then the root).
PLAIN_FSDP2 = DATA + r"""
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = torch.utils.data.DataLoader(Samples(), batch_size=8)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step + 1 == 20:
        break
dist.destroy_process_group()
"""


def _job(tmp_path, script, fault):
    path = tmp_path / "train.py"
    path.write_text(script)
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", RANKSCOPE_DIR=str(run), FAULT=fault)
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(path)]
    if script is PLAIN or script is PLAIN_FSDP2:
        if fault == "hang":
            env["RANKSCOPE_AUTO"] = "1"
        else:
            cmd = [RANKSCOPE, "run", "--", *cmd]
    return run, cmd, env


def _triage(run):
    p = subprocess.run([RANKSCOPE, "triage", "--json", str(run)], capture_output=True, text=True, timeout=120)
    return p.returncode, json.loads(p.stdout)


def _run(tmp_path, script, fault):
    run, cmd, env = _job(tmp_path, script, fault)
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    return run, p


def _check_clean(tmp_path, script, steps, first):
    run, p = _run(tmp_path, script, "")
    assert p.returncode == 0, p.stderr[-4000:]
    rc, report = _triage(run)
    faults = [f for f in report["findings"] if not f["costs_only_time"]]
    assert not faults, faults
    steps_of = {r: sorted(e["step"] for e in run_log_events(str(run), "step_end") if e["rank"] == r) for r in (0, 1)}
    assert steps_of[0] == steps_of[1] == list(range(first, first + steps)), steps_of
    return run


def _check_hang(tmp_path, script, where):
    run, cmd, env = _job(tmp_path, script, "hang")
    job = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:  # both ranks report their stall (default settings), then triage reads the hung job
        wait_for(lambda: all(any(e["kind"] == "stall" for e in _events(run, r)) for r in (0, 1)),
                 "a stall reported by both ranks", proc=job, guard_s=600)
        # Each stall's flight dump brings PyTorch's own flight recorder along (within a second).
        wait_for(lambda: all((run / f"rank-{r}.torch-flight.json").exists() for r in (0, 1)),
                 "PyTorch's flight recorder copied by both ranks", proc=job, guard_s=600)
        rc, report = _triage(run)
    finally:
        kill_job(job, [str(run)])
    f = report["findings"][0]
    assert rc == 1 and f["kind"] == "hang" and f["ranks"] == [1], report["findings"]
    assert where in f["summary"], f
    # By PyTorch's count too: rank 0 has a collective pending (which one depends on the framework:
    # DDP's all-reduce, Lightning's all-gather) that rank 1 never enqueued. What rank 1 last
    # enqueued, and whether gloo has marked it completed yet, depends on timing.
    torch_fr = [e for e in f["evidence"] if e.startswith("PyTorch's flight recorder on ")]
    newest = re.search(r"\(gloo\): rank 0 enqueued #(\d+) \(gloo:", torch_fr[0] if torch_fr else "")
    assert newest and f"rank 1 never enqueued #{newest.group(1)}" in torch_fr[0], f["evidence"]
    return f


def _events(run, rank):
    try:
        with open(run / f"rank-{rank}.jsonl") as fh:
            return [json.loads(line) for line in fh if line.endswith("\n")]
    except OSError:
        return []


def _check_raise(tmp_path, script, text):
    run, p = _run(tmp_path, script, "raise")
    assert p.returncode != 0
    rc, report = _triage(run)
    f = report["findings"][0]
    assert rc == 1 and f["kind"] == "exception" and f["ranks"] == [1], report["findings"]
    assert text in f["summary"], f
    return f


def _check_nan(tmp_path, script, step):
    run, p = _run(tmp_path, script, "nan")
    rc, report = _triage(run)
    f = report["findings"][0]
    assert rc == 1 and f["kind"] == "numerics" and f["ranks"] == [1] and f["step"] == step, report["findings"]
    return f


FRAMEWORKS = {"transformers": TRAINER, "lightning": LIGHTNING, "accelerate": ACCELERATE, "no-code": PLAIN}


@pytest.fixture(params=sorted(FRAMEWORKS))
def framework(request):
    if request.param != "no-code":  # requirements/frameworks.txt: in .venv, not in the oldest-torch venv
        pytest.importorskip(request.param)
    return request.param, FRAMEWORKS[request.param]


def test_a_clean_run_has_steps_phases_and_checkpoints(tmp_path, framework):
    name, script = framework
    run = _check_clean(tmp_path, script, 20, 0 if name in ("accelerate", "no-code") else 1)  # their own numbering
    # Per rank: the framework's step numbering, the phases between its hooks, each rank's own loss.
    steps = [e for e in run_log_events(str(run), "step_end") if e["rank"] == 1]
    phases = {e["name"] for e in run_log_events(str(run), "phase") if e["rank"] == 1}
    assert {"loader_wait", "forward", "backward", "optimizer"} <= phases, phases
    # DDP's gradient all-reduce, instrumented where the framework built DDP: one per step
    # (Lightning and the Trainer accumulate 2 batches without it).
    ddp = [e for e in run_log_events(str(run), "collective") if e["op"] == "all_reduce" and e["rank"] == 1
           and e["count"] > 100]
    assert len(ddp) == 20, len(ddp)
    if name in ("transformers", "lightning"):
        assert "eval" in phases, phases
        saves = [e for e in run_log_events(str(run), "fact") if e["name"] == "checkpoint_save" and e["rank"] == 0]
        ids = {"transformers": ["checkpoint-10", "checkpoint-20"], "lightning": ["step=10", "step=20"]}[name]
        assert [s["fields"]["id"] for s in saves] == ids, saves
        assert saves[0]["fields"]["consumed_samples"] == 10 * 4 * 2 * 2, saves[0]  # steps x batch x accum x ranks
        writes = [e for e in run_log_events(str(run), "phase") if e["name"] == "checkpoint_save" and e["rank"] == 0]
        assert len(writes) == 2, writes
        # The framework's eval loss, once per evaluation (every 10 steps / at each validation), on every rank.
        evals = [e for e in run_log_events(str(run), "evaluation") if e["rank"] == 1]
        assert len(evals) == (2 if name == "transformers" else len(evals)) and evals, evals
        assert all(e["name"] == "eval" and 0 < e["loss"] < 100 for e in evals), evals
    losses = [e["loss"] for e in steps]   # each rank's own, not averaged over ranks
    assert len(losses) == 20 and all(x == x and x > 0 for x in losses), losses
    assert steps[0]["lr"] in (1e-3, 0.05), steps[0]   # the rate the step used
    assert all(e["samples"] == 8 for e in steps), steps[:3]   # 2 accumulated batches of 4, or one of 8
    if name == "transformers":
        assert all(3.0 < x < 5.0 for x in losses), losses   # ln(64) = 4.16 at the start
        assert steps[1]["lr"] < steps[0]["lr"], steps[:2]   # the linear schedule
        assert all(e["tokens"] == 128 for e in steps), steps[:3]
        scalars = [e for e in run_log_events(str(run), "step_scalars") if e["rank"] == 1]
        assert [e["step"] for e in scalars if "grad_norm" in e] == [5, 10, 15, 20], scalars


def test_no_code_finds_fsdp2_where_fully_shard_is_called(tmp_path):
    # This file runs in .venv only (the frameworks), whose pinned torch runs FSDP2 on the CPU.
    run = _check_clean(tmp_path, PLAIN_FSDP2, 20, 0)
    events = [e for e in run_log_events(str(run), "phase") if e["rank"] == 1]
    # One forward per step: the root's; the layers sharded inside it run within it.
    assert sum(1 for e in events if e["name"] == "forward") == 20, sorted({e["name"] for e in events})
    assert {"loader_wait", "forward", "backward", "optimizer"} <= {e["name"] for e in events}
    ops = collections.Counter(e["op"] for e in run_log_events(str(run), "collective") if e["rank"] == 1)
    assert ops["all_gather"] >= 20 and ops["reduce_scatter"] >= 20, ops  # FSDP2's, every step
    # Its communication overlaps compute: in flight every step, beyond what the ranks waited in it.
    summary = json.loads(subprocess.run([RANKSCOPE, "summary", "--json", str(run)], capture_output=True, text=True,
                                        check=True).stdout)
    for r in summary["ranks"]:
        assert r["median_comm_in_flight_ms"] > r["median_phase_ms"]["collective"], r
    goodput = json.loads(subprocess.run([RANKSCOPE, "goodput", "--json", str(run)], capture_output=True, text=True,
                                        check=True).stdout)
    assert goodput["overlapped_comm_seconds"] > 0, goodput


def test_a_rank_hung_in_its_data_is_named(tmp_path, framework):
    _check_hang(tmp_path, framework[1], "blocked in loader_wait")


def test_an_exception_on_one_rank_is_named(tmp_path, framework):
    _check_raise(tmp_path, framework[1], "ValueError: corrupt sample")


def test_a_nan_loss_on_one_rank_is_named(tmp_path, framework):
    # The Trainer's own log hides it (logging_nan_inf_filter, and the loss it logs is averaged
    # over ranks); each rank's own loss, read back by the callback, does not.
    _check_nan(tmp_path, framework[1], 7)


def test_rankscope_run_says_what_is_wrong_and_leaves_children_alone(tmp_path):
    usage = subprocess.run([RANKSCOPE, "run"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage: rankscope run" in usage.stderr, usage
    missing = subprocess.run([RANKSCOPE, "run", "--", str(tmp_path / "no-such-launcher")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 127 and "cannot run" in missing.stderr, missing
    # A rank is recorded; its children (DataLoader workers, subprocesses) inherit
    # RANKSCOPE_AUTO=started and are not: one run log, from the rank.
    child = "import rankscope, sys; sys.exit(3 if rankscope.initialized() else 0)"
    script = tmp_path / "rank.py"
    script.write_text("import os, subprocess, sys, rankscope\n"
                      "assert rankscope.initialized() and os.environ['RANKSCOPE_AUTO'] == 'started'\n"
                      f"sys.exit(subprocess.run([sys.executable, '-c', {child!r}]).returncode)\n")
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", RANKSCOPE_DIR=str(tmp_path / "run"))
    p = subprocess.run([RANKSCOPE, "run", "--", sys.executable, str(script)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert [os.path.basename(f) for f in glob.glob(str(tmp_path / "run" / "rank-*.jsonl"))] == ["rank-0.jsonl"]
