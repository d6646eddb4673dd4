"""What the silent-data-corruption check (rankscope.torch.ReplicaCheck) costs.

    .venv/bin/torchrun --standalone --nproc-per-node 2 benchmarks/python/bench_replicas.py [--quick]

Two ranks over gloo, DDP on the examples' MLP shapes at three widths. Per width, rounds
alternate 20 training steps with 20 forced checks (every=1), so machine noise hits both; the
median of each is printed, and the cost of one check at the default interval (every 500
steps) as a share of a step: check / (500 x step).
"""
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import rankscope
import rankscope.torch as rst

ROUNDS = 5 if "--quick" in sys.argv else 30
DEFAULT_EVERY = 500  # ReplicaCheck's default


def main():
    torch.set_num_threads(1)
    rankscope.init(run_dir=tempfile.mkdtemp(prefix="rankscope-bench-replicas-"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for hidden in (256, 1024, 2048):
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(128, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                        torch.nn.ReLU(), torch.nn.Linear(hidden, 10)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        check = rst.ReplicaCheck(model, every=1)
        x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
        steps, checks = [], []
        for _ in range(ROUNDS):
            for _ in range(20):
                t = time.perf_counter()
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                steps.append(time.perf_counter() - t)
            for _ in range(20):
                t = time.perf_counter()
                check()
                checks.append(time.perf_counter() - t)
        assert check.mismatches == 0
        params = sum(p.numel() for p in model.parameters())
        step, one = statistics.median(steps), statistics.median(checks)
        if rank == 0:
            print(f"hidden {hidden} ({params / 1e6:.2f} M parameters): step {step * 1e3:.3f} ms, one check "
                  f"{one * 1e3:.3f} ms; every {DEFAULT_EVERY} steps: {100 * one / (DEFAULT_EVERY * step):.3f} % of "
                  f"step time", flush=True)
    dist.destroy_process_group()
    rankscope.shutdown()


if __name__ == "__main__":
    main()
