"""N steps of an unmodified DDP training loop, or the same loop instrumented by hand.

    python plain_steps.py STEPS            # the script a user runs as is (rankscope never imported)
    RANKSCOPE_AUTO=1 python plain_steps.py STEPS      # the same, recorded by the no-code mode
    python plain_steps.py STEPS --by-hand  # the README's lines added (phases, timed_loader, step)

For benchmarks/instr_overhead.sh nocode, which counts the instructions per step of the three
under callgrind: what the no-code mode costs per step against the hand-instrumented loop.
World size 1 over gloo (RANK etc. come from the environment, as torchrun sets them); the model
and data are the examples' MLP (128 -> 256 -> 256 -> 10, batches of 64).
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def main():
    steps, by_hand = int(sys.argv[1]), "--by-hand" in sys.argv
    torch.set_num_threads(1)
    if by_hand:
        import rankscope
        import rankscope.torch as rst
        rankscope.init()
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                    torch.nn.ReLU(), torch.nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(steps * 64, 128)
    loader = DataLoader(TensorDataset(x, x[:, :10].argmax(1)), batch_size=64)
    if by_hand:
        rst.instrument()
        rst.instrument_ddp(model)
        loader = rst.timed_loader(loader)
    for step, (xb, yb) in enumerate(loader):
        optimizer.zero_grad(set_to_none=True)
        if by_hand:
            with rankscope.phase("forward"):
                loss = torch.nn.functional.cross_entropy(model(xb), yb)
            with rankscope.phase("backward"):
                loss.backward()
            with rankscope.phase("optimizer"):
                optimizer.step()
            rankscope.step(step, loss=loss, lr=0.1, samples=len(xb))
        else:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
