"""N training steps of a small DDP model, its gradient all-reduce instrumented or not.

    python ddp_steps.py STEPS [--instrument]

For benchmarks/instr_overhead.sh ddp, which counts the instructions per step of both under
callgrind: what `rst.instrument_ddp` adds to plain DDP, free of the timing noise that limits
bench_ddp.py. World size 1 over gloo; the model is bench_ddp.py's.
"""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import rankscope
import rankscope.torch as rst
from bench_util import one_rank_gloo


def main():
    steps = int(sys.argv[1])
    one_rank_gloo("ddp-steps", 29800)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)))
    if "--instrument" in sys.argv:
        rst.instrument_ddp(model)
    x = torch.randn(64, 32)
    y = x[:, :4].argmax(1)
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
    dist.destroy_process_group()
    rankscope.shutdown()


if __name__ == "__main__":
    main()
