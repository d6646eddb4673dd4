"""rankscope.torch on real multi-process gloo runs."""
import collections
import json
import os
import textwrap
import subprocess
import sys

import pytest

from conftest import FAKE_CUDA_EVENT, RANKSCOPE, ROOT, TIME_ONLY, run_log_events
# The C++ DDP hooks share C++ types with the runtime: built only against a torch
# with the C++11 std::string ABI (PyPI wheels from 2.7); older ones use Python hooks.
CXX_HOOKS = bool(__import__("torch")._C._GLIBCXX_USE_CXX11_ABI)


def _env():
    return dict(os.environ)


def _run_script(tmp_path, code, *args):
    """Runs `code` as a script with the run directory (tmp_path/run) and `args` as its
    arguments; returns its stdout after checking that it exited 0."""
    script = tmp_path / "script.py"
    script.write_text(code)
    p = subprocess.run([sys.executable, str(script), str(tmp_path / "run"), *map(str, args)], env=_env(),
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def _whole_and_bucket_spans(colls):
    """step -> (the per-backward span, the per-bucket spans): instrument_ddp(model) and
    instrument_ddp(model, per_bucket=True) on one model. The whole one opens before DDP
    launches any bucket and ends after the last one has completed."""
    by_step = collections.defaultdict(list)
    for e in colls:
        by_step[e["step"]].append(e)
    out = {}
    for step, spans in by_step.items():
        spans.sort(key=lambda e: e["seq"])
        whole, buckets = spans[0], spans[1:]
        assert buckets, (step, spans)
        assert all(whole["mono"] <= b["mono"] and b["mono"] + b["dur"] <= whole["mono"] + whole["dur"]
                   for b in buckets), (step, spans)
        out[step] = whole, buckets
    return out


def test_ddp_example_spans_every_collective_with_bytes_and_matching_sequence_numbers(tmp_path, torchrun):
    p = torchrun(os.path.join(ROOT, "examples", "python", "train_ddp.py"), 2, "--epochs", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = str(tmp_path / p.stdout.strip().splitlines()[-1])
    t = subprocess.run([RANKSCOPE, "triage", "--json", run_dir], capture_output=True, text=True, timeout=120)
    # Healthy but for what this host's speed does to a real run: a rank or the job slower for a
    # while (a 2-core VM running 2 ranks beside other tests) is a real time-only finding, so only
    # those may be there. What those rules find is tested on synthetic logs (test_training_health.py).
    assert t.returncode in (0, 1), t.stdout[-3000:] + t.stderr[-2000:]
    findings = json.loads(t.stdout)["findings"]
    assert {f["kind"] for f in findings} <= TIME_ONLY, findings
    assert (t.returncode == 0) == (not findings), t.stdout[-3000:]
    colls = run_log_events(run_dir, "collective")
    kinds = collections.Counter((e["rank"], e["op"], e["count"], e["dtype"], e["bytes"]) for e in colls)
    # 2048 samples / 2 ranks / batch 64 = 16 steps per epoch, one DDP bucket (101386 float32 parameters) each.
    assert kinds[(0, "all_reduce", 101386, "float32", 405544)] == 32
    assert kinds[(1, "all_reduce", 101386, "float32", 405544)] == 32
    assert kinds[(0, "all_reduce", 1, "float32", 4)] == 4  # explicit, sync and async (measured via wait())
    assert kinds[(1, "barrier", 0, "unknown", 0)] == 1
    by_seq = collections.defaultdict(dict)
    for e in colls:
        by_seq[(e["comm"], e["seq"])][e["rank"]] = e["fingerprint"]
    assert len(by_seq) == 37
    assert all(len(v) == 2 and len(set(v.values())) == 1 for v in by_seq.values())
    assert sorted(s for c, s in by_seq) == list(range(1, 38))
    phases = collections.Counter(e["name"] for e in run_log_events(run_dir, "phase") if e["rank"] == 0)
    assert phases["loader_wait"] >= 32 and phases["forward"] == 32 and phases["eval_sync"] == 2
    # The rank's wait for DDP's all-reduce at the end of backward: on the all-reduce's line, not
    # a phase line of its own (schema 3); the summary counts it as collective time, not backward.
    # (The Python fallback, where the C++ part is not built, is a comm hook: no wait of its own.)
    import rankscope.torch as rst
    ddp = [e for e in colls if e["count"] == 101386]
    waited = [e for e in ddp if "wait" in e]
    if rst._torch_hooks is not None:
        assert phases["ddp_all_reduce_wait"] == 0
        assert len(waited) >= 60 and all(e["wait_phase"] == "ddp_all_reduce_wait" for e in waited), ddp[:2]
        assert all(0 <= e["wait"] <= e["dur"] and e["phase"] == "backward" for e in waited)
    else:
        assert not waited  # the comm-hook span (no wait phase)
    s = subprocess.run([RANKSCOPE, "summary", "--json", run_dir], capture_output=True, text=True, timeout=60)
    assert s.returncode == 0, s.stderr
    for r in json.loads(s.stdout)["ranks"]:  # the fallback's all-reduce is inside backward: not counted apart
        assert r["median_phase_ms"]["collective"] > 0 or rst._torch_hooks is None, r
    facts = collections.Counter(e["name"] for e in run_log_events(run_dir, "fact") if e["rank"] == 1)
    assert facts["sampler"] == 2 and facts["epoch_batches"] == 2 and facts["batch_math"] == 1
    assert not run_log_events(run_dir, "violation")


CHECK = r"""
import os, sys, torch, torch.distributed as dist
import rankscope, rankscope.torch as rst

def run(run_dir, mode):
    rank = int(os.environ["RANK"])            # torchrun's
    rankscope.init(run_dir=run_dir)
    dist.init_process_group("gloo")
    # Only `absent` is about the timeout (rank 2 never arrives); elsewhere a rank slower to get here
    # on a busy host must not be taken for an absent one.
    rst.use_torch_exchange(timeout_s=5 if mode == "absent" else 300)
    if mode == "absent" and rank != 2:
        dist.barrier(group=dist.new_group([0, 1]))  # ranks 0 and 1 ask at once: only rank 2 is missing
    elif mode == "absent":
        dist.new_group([0, 1])                      # every rank takes part in making a group
    if mode == "seed":
        rankscope.check_sampler(seed=99 if rank == 1 else 7, epoch=0, fingerprint=rank + 1, num_indices=10)
    elif mode == "absent" and rank != 2:
        try:
            rankscope.check_sampler(seed=7, epoch=0, fingerprint=rank + 1, num_indices=10, fail=True)
        except rankscope.InvariantViolation as e:
            os.write(1, f"rank {rank} raised: {e}\n".encode())  # one write: ranks share the pipe
    elif mode == "groups":
        rst.instrument()
        g1, g2 = dist.new_group([0, 1, 2]), dist.new_group([0, 1, 2])
        # Ranks first use the groups in different orders (async, so nobody waits on the other group).
        order = [(g1, torch.ones(3)), (g2, torch.ones(5))]
        if rank == 1:
            order.reverse()
        for w in [dist.all_reduce(t, group=g, async_op=True) for g, t in order]:
            w.wait()
        rst.uninstrument()
    elif mode == "rounds":
        store = dist.distributed_c10d._get_default_store()
        before = store.num_keys()  # before the barrier: after it, other ranks may already post round 0
        dist.barrier()
        for epoch in range(6):
            rankscope.check_sampler(seed=7, epoch=epoch, fingerprint=rank + 1, num_indices=10)
        dist.barrier()
        if rank == 0:
            os.write(1, f"keys added {store.num_keys() - before}\n".encode())
    dist.barrier()
    dist.destroy_process_group()
    rankscope.shutdown()

if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2])
"""


def _run_check(tmp_path, torchrun, mode, endpoint=None):
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    run_dir = tmp_path / mode
    p = torchrun(script, 3, run_dir, mode, endpoint=endpoint, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p, str(run_dir)


def test_torch_exchange_names_the_rank_with_another_seed(tmp_path, torchrun):
    _, run_dir = _run_check(tmp_path, torchrun, "seed")
    v = run_log_events(run_dir, "violation")
    assert v and all(x["check"] == "sampler" and x["ranks"] == [1] for x in v)
    assert v[0]["values"]["seed"] == {"7": [0, 2], "99": [1]}
    assert {x["rank"] for x in v} == {0, 1, 2}  # every rank saw it


def test_torch_exchange_reports_a_rank_that_never_arrives_instead_of_hanging(tmp_path, torchrun):
    p, run_dir = _run_check(tmp_path, torchrun, "absent", endpoint=True)  # an explicit rendezvous endpoint
    assert "rank 0 raised: exchange 'sampler/0' timed out after 5000 ms: rank 2 did not arrive" in p.stdout
    assert "rank 1 raised:" in p.stdout
    v = run_log_events(run_dir, "violation")
    assert {x["what"] for x in v} == {"exchange_timeout"} and all(x["ranks"] == [2] for x in v)


def test_a_group_has_the_same_communicator_name_on_every_rank_whatever_order_ranks_first_use_it(tmp_path, torchrun):
    _, run_dir = _run_check(tmp_path, torchrun, "groups")
    names = {}
    for c in run_log_events(run_dir, "collective"):
        names.setdefault(c["count"], set()).add((c["comm"], c["seq"]))
    assert names[3] == {("pg1", 1)} and names[5] == {("pg2", 1)}  # torch's group names, on all 3 ranks
    t = subprocess.run([RANKSCOPE, "triage", run_dir], env=_env(), capture_output=True,
                       text=True, timeout=60)
    assert "mismatch" not in t.stdout, t.stdout


def test_torch_exchange_keeps_only_the_last_two_rounds_in_the_store(tmp_path, torchrun):
    p, run_dir = _run_check(tmp_path, torchrun, "rounds")
    # 6 rounds x 3 ranks x (payload + arrival counter) = 36 keys without cleanup;
    # each rank deletes its keys of round n-2 when it posts round n.
    assert "keys added 12" in p.stdout, p.stdout
    assert not run_log_events(run_dir, "violation")


DDP_MODES = r"""
import copy, json, os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
import rankscope, rankscope.torch as rst

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
rankscope.init(rank=0, world_size=1, run_dir=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU())
        self.head = torch.nn.Linear(1024, 256)
    def forward(self, x):  # (hidden, logits): the loss comes from the second output, a view of the
        h = self.body(x)   # last layer's, which runs in a reentrant checkpoint (a nested backward)
        return h, checkpoint(self.head, h, use_reentrant=True).view(8, 256)
# ~4 MB of float32 gradients in 1 MB buckets: several buckets per backward.
model = DDP(Net(), bucket_cap_mb=1)
cpp = sys.argv[3] == "torch" and rst._torch_hooks is not None  # not built against an old-ABI torch
if not cpp:
    rst._torch_hooks = None                 # the fallback used when the C++ extension is not built
rst.instrument_ddp(model)                   # one span per backward, ended after DDP's sync
rst.instrument_ddp(model)                   # again: nothing more
rst.instrument_ddp(model, per_bucket=True)  # and one per bucket, from a comm hook
rst.instrument_ddp(model, per_bucket=True)
x = torch.randn(8, 256)
for step in range(3):
    out = model(x)
    if cpp and step == 1:                   # a gradient penalty through the output first: no span
        torch.autograd.grad(out[0].sum(), list(model.module.body.parameters()), retain_graph=True)
    if cpp and step == 2:                   # in place on the output view: its grad_fn is replaced
        out[1].mul_(0.5)
    out[1].sum().backward()
    rankscope.step(step)
with model.no_sync():                       # no gradient sync: no span
    model(x)[1].sum().backward()
with model.no_sync():                       # DDP decides at forward: backward outside, still none
    y = model(x)[1]
y.sum().backward()
model.module(x)[1].sum().backward()         # around DDP: none
model.require_backward_grad_sync = False    # no_sync() by hand: none
model(x)[1].sum().backward()
model.require_backward_grad_sync = True
try:
    model(torch.randn(8, 7))                # a forward that raises prepares nothing: none
except RuntimeError:
    pass
model.module(x)[1].sum().backward()
rankscope.set_enabled(False)                # disabled: no span either
model(x)[1].sum().backward()
rankscope.set_enabled(True)
clone = copy.deepcopy(model)                # a copy works and is not instrumented
clone(x)[1].sum().backward()
if cpp:                                     # the checkpointed head got its gradients in a nested backward
    assert rst._ddp_syncs[model].times_parked == 3, rst._ddp_syncs[model].times_parked
print(sum(p.numel() for p in model.parameters()), "torch hooks" if rst._torch_hooks else "python hooks")
rankscope.shutdown()
"""


@pytest.mark.parametrize("hooks", ["torch", "python"])
def test_ddp_sync_span_covers_every_bucket_and_only_backwards_that_all_reduce(tmp_path, hooks, port):
    out = _run_script(tmp_path, DDP_MODES, port, hooks)
    run_dir = tmp_path / "run"
    total, how = out.split()[0], out.split(maxsplit=1)[1].strip()
    assert how == (f"{hooks} hooks" if CXX_HOOKS else "python hooks")  # the C++ part is built where it can be
    colls = run_log_events(str(run_dir), "collective")
    assert all(e["op"] == "all_reduce" and e["dtype"] == "float32" and e["comm"] == "world" for e in colls)
    assert sorted(e["seq"] for e in colls) == list(range(1, len(colls) + 1))
    by_step = _whole_and_bucket_spans(colls)
    assert sorted(by_step) == [0, 1, 2]  # none of the step-3 backwards all-reduced (or was recorded)
    for whole, buckets in by_step.values():
        assert whole["count"] == int(total) and sum(b["count"] for b in buckets) == int(total)


DDP_NARROWED = r"""
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import rankscope, rankscope.torch as rst

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
rankscope.init(rank=0, world_size=1, run_dir=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
# 16 parameters, 2.1 MB of gradients in 0.5 MB buckets: several buckets per backward.
model = DDP(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]), bucket_cap_mb=0.5,
            find_unused_parameters=sys.argv[3] == "find_unused")
rst.instrument_ddp(model)                   # one span per backward
rst.instrument_ddp(model, per_bucket=True)  # and one per bucket, to check it against
x = torch.randn(4, 256)
for step in range(6):
    model(x).sum().backward()
    sync = rst._ddp_syncs.get(model)       # none where the Python hooks stand in (no C++ part)
    print(sync.hooked if sync is not None else 0, end=" ")
    rankscope.step(step)
rankscope.shutdown()
"""


@pytest.mark.parametrize("mode", ["default", "find_unused"])
def test_ddp_hooks_narrow_to_one_per_bucket_and_the_span_still_covers_every_bucket(tmp_path, mode, port):
    hooked = [int(n) for n in _run_script(tmp_path, DDP_NARROWED, port, mode).split()]
    by_step = _whole_and_bucket_spans(run_log_events(str(tmp_path / "run"), "collective"))  # each still covers every bucket
    assert sorted(by_step) == list(range(6))
    # Every accumulator until DDP has rebuilt its buckets (in the second forward), then
    # each bucket's first; with find_unused_parameters a bucket can launch from another
    # parameter's hook (DDP marks the unused ready there), so every one stays hooked.
    rebuilt = len(by_step[5][1])  # buckets per backward by then (DDP's first iteration may use one)
    assert rebuilt > 1
    if not CXX_HOOKS:  # a torch without the C++ part: the Python hooks make the same spans, checked above
        assert hooked == [0] * 6, hooked
        return
    assert hooked == ([16] + [rebuilt] * 5 if mode == "default" else [16] * 6), hooked


ABORTED_BACKWARD = r"""
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import rankscope, rankscope.torch as rst

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
rankscope.init(rank=0, world_size=1, run_dir=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
class Boom(torch.autograd.Function):                 # fails in the middle of backward
    @staticmethod
    def forward(ctx, x):
        return x.clone()
    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("boom")
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    def forward(self, x, boom=False):                 # b's gradients first, then Boom raises
        h = self.a(x)
        return self.b(Boom.apply(h) if boom else h)
x = torch.randn(2, 4)
model = DDP(Net())
rst.instrument_ddp(model)
assert rst._ddp_syncs[model].hooked == 4              # one hook per parameter, none on the module
assert not model._forward_hooks
model(x).sum().backward()                             # a span, ended ok
try:
    model(x, boom=True).sum().backward()              # the span opens, backward fails
except RuntimeError:
    pass
model = DDP(Net())                                    # (DDP itself cannot go on after a failed backward)
rst.instrument_ddp(model)
import gc; gc.collect()
assert len(rst._ddp_syncs) == 1                       # the first model's hooks went with it
model(x).sum().backward()                             # a fresh span, ended ok
y = model(x).sum()
y.backward(retain_graph=True)                         # a span
y.backward()                                          # the same forward again: none
with model.no_sync():
    model(x).sum().backward()                         # no_sync: none
comm = rst._communicator(model.process_group)
print(comm.issued, comm.completed)
odd = torch.nn.Linear(4, 4)                          # no reducer the C++ hooks can read: the Python hooks
odd.reducer, odd.process_group = object(), model.process_group
rst.instrument_ddp(odd)
assert odd not in rst._ddp_syncs and len(odd._forward_hooks) == 1

# The Python fallback and spans ended by nothing: failed, never left "issued".
lin2 = torch.nn.Linear(4, 4)
lin2.require_forward_param_sync = True
x.requires_grad_()                                    # so that Boom's backward runs
py_comm = rankscope.communicator("fallback", 1, 0)
rst._instrument_ddp_python(lin2, py_comm, 20, "float32")
lin2(x).sum().backward()
try:
    lin2(Boom.apply(x)).sum().backward()
except RuntimeError:
    pass
y = lin2(x).sum()
y.backward(retain_graph=True)
y.backward()                                          # once per forward here too
lost = rankscope._rankscope.collective(py_comm, "broadcast", 3)
del lost
print(py_comm.issued, py_comm.completed)
rankscope.shutdown()
"""


def test_aborted_backward_ends_its_span_as_failed_and_the_next_one_opens(tmp_path, port):
    if not CXX_HOOKS:  # then the C++ part must be absent, and say why, once
        p = subprocess.run([sys.executable, "-c", "import rankscope.torch as rst; assert rst._torch_hooks is None"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and p.stderr.count("using Python hooks for DDP") == 1, p.stderr
        assert "pre-C++11 std::string ABI" in p.stderr, p.stderr
        return
    assert _run_script(tmp_path, ABORTED_BACKWARD, port).split() == ["4", "4", "4", "4"]
    colls = run_log_events(str(tmp_path / "run"), "collective")
    assert [(e["seq"], e["result"], e["count"]) for e in colls if e["comm"] == "world"] == [
        (1, "ok", 40), (2, "failed", 40), (3, "ok", 40), (4, "ok", 40)]
    assert [(e["seq"], e["op"], e["result"]) for e in colls if e["comm"] == "fallback"] == [
        (1, "all_reduce", "ok"), (2, "all_reduce", "failed"), (3, "all_reduce", "ok"), (4, "broadcast", "failed")]
    warned = [e for e in run_log_events(str(tmp_path / "run"), "log") if "C++ DDP hooks unavailable" in e["msg"]]
    assert len(warned) == 1 and warned[0]["level"] == "warn", warned


DROPPED_HANDLE = r"""
import gc, os, sys, torch, torch.distributed as dist
import rankscope, rankscope.torch as rst

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
rankscope.init(rank=0, world_size=1, run_dir=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
rst.instrument()
t = torch.ones(1000)
dist.all_reduce(t, async_op=True)              # fire and forget: the handle is dropped at once
gc.collect()
dist.all_reduce(t, async_op=True).wait()       # waited
dist.barrier()
rankscope.shutdown()
"""


def test_an_async_handle_dropped_without_wait_ends_its_span_ok(tmp_path, port):
    _run_script(tmp_path, DROPPED_HANDLE, port)
    colls = run_log_events(str(tmp_path / "run"), "collective")
    assert sorted((e["seq"], e["op"], e["result"]) for e in colls) == [
        (1, "all_reduce", "ok"), (2, "all_reduce", "ok"), (3, "barrier", "ok")]


def test_backend_warnings_say_what_an_nccl_job_would_not_be_told():
    import rankscope.torch as rst
    quiet = {"NCCL_DEBUG": "WARN"}
    assert rst._backend_warnings("gloo", {}) == []                      # not NCCL: nothing to say
    assert rst._backend_warnings("nccl", quiet) == []
    said = rst._backend_warnings("cpu:gloo,cuda:nccl", {})
    assert [f["variable"] for _, f in said] == ["NCCL_DEBUG"]
    assert said[0][0].startswith("NCCL_DEBUG is not set: NCCL's own warnings")
    said = rst._backend_warnings("nccl", dict(quiet, TORCH_NCCL_ASYNC_ERROR_HANDLING="0"))
    assert [f["variable"] for _, f in said] == ["TORCH_NCCL_ASYNC_ERROR_HANDLING"]
    assert "leaves this rank hanging instead of ending it" in said[0][0]
    assert rst._backend_warnings("nccl", dict(quiet, NCCL_ASYNC_ERROR_HANDLING="0"))[0][1] == {
        "variable": "NCCL_ASYNC_ERROR_HANDLING"}
    assert rst._backend_warnings("nccl", dict(quiet, TORCH_NCCL_ASYNC_ERROR_HANDLING="3")) == []


BACKEND_WARNINGS = r"""
import os, sys, torch, torch.distributed as dist
import rankscope, rankscope.torch as rst

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], TORCH_NCCL_ASYNC_ERROR_HANDLING="0")
os.environ.pop("NCCL_DEBUG", None)
rankscope.init(rank=0, world_size=1, run_dir=sys.argv[1])
# No NCCL without a GPU: the job's backend, as torch would name a GPU job's, is all that differs.
dist.get_backend = lambda group=None: "cpu:gloo,cuda:nccl"
dist.init_process_group("gloo", rank=0, world_size=1)    # wrapped by rankscope: checks once here
rst.instrument()                                          # and not again here
rankscope.shutdown()
"""


def test_an_nccl_job_is_told_once_on_rank_0_what_its_environment_hides(tmp_path, port):
    _run_script(tmp_path, BACKEND_WARNINGS, port)
    warned = [e for e in run_log_events(str(tmp_path / "run"), "log") if e["level"] == "warn"]
    assert [e["fields"]["variable"] for e in warned] == ["NCCL_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING"], warned


def test_torch_compile_compilations_are_phases_and_a_recompilation_is_said(run_py, tmp_path):
    # Instrumented before TorchDynamo is loaded (the usual order): registered at torch.compile.
    p = run_py("""
        import os, sys, torch, rankscope, rankscope.torch as rst
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        rst.instrument()
        assert "torch._dynamo" not in sys.modules               # instrument() did not import it
        f = torch.compile(lambda x: torch.relu(x) * 2, backend="eager", dynamic=False)
        rankscope.step(0)                                       # step(n) ends n and begins n + 1
        f(torch.ones(4))                                        # step 1 compiles: frame 0, compilation 0/0
        rankscope.step(1)
        f(torch.ones(4))                                        # step 2: cached...
        f(torch.ones(7))                                        # ... then a new shape: recompiled, 0/1
        rankscope.step(2)
        rst.uninstrument()
        f(torch.ones(9))                                        # not recorded any more
        rankscope.shutdown()
    """)
    compiles = [e for e in run_log_events(str(tmp_path / "run"), "phase") if e["name"] == "compile"]
    assert [e["step"] for e in compiles] == [1, 2], compiles    # the first compilation and the recompilation
    from torch._dynamo import callback
    if not hasattr(callback, "CallbackArgs"):  # torch before 2.8 gives its callbacks no compile id
        return
    recompiles = [e["value"] for e in run_log_events(str(tmp_path / "run"), "metric")
                  if e["name"] == "rankscope_torch_recompilations_total"]
    assert recompiles and recompiles[-1] == 1, recompiles
    said = [e for e in run_log_events(str(tmp_path / "run"), "log") if "recompiled" in e["msg"]]
    assert [(e["step"], e["fields"]["compile_id"]) for e in said] == [(2, "0/1")], said
    assert said[0]["msg"].startswith("torch.compile recompiled frame 0 (compilation 2 of it): a guard failed")


def test_record_cuda_memory_asks_torch_for_cuda_once_and_sets_each_devices_gauges(run_py):
    # No GPU here: torch.cuda's four calls are replaced by counting fakes of the same shape.
    p = run_py("""
        import os, torch, rankscope, rankscope.torch as rst
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        asked = []
        real = torch.cuda.is_available
        torch.cuda.is_available = lambda: asked.append(1) or real()
        assert rst.record_cuda_memory() is False and rst.record_cuda_memory() is False
        assert len(asked) == 1, asked                        # asked once per process, not per step
        rst._cuda_present = None
        torch.cuda.is_available = lambda: True
        torch.cuda.current_device = lambda: 1
        mem = {1: (100, 300), 2: (7, 9)}
        torch.cuda.memory_allocated = lambda d: mem[d][0]
        torch.cuda.memory_reserved = lambda d: mem[d][1]
        assert rst.record_cuda_memory() is True
        mem[1] = (150, 400)
        assert rst.record_cuda_memory() is True and rst.record_cuda_memory(2) is True
        g = lambda name, d: rankscope.gauge(name, "", {"gpu": d}).value
        print(g("rankscope_cuda_memory_allocated_bytes", "1"), g("rankscope_cuda_memory_reserved_bytes", "1"),
              g("rankscope_cuda_memory_allocated_bytes", "2"), g("rankscope_cuda_memory_reserved_bytes", "2"))
        rankscope.shutdown()
    """)
    assert p.stdout.split() == ["150.0", "400.0", "7.0", "9.0"], p.stdout + p.stderr


def test_amp_skips_counts_the_steps_gradscaler_skipped_without_asking_for_the_scale(run_py, tmp_path):
    # A real GradScaler on the CPU (torch 2.3+), inf gradients at 11 of 20 steps, 9 in a row:
    # a skip storm. get_scale() would wait for the GPU on CUDA: it must never be called.
    p = run_py(FAKE_CUDA_EVENT + textwrap.dedent("""
        import os, torch, rankscope, rankscope.torch as rst
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)
        def no_sync():
            raise AssertionError("get_scale() syncs with the device")
        scaler.get_scale = no_sync
        amp = rst.AmpSkips(scaler)
        for step in range(20):
            opt.zero_grad()
            bad = step in (2, 5) or 8 <= step <= 16
            loss = model(torch.randn(2, 4)).sum() * (float("inf") if bad else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            assert amp.update() is None
            rankscope.step(step)                           # ends skipped=True after each skip
        off = rst.AmpSkips(torch.amp.GradScaler("cpu", enabled=False))
        off.update()
        print(amp.skipped, off.skipped)

        # A CUDA step's result is counted once its copy has landed (the event's query()), in
        # order; past 64 pending the oldest is waited for. Event: torch.cuda.Event's shape.
        amp2 = rst.AmpSkips(scaler)
        events = [Event() for _ in range(3)]
        for flag, ev in zip((True, False, True), events):
            amp2._readback._queue([torch.tensor(flag)], [ev], None)
        assert amp2.skipped == 0
        events[0].landed = events[2].landed = True
        amp2._readback._queue([torch.tensor(False)], [Event()], None)
        assert amp2.skipped == 1                           # the first; the third waits behind the second
        events[1].landed = True
        amp2._readback._queue([torch.tensor(False)], [Event()], None)
        assert amp2.skipped == 2
        for _ in range(70):
            amp2._readback._queue([torch.tensor(True)], [Event()], None)  # never landing by itself
        # 2 + 70 pending, 8 waited for: the two False ones, then six True: 2 + 6
        assert len(amp2._readback) == 64 and amp2.skipped == 8, amp2.skipped
        rankscope.shutdown()
    """))
    assert p.stdout.split() == ["11", "0"], p.stdout + p.stderr
    run = str(tmp_path / "run")
    counted = [e["value"] for e in run_log_events(run, "metric") if e["name"] == "rankscope_amp_skipped_steps_total"]
    assert counted and counted[-1] == 11 + 8, counted  # the exported counter: both AmpSkips'
    skipped = [e["step"] for e in run_log_events(run, "step_end") if e.get("skipped")]
    assert skipped == [2, 5] + list(range(8, 17)), skipped
    storms = [e for e in run_log_events(run, "numerics") if e["what"] == "skip_storm"]
    assert len(storms) == 1 and 8 <= storms[0]["step"] <= 16, storms


def test_timed_loader_times_each_next_counts_each_batch_and_passes_the_loaders_errors_on(run_py, tmp_path):
    # The iterator is in C: each next() a loader_wait phase, each batch counted by the
    # BatchAccounting at its position in the epoch; a loader's exception reaches the loop.
    p = run_py("""
        import os, time, torch, rankscope, rankscope.torch as rst
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        def slow(n, fail_at=None):
            for i in range(n):
                time.sleep(0.002)
                if i == fail_at:
                    raise OSError("shard 3 unreadable")
                yield torch.full((2,), float(i))
        acc = rankscope.BatchAccounting(dataset_size=64, micro_batch=16, data_parallel=1, fail=True)
        acc.start_epoch(0)
        got = [float(b[0]) for b in rst.timed_loader(slow(4), accounting=acc)]
        acc.end_epoch()                                    # all 4 counted at 0..3: no violation
        print("epoch 0", got)
        acc.start_epoch(1)
        it = rst.timed_loader(slow(4, fail_at=2), accounting=acc)
        print("iter is self", iter(it) is it)
        try:
            for b in it:
                pass
        except OSError as e:
            print("raised:", e)
        print("after the error", list(it))                 # finished, like a generator
        try:
            acc.end_epoch()                                # 2 of 4 batches: the accounting saw exactly those
        except rankscope.InvariantViolation as e:
            print("violation:", e)
        for bad in (lambda: list(rst.timed_loader(5)), lambda: rst.timed_loader([1], accounting="acc")):
            try:
                bad()
            except TypeError:
                print("TypeError")
        print(list(rst.timed_loader(iter([1, 2]))))       # any iterable, no accounting
        acc.start_epoch(2, resume_at=3)                    # a resumed epoch, but the loader starts over
        it = rst.timed_loader(slow(4), accounting=acc)
        try:
            next(it)
        except rankscope.InvariantViolation as e:
            print("violation:", str(e).split(" at step")[0])
        print("after the violation", list(it))             # ended there, like the generator
        class Counting:                                    # any object with on_batch(index)
            def __init__(self):
                self.seen = []
            def on_batch(self, i):
                self.seen.append(i)
        c = Counting()
        src = [10, 20, 30]
        it = rst.timed_loader(src, accounting=c)
        src.append(40)                                     # iter() of the loader at the first next()
        print("duck", [next(it), next(it)], c.seen)
        it.close()
        print("closed", list(it))
        rankscope.shutdown()
    """)
    out = p.stdout
    assert "epoch 0 [0.0, 1.0, 2.0, 3.0]" in out, out + p.stderr
    assert "iter is self True" in out and "raised: shard 3 unreadable" in out and "after the error []" in out
    assert "violation: epoch_batches: rank 0 consumed 2 batches in epoch 1, expected 4" in out, out
    assert out.count("TypeError") == 2 and "[1, 2]" in out
    assert "violation: epoch_batches: rank 0 repeated batch 0 of epoch 2 (expected batch 3)" in out, out
    assert "after the violation []" in out and "duck [10, 20] [0, 1]" in out and "closed []" in out, out
    waits = [e for e in run_log_events(str(tmp_path / "run"), "phase") if e["name"] == "loader_wait"]
    # 4 + 1 (the end) in epoch 0, 3 (the third raised) in epoch 1, 3 for [1, 2], 1 in epoch 2, 2 duck-counted
    assert len(waits) == 5 + 3 + 3 + 1 + 2, waits
    assert all(w["phase_kind"] == "loader_wait" for w in waits)
    # The next() calls that ran slow()'s 2 ms sleep: epoch 0's four batches, epoch 1's two and the one
    # that raised, epoch 2's one. Each lasted at least the sleep (how much longer: the machine's business).
    slept = [0, 1, 2, 3, 5, 6, 7, 11]
    assert [waits[i]["dur"] >= 2_000_000 for i in slept] == [True] * len(slept), waits
