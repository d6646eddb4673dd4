"""Silent data corruption: data-parallel replicas compared (rankscope.torch.ReplicaCheck)."""
import collections
import json

import torch
import torch.distributed as dist

import rankscope
from . import _rankscope as _rs


class ReplicaCheck:
    """Silent data corruption: every `every` calls (once per optimizer step, after it), checks
    that the data-parallel replicas hold bit-identical parameters. Each parameter's checksum (the
    sum of its 32-bit words: any flipped bit moves it) is compared across the group with one
    all-reduce of two int64 per parameter (the max of x and of -x); only when they differ are
    the differing checksums gathered, the majority found, and the odd rank(s), tensor and step
    recorded (rankscope.record_replica_mismatch: triage's silent_corruption finding). A
    corruption is named at the first check after it: within `every` steps. One check costs a
    fixed ~0.5 ms plus ~0.2 ms per million CPU parameters (benchmarks/python/bench_replicas.py):
    every 500 steps that is <= 0.05 % of a 2.3 ms step.

        check = rankscope.torch.ReplicaCheck(model)          # every 500 steps
        ...
        opt.step(); check()

    Parameters sharded across ranks (FSDP, tensor parallel) are not replicas: pass the
    replicated ones only, or a group whose members hold the same shard."""

    def __init__(self, model, every=500, group=None):
        self.params = [(n, p) for n, p in model.named_parameters()]
        self.every, self.group, self.mismatches = max(1, int(every)), group, 0
        self._left = self.every  # calls until the next check: one decrement per step (~60 ns, not 140)

    @staticmethod
    def _checksum(p):
        """An int (CPU: rankscope's C++ sum of 32-bit words, ~10x torch's int64 sum here) or a
        0-d int64 tensor on the device (one reduction per tensor; gathered with one copy)."""
        t = p.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        if t.device.type == "cpu":
            return _rs._replica_checksum(t.data_ptr(), t.numel() * t.element_size())
        b = t.view(-1).view(torch.uint8)
        return b.view(torch.int32).sum(dtype=torch.int64) if b.numel() % 4 == 0 else b.sum(dtype=torch.int64)

    def _checksums(self):
        sums = [self._checksum(p) for _, p in self.params]
        on_device = [i for i, x in enumerate(sums) if isinstance(x, torch.Tensor)]
        if on_device:
            for i, v in zip(on_device, torch.stack([sums[i] for i in on_device]).cpu().tolist()):
                sums[i] = v
        return torch.tensor(sums, dtype=torch.int64)

    def __call__(self):
        self._left -= 1
        if self._left > 0:
            return 0
        self._left = self.every
        if not dist.is_available() or not dist.is_initialized():
            return 0
        with rankscope.phase("replica_check"):
            sums = self._checksums()
            both = torch.cat([sums, -sums])  # one all-reduce: the max and (negated) the min of each
            dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.group)
            n = sums.numel()
            bad = (both[:n] != -both[n:]).nonzero().flatten()
            if bad.numel() == 0:
                return 0
            world = dist.get_world_size(self.group)
            gathered = [torch.empty_like(sums[bad]) for _ in range(world)]
            dist.all_gather(gathered, sums[bad].contiguous(), group=self.group)
            ranks = dist.get_process_group_ranks(self.group) if self.group is not None else list(range(world))
            for j, i in enumerate(bad.tolist()):
                values = collections.Counter(int(g[j]) for g in gathered)
                top, n = values.most_common(1)[0]
                odd = [ranks[r] for r, g in enumerate(gathered) if int(g[j]) != top] if n * 2 > world else ranks
                holders = {f"{v % (1 << 64):016x}": [ranks[r] for r, g in enumerate(gathered) if int(g[j]) == v]
                           for v in values}
                rankscope.record_replica_mismatch(self.params[i][0], odd, json.dumps(holders))
                self.mismatches += 1
            return bad.numel()
