"""Shared by the Python benchmarks: a one-rank gloo job, and the table of median step times
against a baseline arm."""
import atexit
import os
import shutil
import statistics
import tempfile


def one_rank_gloo(name, port_base):
    """rankscope and a world-size-1 gloo process group in this process, one CPU thread."""
    import torch
    import torch.distributed as dist
    import rankscope

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port_base + os.getpid() % 90))
    torch.set_num_threads(1)
    run_dir = tempfile.mkdtemp(prefix=f"rankscope-{name}-")
    atexit.register(shutil.rmtree, run_dir, True)  # a benchmark's run log is not kept
    rankscope.init(rank=0, world_size=1, run_dir=run_dir)
    dist.init_process_group("gloo", rank=0, world_size=1)


def print_medians(times, base, width=48):
    """times: arm -> [seconds per step, one per round]; prints µs per step and the difference to `base`."""
    ref = statistics.median(times[base])
    print(f"{'variant':{width}} {'us/step':>8} {'vs plain':>9}")
    for name, v in times.items():
        med = statistics.median(v)
        print(f"{name:{width}} {med * 1e6:8.1f} {(med - ref) * 1e6:+9.1f}")
