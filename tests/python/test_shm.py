"""rankscope's rings and the trainer share /dev/shm: on a small one (Docker's default is 64 MiB)
the rings must leave the DataLoader's workers the room they need."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import TORCHRUN

TRAIN = r'''
import os, sys, threading
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
import rankscope

rankscope.init()
dist.init_process_group("gloo")

class Batches(Dataset):  # tensors made in the workers travel to the rank through /dev/shm
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return torch.full((64, 1024), float(i))

def record(name):  # two more recording threads, as a loader and a pin-memory thread are: a ring each
    for _ in range(200):
        with rankscope.phase(name):
            pass

threads = [threading.Thread(target=record, args=(n,)) for n in ("prefetch", "logger")]
for t in threads:
    t.start()
total = 0.0
for step, batch in enumerate(DataLoader(Batches(), batch_size=4, num_workers=2)):
    with rankscope.phase("forward"):
        total += float(batch.sum())
    rankscope.step(step)
for t in threads:
    t.join()
dist.barrier()
print(f"rank {dist.get_rank()} done {total:.0f}", flush=True)
rankscope.shutdown()
'''


def test_eight_ranks_with_dataloader_workers_fit_a_64_mib_dev_shm(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    run_dir = tmp_path / "run"
    # A mount namespace of its own: /dev/shm is a fresh 64 MiB tmpfs for this job only.
    # A user namespace too (--map-root-user): any user may mount a tmpfs there, so this runs
    # without root, never skipped (unshare is util-linux's, on every Debian system).
    assert shutil.which("unshare"), "unshare(1) (util-linux) is needed"
    cmd = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "sh", "-c",
           'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"', "sh",
           TORCHRUN, "--standalone", "--nproc-per-node", "8", str(script)]
    env = dict(os.environ, OMP_NUM_THREADS="1", RANKSCOPE_DIR=str(run_dir), RANKSCOPE_SHM_DIR="/dev/shm")
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert sum(f"rank {r} done" in p.stdout for r in range(8)) == 8, p.stdout[-2000:]
    # The rings that did not fit are said (once per process) and recorded in private memory.
    assert "rankscope takes at most a quarter of the tmpfs" in p.stderr, p.stderr[-3000:]
    for r in range(8):
        with open(run_dir / f"rank-{r}.jsonl") as f:
            lines = [json.loads(line) for line in f]
        assert sum(1 for e in lines if e["kind"] == "phase" and e["name"] == "prefetch") == 200, r
        assert lines[-1]["kind"] == "run_end", r
