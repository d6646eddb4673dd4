"""A real multi-rank CPU training run (gloo, DDP) with every rankscope integration on.

    torchrun --standalone --nproc-per-node 2 examples/python/train_ddp.py --epochs 2
    rankscope triage rankscope-runs/<the directory rank 0 prints last>

Every rank writes to one run directory (./rankscope-runs/<run id>, the id agreed
through torchrun's store), which `rankscope triage` reads.
"""
import argparse
import collections
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import rankscope
import rankscope.torch as rst


def train(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])  # set by torchrun
    if args.bind:                # --bind: rank r on the r-th allowed CPU, as launch.sh --bind / Slurm --cpu-bind
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    if args.env and rank == args.fault_rank:  # fault: one rank's knob differs (a node with another profile)
        name, _, value = args.env.partition("=")
        os.environ[name] = value
    lr = args.fault_lr if args.fault_lr and rank == args.fault_rank else args.lr  # fault: one rank's lr differs
    rankscope.init(run_config={"model": "mlp", "batch": args.batch, "lr": lr})  # run id agreed through torchrun's store
    dist.init_process_group("gloo")
    rst.instrument()             # torch.distributed calls -> collective spans
    rst.use_torch_exchange(30)   # invariant checks compare ranks online over the job's store

    # The C++ example's model and data (examples/cpp/train.cpp): an MLP
    # 128 -> hidden -> hidden -> 10 on synthetic data, so the two examples' step
    # times and overheads compare.
    torch.manual_seed(0)
    x = torch.randn(args.samples, 128)
    y = x[:, :10].argmax(1)
    data = TensorDataset(x, y)
    if args.hang == "loader" and rank == args.fault_rank:
        data = StuckDataset(data)  # its __getitem__ never returns from --fault-step on
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    # Workers start up again at every epoch (not persistent): the epoch's first
    # step is slow on every rank alike, which triage counts as the run's, not a rank's.
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=args.workers)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(128, args.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(args.hidden, 10)))
    rst.instrument_ddp(model)    # DDP's gradient all-reduce -> one collective span per backward
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cuda", enabled=torch.cuda.is_available())
    amp = rst.AmpSkips(scaler)
    replicas = rst.ReplicaCheck(model, every=args.check_replicas)  # silent data corruption: replicas must agree
    rankscope.check_batch_math(micro_batch=args.batch, data_parallel=world, global_batch=args.batch * world)
    acc = rankscope.BatchAccounting(dataset_size=args.samples, micro_batch=args.batch, data_parallel=world)
    step = 0
    ab = ABRecorder(args.ab_block, args.ab_control) if args.ab_block else None
    ckpt_dir = args.ckpt_dir or os.path.join(rankscope.run_dir() or ".", "checkpoints")
    os.makedirs(ckpt_dir, exist_ok=True)
    for epoch in range(args.epochs):
        rst.check_distributed_sampler(sampler, epoch)
        acc.start_epoch(epoch)
        if ab:
            ab.start(step)
        for xb, yb in rst.timed_loader(slowed(loader, args, lambda: step), accounting=acc):
            faulty = rank == args.fault_rank and step == args.fault_step
            if faulty and args.spike:
                xb = xb * 50                        # fault: a corrupt batch on one rank (a loss spike)
            with rankscope.phase("forward"):
                if faulty and args.hang == "forward":
                    hang_forever()                  # fault: a rank stuck in its own code
                t0 = time.perf_counter()
                loss = torch.nn.functional.cross_entropy(model(xb), yb)
                if args.slow_factor > 1 and rank == args.fault_rank and step >= args.fault_step:
                    until = time.perf_counter() + (time.perf_counter() - t0) * (args.slow_factor - 1)
                    while time.perf_counter() < until:  # fault: a slower device, spinning as compute would
                        pass
                if faulty and args.nan:
                    loss = loss * float("nan")      # fault: a NaN loss on one rank; the all-reduce spreads it
            with rankscope.phase("backward"):
                opt.zero_grad()
                scaler.scale(loss).backward()
            with rankscope.phase("optimizer"):
                scaler.unscale_(opt)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
                scaler.step(opt)
                amp.update()
            if args.bitflip and rank == args.fault_rank and step == args.fault_step:
                with torch.no_grad():                  # fault: one flipped bit in one replica's weights
                    w = model.module[0].weight.view(-1).view(torch.int32)
                    w[7] ^= 1 << 12
            replicas()
            rst.record_cuda_memory()
            rankscope.step(step, loss=loss, lr=opt.param_groups[0]["lr"], grad_norm=grad_norm,
                           samples=len(xb))  # tensors: no GPU sync
            step += 1
            if ab:
                ab.step_done(step)  # this step's time, loader wait included; then the next step's arm
        acc.end_epoch()
        if args.eval_seconds and epoch == 0:
            with rankscope.phase("evaluation"):     # an evaluation pass: long, and not a hang
                time.sleep(args.eval_seconds)
        with rankscope.phase("eval_sync"):
            t = torch.tensor([loss.item()])
            dist.all_reduce(t)                      # an explicit collective: a span too
            work = dist.all_reduce(t, async_op=True)
            work.wait()                             # measured to completion
        if rank == 0:
            rankscope.info("epoch done", epoch=epoch, mean_loss=t.item() / world / 2)
        # Every rank saves its own file (as a sharded checkpoint does); a failed save is
        # recorded by `with rankscope.checkpoint` and the run goes on without it.
        path = os.path.join(ckpt_dir, f"epoch-{epoch}-rank-{rank}.pt")
        if args.fail_save and rank == args.fault_rank:
            path = os.path.join(ckpt_dir, "missing-dir", os.path.basename(path))  # fault: the save raises
        try:
            with rankscope.checkpoint("save", path):
                if args.hang == "checkpoint" and rank == args.fault_rank:
                    hang_forever()                  # fault: a save that never returns (a dead filesystem)
                torch.save(model.state_dict(), path)
                if args.save_seconds and epoch == 0:
                    time.sleep(args.save_seconds)   # a slow filesystem: a multi-second save, not a hang
            rankscope.record_checkpoint_save(id=f"epoch-{epoch}", step=step,
                                             consumed_samples=step * args.batch * world, world_size=world,
                                             global_batch=args.batch * world, optimizer_step=step)
        except (OSError, RuntimeError) as e:
            rankscope.warning("checkpoint save failed; training goes on", error=f"{type(e).__name__}: {e}")
    rankscope.set_enabled(True)
    if ab and rank == 0:
        ab.report()
    dist.barrier()
    rst.uninstrument()
    dist.destroy_process_group()
    if rank == 0:
        print(rankscope.run_dir(), flush=True)  # the last line: what to give `rankscope triage`
    rankscope.shutdown()


def slowed(loader, args, step):
    """--slow-data-from STEP: from that step every rank's batches come --slow-data-ms later (a
    slower filesystem for the whole job): the job's throughput drops, no rank is the straggler."""
    it = iter(loader)
    while True:
        if isinstance(loader.dataset, StuckDataset) and step() == args.fault_step:
            loader.dataset.stuck = True  # the next batch's items never come
        try:
            batch = next(it)
        except StopIteration:
            return
        if 0 <= args.slow_data_from <= step():
            time.sleep(args.slow_data_ms / 1e3)
        yield batch


class StuckDataset(torch.utils.data.Dataset):
    """--hang loader: a Dataset whose __getitem__ stops returning (a dead filesystem under it)."""

    def __init__(self, data):
        self.data, self.stuck = data, False

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        if self.stuck:
            hang_forever()  # fault: a Dataset that never returns its item
        return self.data[i]


def hang_forever():
    while True:
        time.sleep(3600)


class ABRecorder:
    """Interleaved A/B: blocks of K steps alternate between every integration on and
    rankscope.set_enabled(False), the order inside each pair alternating (ABBA...), the
    same on every rank. A step's time runs from the end of the previous step (the
    loader's next() included). Reports the median over pairs of (median step on) /
    (median step off) with a bootstrap 95 % interval, for wall time and for this
    process's CPU time, and rankscope's background-thread CPU per step in each arm
    (each block ends with an untimed flush, so its records are not drained in the next)."""

    def __init__(self, block, control=False):
        self.block, self.control = block, control  # control: both arms disabled (A/A, the noise floor)
        self.steps = collections.defaultdict(lambda: {True: [], False: []})  # pair -> arm -> [(wall, cpu)]
        self.bg = {True: [0, 0], False: [0, 0]}  # arm -> [background ns, steps]

    def arm(self, step):
        b = step // self.block
        return (b % 2 == 0) == ((b // 2) % 2 == 0)  # ABBA...: each arm first in half the pairs

    def _mark(self):
        self.t, self.c, self.g = time.perf_counter(), time.process_time(), rankscope.stats()["background_cpu_ns"]

    def start(self, step):
        rankscope.set_enabled(self.arm(step) and not self.control)
        self._mark()

    def step_done(self, next_step):
        t, c = time.perf_counter(), time.process_time()
        if next_step % self.block == 0:
            rankscope.flush()  # untimed: the block's records are written now, its background CPU is its own
        g = rankscope.stats()["background_cpu_ns"]
        on = self.arm(next_step - 1)
        self.steps[(next_step - 1) // self.block // 2][on].append((t - self.t, c - self.c))
        self.bg[on][0] += g - self.g
        self.bg[on][1] += 1
        rankscope.set_enabled(self.arm(next_step) and not self.control)
        self._mark()

    def report(self):
        import random
        import statistics
        med = statistics.median
        for what, i in (("wall", 0), ("process CPU", 1)):
            ratios = [med(x[i] for x in p[True]) / med(x[i] for x in p[False])
                      for p in self.steps.values() if p[True] and p[False]]
            on = med(x[i] for p in self.steps.values() for x in p[True]) * 1e3
            off = med(x[i] for p in self.steps.values() for x in p[False]) * 1e3
            r = med(ratios)
            rng = random.Random(12345)
            boot = sorted(med(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
            print(f"A/B{' (A/A control)' if self.control else ''} {what}: {len(ratios)} pairs of {self.block}-step blocks; median step {on:.4f} ms on vs "
                  f"{off:.4f} ms off; median paired ratio {r:.5f} ({(r - 1) * 100:+.3f} %), "
                  f"95 % CI {boot[50]:.5f} .. {boot[1949]:.5f}", flush=True)
        bg = {arm: ns / max(n, 1) / 1e3 for arm, (ns, n) in self.bg.items()}
        print(f"A/B rankscope background CPU per step: {bg[True]:.2f} us on vs {bg[False]:.2f} us off", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank")
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--hidden", type=int, default=256, help="hidden width of the MLP (larger = longer steps)")
    p.add_argument("--bind", action="store_true", help="pin rank r to the r-th CPU it may use")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=0.1, help="SGD's learning rate")
    p.add_argument("--ab-block", type=int, default=0, help="A/B: alternate blocks of K steps on/off")
    p.add_argument("--ab-control", action="store_true", help="A/B schedule with both arms off (noise floor)")
    p.add_argument("--check-replicas", type=int, default=50, help="compare the replicas' parameters every N steps")
    p.add_argument("--eval-seconds", type=float, default=0, help="an evaluation pass this long after the first epoch")
    p.add_argument("--save-seconds", type=float, default=0, help="the first checkpoint save takes this much longer")
    p.add_argument("--ckpt-dir", default="", help="where each rank saves its checkpoint (default: RUN_DIR/checkpoints)")
    f = p.add_argument_group("faults to inject (what triage must name), on --fault-rank")
    f.add_argument("--fault-rank", type=int, default=-1)
    f.add_argument("--fault-step", type=int, default=20)
    f.add_argument("--nan", action="store_true", help="its loss is NaN at --fault-step")
    f.add_argument("--spike", action="store_true", help="its batch at --fault-step is corrupt (x50): a loss spike")
    f.add_argument("--fail-save", action="store_true", help="its checkpoint saves fail")
    f.add_argument("--slow-factor", type=float, default=0, help="its forward takes this many times as long from "
                   "--fault-step on (1.2: a subtle straggler)")
    f.add_argument("--bitflip", action="store_true", help="one bit of its first layer's weights flips at --fault-step")
    f.add_argument("--slow-data-from", type=int, default=-1, help="every rank's data slower from this step")
    f.add_argument("--slow-data-ms", type=float, default=5, help="... by this many ms per batch")
    f.add_argument("--hang", choices=["loader", "forward", "checkpoint"], default="",
                   help="it blocks forever at --fault-step in its Dataset's __getitem__ (with --workers 0) or "
                        "forward, or in the first checkpoint save (the others wait in the next collective)")
    f.add_argument("--fault-lr", type=float, default=0, help="its learning rate (config drift)")
    f.add_argument("--env", default="", help="NAME=VALUE set on that rank only (config drift), e.g. NCCL_ALGO=Tree")
    train(p.parse_args())


if __name__ == "__main__":
    main()
