"""What instrumenting DDP's gradient all-reduce costs per training step.

    .venv/bin/python benchmarks/python/bench_ddp.py [--quick]   (after pip install --no-build-isolation .)

One process, world size 1 over gloo, a small MLP (32-128-4: with the example's 128-256-256-10
the two plain copies already differ by 8-15 us per step, which hides what this measures). Each variant is its own
DDP model; rounds of 10 forward+backward steps rotate through them in the same process,
(in reverse order every other round) so machine noise hits all alike; the median step
time of each is printed next to plain DDP's. A second plain copy shows the noise floor.
Then one model with and without instrument_ddp's C++ hooks, alternating (no per-model noise),
and a 200-parameter model the same way, its hooks narrowed to one per bucket or not.
"""
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import rankscope
import rankscope.torch as rst
from bench_util import one_rank_gloo, print_medians

ROUNDS = 60 if "--quick" in sys.argv else 600


def model():
    torch.manual_seed(0)
    return DDP(torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)))


def main():
    one_rank_gloo("bench-ddp", 29700)
    variants = {"plain DDP": model(), "plain DDP, a second copy (noise floor)": model()}
    variants["instrument_ddp(model)"] = m = model()
    rst.instrument_ddp(m)
    variants["instrument_ddp(model), rankscope disabled"] = m
    hooks, rst._torch_hooks = rst._torch_hooks, None  # the fallback without the C++ extension
    variants["... without the C++ extension"] = m = model()
    rst.instrument_ddp(m)
    rst._torch_hooks = hooks
    variants["instrument_ddp(model, per_bucket=True)"] = m = model()
    rst.instrument_ddp(m, per_bucket=True)
    variants["torch's Python allreduce_hook (no rankscope)"] = m = model()
    m.register_comm_hook(None, default_hooks.allreduce_hook)

    x = torch.randn(64, 32)
    y = x[:, :4].argmax(1)
    times = {k: [] for k in variants}
    for r in range(ROUNDS):
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            m = variants[name]
            rankscope.set_enabled("disabled" not in name)
            t0 = time.perf_counter()
            for _ in range(10):
                torch.nn.functional.cross_entropy(m(x), y).backward()
            times[name].append((time.perf_counter() - t0) / 10)
        rankscope.set_enabled(True)
        if r % 50 == 0:
            rankscope.flush()
    print_medians(times, "plain DDP", 48)
    same_model_hooked_and_not()
    many_parameters()
    dist.destroy_process_group()
    rankscope.shutdown()


def step(m, opt, x, y):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(m(x), y).backward()
    opt.step()


def same_model_hooked_and_not():
    """The C++ hooks' own cost without the per-model noise of the table above: one model
    (the example's 128-256-256-10 MLP, with an optimizer step), its hooks made and dropped
    between rounds of 10 steps, alternating."""
    if rst._torch_hooks is None:
        return
    torch.manual_seed(0)
    m = DDP(torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10)))
    comm = rst._communicator(m.process_group)
    count = sum(p.numel() for p in m.parameters())
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(64, 128)
    y = x[:, :10].argmax(1)
    times = {"the same DDP model, unhooked": [], "... hooked (instrument_ddp's C++ hooks)": []}
    sync = None
    for r in range(ROUNDS):
        for hooked in ((True, False) if r % 2 == 0 else (False, True)):
            if hooked:
                sync = rst._torch_hooks.DdpSync(m.reducer, comm, "all_reduce", count, "float32")
            # One untimed step first: the first backward after hooking or unhooking
            # runs cold (20-40 us more), which over 10 steps read as 2-4 us per step.
            step(m, opt, x, y)
            t0 = time.perf_counter()
            for _ in range(10):
                step(m, opt, x, y)
            times["... hooked (instrument_ddp's C++ hooks)" if hooked else "the same DDP model, unhooked"].append(
                (time.perf_counter() - t0) / 10)
            sync = None  # unhooks
        if r % 50 == 0:
            rankscope.flush()
    print()
    print_medians(times, "the same DDP model, unhooked", 48)


def many_parameters():
    """What the hooks cost as parameters grow: 200 parameters (100 Linear(8, 8)) in one
    bucket, hooked and unhooked alternately as above; by default only each bucket's first
    gradient accumulator stays hooked, with find_unused_parameters=True every one does."""
    if rst._torch_hooks is None:
        return
    times = {}
    for find_unused in (False, True):
        torch.manual_seed(0)
        m = DDP(torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(100)]), find_unused_parameters=find_unused)
        comm = rst._communicator(m.process_group)
        x = torch.randn(4, 8)
        how = "every accumulator (find_unused_parameters)" if find_unused else "one per bucket (default)"
        arms = {True: [], False: []}
        for r in range(ROUNDS // 2):
            for hooked in ((True, False) if r % 2 == 0 else (False, True)):
                sync = rst._torch_hooks.DdpSync(m.reducer, comm, "all_reduce", 1, "float32") if hooked else None
                for _ in range(2):  # untimed: a cold step, then the one after which the hooks narrow
                    m(x).sum().backward()
                t0 = time.perf_counter()
                for _ in range(10):
                    m(x).sum().backward()
                arms[hooked].append((time.perf_counter() - t0) / 10)
                sync = None
            if r % 50 == 0:
                rankscope.flush()
        times[f"200 parameters, unhooked{' (find_unused)' if find_unused else ''}"] = arms[False]
        times[f"... hooked: {how}"] = arms[True]
    print()
    print(f"{'variant':56} {'us/step':>8} {'vs unhooked':>11}")
    names = list(times)
    for base, hooked in ((names[0], names[1]), (names[2], names[3])):
        ref = statistics.median(times[base])
        for name in (base, hooked):
            med = statistics.median(times[name])
            print(f"{name:56} {med * 1e6:8.1f} {(med - ref) * 1e6:+11.1f}")


if __name__ == "__main__":
    main()
