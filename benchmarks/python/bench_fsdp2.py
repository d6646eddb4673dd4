"""What rst.instrument() costs an FSDP2 training step (torch >= 2.7 on CPU).

    .venv/bin/python benchmarks/python/bench_fsdp2.py [--quick]   (after pip install --no-build-isolation .)

One process, world size 1 over gloo, a 3-layer MLP with each Linear and the root
fully_shard()ed: per step 3 all-gathers in forward, 3 in backward (resharded after
forward) and 3 reduce-scatters, each through torch.distributed's functions. Rounds of
10 steps alternate between instrument() on, on but rankscope disabled at run time, and
off (uninstrument(): plain FSDP2), in reverse order every other round; the median step
time of each is printed next to plain FSDP2's, with a second plain round as the noise floor.
"""
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import rankscope
import rankscope.torch as rst
from bench_util import one_rank_gloo, print_medians

ROUNDS = 30 if "--quick" in sys.argv else 300


def main():
    one_rank_gloo("bench-fsdp2", 29900)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
    arms = ["plain FSDP2", "plain FSDP2, again (noise floor)", "rst.instrument()", "rst.instrument(), disabled"]
    times = {a: [] for a in arms}
    for r in range(ROUNDS):
        for arm in (arms if r % 2 == 0 else arms[::-1]):
            if arm.startswith("plain"):
                rst.uninstrument()
            else:
                rst.instrument()
            rankscope.set_enabled("disabled" not in arm)
            t0 = time.perf_counter()
            for _ in range(10):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
            times[arm].append((time.perf_counter() - t0) / 10)
        rankscope.set_enabled(True)
        rankscope.flush()
    rst.uninstrument()
    print_medians(times, "plain FSDP2", 36)
    dist.destroy_process_group()
    rankscope.shutdown()


if __name__ == "__main__":
    main()
