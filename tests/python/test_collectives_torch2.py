"""What modern training issues, on 2 real gloo ranks under torchrun: torch.distributed's
tensor and coalesced collectives, functional collectives and a DTensor op, FSDP2
(fully_shard), and torch.compile'd code (collectives inside the graph, a compiled DDP
model). Every collective is a span whose per-communicator sequence numbers and
fingerprints agree across the ranks."""
import collections
import os

import torch
from conftest import run_log_events

TORCH = tuple(int(v) for v in torch.__version__.split(".")[:2])

SCRIPT = r"""
import json, os, sys, time, torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
import rankscope, rankscope.torch as rst

rankscope.init(run_dir=sys.argv[1])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rst.instrument()
torch.manual_seed(0)

with rankscope.phase("tensor_ops"):
    out = torch.empty(8)
    dist.all_gather_into_tensor(out, torch.ones(4))
    rs = torch.empty(2)
    dist.reduce_scatter_tensor(rs, torch.ones(4))
    dist.all_reduce_coalesced([torch.ones(3), torch.ones(5)])
    peer = 1 - rank
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(6), peer),
                                   dist.P2POp(dist.irecv, torch.empty(6), peer)])
    for r in reqs:
        r.wait()
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(torch.ones(2))
        dist.all_reduce(torch.ones(2))
    cm.wait()

# FSDP's pattern: an async all-gather waited on inside forward. Rank 1 is late, so rank 0's
# wait() blocks: that time is a nested all_gather_wait phase of the collective kind. Late by
# construction, not by a sleep: rank 1 joins once rank 0's heartbeat shows it blocked in wait().
def blocked_in(run_dir, peer, name, guard_s=300):
    path = os.path.join(run_dir, f"rank-{peer}.heartbeat.json")   # replaced whole (rename)
    deadline = time.monotonic() + guard_s
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                if any(p["name"] == name for p in json.load(f).get("open_phases", [])):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"rank {peer} never showed {name} in its heartbeat")

with rankscope.phase("forward"):
    if rank == 1:
        blocked_in(sys.argv[1], 0, "all_gather_wait")
    out = torch.empty(2 * world)
    dist.all_gather_into_tensor(out, torch.ones(2), async_op=True).wait()

with rankscope.phase("functional"):
    x = funcol.all_reduce(torch.ones(3), "sum", dist.group.WORLD)
    x = x.wait() if hasattr(x, "wait") else x
    mesh = init_device_mesh("cpu", (world,))
    dt = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
    full = dt.redistribute(mesh, [Replicate()]).to_local()   # a DTensor op: an all-gather
    assert full.tolist() == list(range(8))

# FSDP2 runs on CPU from torch 2.7 (2.6's CPU stream has no record_event).
if tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 7):
  with rankscope.phase("fsdp2"):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        with rankscope.phase("forward"):   # its all-gathers' waits are communication, not forward
            loss = model(torch.randn(8, 16)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()

with rankscope.phase("compiled"):
    @torch.compile(backend="aot_eager")
    def scaled_sum(a):
        b = a * 2
        dist.all_reduce(b)                   # traced into a functional collective
        return b + 1
    assert scaled_sum(torch.ones(4)).tolist() == [2 * world + 1] * 4
    ddp = DDP(torch.nn.Linear(8, 8))
    rst.instrument_ddp(ddp)
    cmodel = torch.compile(ddp, backend="aot_eager")
    for _ in range(2):
        cmodel(torch.randn(4, 8)).sum().backward()

dist.barrier()
rst.uninstrument()
dist.destroy_process_group()
rankscope.shutdown()
"""


def _collectives(run_dir):
    return run_log_events(run_dir, "collective")


def test_modern_collectives_are_spans_that_agree_across_ranks(tmp_path, torchrun):
    script = tmp_path / "modern.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    p = torchrun(script, 2, run_dir, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    colls = _collectives(str(run_dir))
    by_phase = collections.defaultdict(collections.Counter)
    for e in colls:
        if e["rank"] == 0:
            by_phase[e.get("phase", "")][e["op"]] += 1
    tensor_ops = by_phase["tensor_ops"]
    assert tensor_ops["all_gather"] == 1 and tensor_ops["reduce_scatter"] == 1, tensor_ops
    assert tensor_ops["all_reduce"] == 3 and tensor_ops["other"] == 1, tensor_ops  # coalesced x1, manager x2; p2p batch
    assert by_phase["functional"]["all_reduce"] == 1 and by_phase["functional"]["all_gather"] >= 1, by_phase
    fsdp = by_phase["fsdp2"] + by_phase["forward"] - collections.Counter(all_gather=1)  # less the late one
    waits = [e for e in run_log_events(str(run_dir), "phase") if e["rank"] == 0 and e["name"].endswith("_wait")]
    late = [e for e in waits if e["name"] == "all_gather_wait" and e.get("parent") == "forward"]
    # A wait phase is written only for a wait() that found the work unfinished: rank 0 blocked.
    assert late and late[0]["phase_kind"] == "collective" and late[0]["dur"] > 0, waits
    assert any(e["name"] == "all_reduce_wait" and e.get("parent") == "functional" for e in waits), waits
    if TORCH < (2, 7):
        assert not fsdp  # FSDP2 is not run on CPU there (see the script)
    else:
        # 2 steps of 2 sharded layers (the root holds no parameters of its own): an
        # all-gather per layer in forward and again in backward (resharded after
        # forward), a reduce-scatter per layer in backward.
        assert fsdp["all_gather"] == 2 * 2 * 2 and fsdp["reduce_scatter"] == 2 * 2, fsdp
    compiled = by_phase["compiled"]
    assert compiled["all_reduce"] >= 1 + 2, compiled  # the compiled function's, and DDP's per backward
    # The same sequence on both ranks: per communicator, sequence numbers 1..n, one fingerprint each.
    by_seq = collections.defaultdict(dict)
    for e in colls:
        by_seq[(e["comm"], e["seq"])][e["rank"]] = e["fingerprint"]
    assert all(len(v) == 2 and len(set(v.values())) == 1 for v in by_seq.values()), \
        [k for k, v in by_seq.items() if len(v) != 2 or len(set(v.values())) != 1]
    for comm in {c for c, _ in by_seq}:
        seqs = sorted(s for c, s in by_seq if c == comm)
        assert seqs == list(range(1, len(seqs) + 1)), (comm, seqs)
    assert all(e["result"] == "ok" for e in colls)
