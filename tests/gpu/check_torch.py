"""rankscope's Python side on a real GPU (tests/gpu/run.sh runs it there, after the build).

    python tests/gpu/check_torch.py OUT_DIR          every check, each in a process of its own
    python tests/gpu/check_torch.py OUT_DIR --only NAME

Checks (each writes OUT_DIR/NAME.json; the last line printed is the summary):
  loss_readback   rankscope.step(loss=<CUDA tensor>) is read back without a sync and logged
                  equal to .item() of the same tensor, for every step
  nvml            the resources line's GPU readings (NVML, dlopen'ed) against nvidia-smi's
  dist_nccl       torch.distributed on NCCL (world size 1), rankscope.torch.instrument(): the
                  collective lines, their op and count, each timed on the device
  phase_timing    the device time `with rankscope.phase(...)` records around CUDA work (its
                  `dev`) against torch.cuda.Event timing of the same work: within 5 %; the
                  host's `dur` (the launch) beside it
  device_hang     a kernel spinning on the current stream ahead of an NCCL all-reduce, the host
                  blocked in torch.cuda.synchronize(): the stall names the all-reduce as on the
                  GPU (the host returned from it), as issue #44 item 3 asks
  overhead        an instrumented GPU training step against the same step uninstrumented
                  (rankscope.set_enabled), interleaved A/B, median of the per-round ratios

Exit 0 when the checks that assert hold, 1 when one does not, 77 without a CUDA device.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHECKS = ("loss_readback", "nvml", "dist_nccl", "phase_timing", "device_start", "device_hang", "overhead")


def read_log(run_dir, kind=None):
    out = []
    with open(os.path.join(run_dir, "rank-0.jsonl")) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if kind is None or e.get("kind") == kind:
                out.append(e)
    return out


def model_and_data(torch, width=4096, depth=4, batch=256):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device="cuda")
    y = torch.randn(batch, width, device="cuda")
    return model, opt, x, y


def check_loss_readback(run_dir):
    import torch
    import rankscope
    rankscope.init(rank=0, world_size=1, run_dir=run_dir)
    model, opt, x, y = model_and_data(torch, width=1024, depth=2)
    losses = []
    for step in range(40):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
        rankscope.step(step, loss=loss)
    torch.cuda.synchronize()
    rankscope.shutdown()
    expected = {i: t.item() for i, t in enumerate(losses)}
    got = {}
    for e in read_log(run_dir):
        if e.get("kind") in ("step_end", "step_scalars") and isinstance(e.get("loss"), (int, float)):
            got[e["step"]] = e["loss"]
    bad = [i for i, v in expected.items() if i not in got or abs(got[i] - v) > 1e-6 * max(1.0, abs(v))]
    return {"steps": len(expected), "logged": len(got), "mismatched": bad[:10], "pass": not bad}


def nvidia_smi():
    q = "name,memory.total,memory.used,power.draw,temperature.gpu,utilization.gpu"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout.splitlines()[0]
    name, total, used, power, temp, util = [v.strip() for v in out.split(",")]
    return {"name": name, "mem_total_mib": float(total), "mem_used_mib": float(used), "power_w": float(power),
            "temp_c": float(temp), "util": float(util)}


def check_nvml(run_dir):
    import torch
    import rankscope
    os.environ["RANKSCOPE_RESOURCE_INTERVAL"] = "0.5"
    rankscope.init(rank=0, world_size=1, run_dir=run_dir)
    model, opt, x, y = model_and_data(torch, width=2048, depth=2)
    smi = []
    t_end = time.monotonic() + 4
    while time.monotonic() < t_end:  # keep the GPU busy so power and utilisation move
        for _ in range(20):
            model(x).sum().backward()
        torch.cuda.synchronize()
        smi.append(nvidia_smi())
    rankscope.shutdown()
    snaps = [e for e in read_log(run_dir, "resources") if "gpu_power_w" in e]
    info = json.load(open(os.path.join(run_dir, "run.json")))["environment"].get("gpus", [])
    if not snaps:
        return {"pass": False, "why": "no resources line with GPU readings", "gpus": info}
    last = snaps[-1]
    powers = [s["power_w"] for s in smi]
    result = {
        "rankscope": {k: last.get(k) for k in ("gpu_power_w", "gpu_temp_c", "gpu_util", "gpu_mem_used_ratio",
                                               "gpu_sm_hz", "gpu_throttle", "gpu_xid")},
        "nvidia_smi_last": smi[-1], "nvidia_smi_power_range": [min(powers), max(powers)], "gpus": info,
    }
    name_ok = any(smi[-1]["name"] in str(g) for g in info)
    power_ok = min(powers) * 0.8 <= last["gpu_power_w"] <= max(powers) * 1.2
    result["pass"] = bool(name_ok and power_ok)
    return result


def check_dist_nccl(run_dir):
    import torch
    import torch.distributed as dist
    import rankscope
    import rankscope.torch as rst
    rankscope.init(rank=0, world_size=1, run_dir=run_dir)
    store = dist.HashStore()
    dist.init_process_group("nccl", rank=0, world_size=1, store=store, device_id=torch.device("cuda:0"))
    rst.instrument()
    t = torch.ones(1 << 20, device="cuda")
    for _ in range(10):
        dist.all_reduce(t)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    torch.cuda.synchronize()
    dist.destroy_process_group()
    rankscope.shutdown()
    colls = read_log(run_dir, "collective")
    ops = [c.get("op") for c in colls]
    return {"collectives": len(colls), "ops": sorted(set(ops)), "first": colls[0] if colls else None,
            "timing": sorted({c.get("timing", "host") for c in colls}),
            "pass": len(colls) == 11 and set(ops) == {"all_reduce"} and all(c.get("count") == 1 << 20 for c in colls)
            and all(c.get("timing") == "device" for c in colls)}


def check_phase_timing(run_dir):
    import torch
    import rankscope
    rankscope.init(rank=0, world_size=1, run_dir=run_dir)
    model, opt, x, y = model_and_data(torch)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    device_ms = []
    for _ in range(5):  # warm-up
        model(x).sum().backward()
    torch.cuda.synchronize()
    for _ in range(20):
        start.record()
        with rankscope.phase("forward"):
            out = model(x)
        end.record()
        out.sum().backward()
        torch.cuda.synchronize()
        device_ms.append(start.elapsed_time(end))
    rankscope.shutdown()
    host_ms = [e["dur"] / 1e6 for e in read_log(run_dir, "phase") if e.get("name") == "forward"]
    device_line_ms = [e["dev"] / 1e6 for e in read_log(run_dir, "phase") if e.get("name") == "forward" and "dev" in e]
    result = {"cuda_events_ms_median": statistics.median(device_ms),
              "rankscope_host_ms_median": statistics.median(host_ms) if host_ms else None,
              "rankscope_device_ms_median": statistics.median(device_line_ms) if device_line_ms else None}
    result["device_timed"] = f"{len(device_line_ms)} of {len(host_ms)}"
    if not device_line_ms:
        result["pass"] = False  # on by default where CUDA is in use
        return result
    ratio = result["rankscope_device_ms_median"] / result["cuda_events_ms_median"]
    result["ratio"] = ratio
    result["pass"] = 0.95 <= ratio <= 1.05 and len(device_line_ms) == len(host_ms)
    return result


def check_device_start(run_dir):
    """dev_queued against CUDA events: a phase queued behind a 20 ms spin kernel starts on the
    device when the spin ends. Truth: the spin's device time (events around it) minus the host's
    time from recording the first event to entering the phase."""
    import torch
    import rankscope
    rankscope.init(rank=0, world_size=1, run_dir=run_dir)
    x = torch.ones(1 << 20, device="cuda")
    khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 2_000_000)  # SM clock, kHz
    expect_ms = []
    for _ in range(12):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        h1 = time.perf_counter_ns()
        a.record()
        torch.cuda._sleep(int(0.020 * khz * 1000))
        b.record()
        h2 = time.perf_counter_ns()
        with rankscope.phase("queued"):
            x.mul_(1.0)
        torch.cuda.synchronize()
        expect_ms.append(a.elapsed_time(b) - (h2 - h1) / 1e6)
    rankscope.shutdown()
    got_ms = [e["dev_queued"] / 1e6 for e in read_log(run_dir, "phase") if e.get("name") == "queued" and "dev_queued" in e]
    result = {"expected_ms_median": statistics.median(expect_ms), "dev_queued_ms": got_ms[:12]}
    if len(got_ms) != len(expect_ms):
        result["pass"] = False
        return result
    errors = [abs(g - e) for g, e in zip(got_ms[2:], expect_ms[2:])]  # the first two: warm-up
    result["abs_error_ms_max"] = max(errors)
    result["pass"] = max(errors) <= max(0.5, 0.05 * result["expected_ms_median"])
    return result


def check_device_hang(run_dir):
    import threading
    import torch
    import torch.distributed as dist
    import rankscope
    import rankscope.torch as rst
    os.environ["RANKSCOPE_STALL_TIMEOUT"] = "3"
    rankscope.init(rank=0, world_size=1, run_dir=run_dir)
    dist.init_process_group("nccl", rank=0, world_size=1, store=dist.HashStore(), device_id=torch.device("cuda:0"))
    rst.instrument()
    t = torch.ones(1 << 20, device="cuda")
    for step in range(3):
        dist.all_reduce(t)
        torch.cuda.synchronize()
        rankscope.step(step)
    khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 2_000_000)  # SM clock, kHz
    spin_s = 10
    torch.cuda._sleep(int(spin_s * khz * 1000))  # the GPU is busy (stuck) this long
    dist.all_reduce(t)                           # enqueued behind it; the host returns at once
    beats = []
    watcher = threading.Thread(target=lambda: (time.sleep(spin_s / 2 + 3),
                                               beats.append(open(os.path.join(run_dir, "rank-0.heartbeat.json")).read())))
    watcher.start()
    t0 = time.monotonic()
    torch.cuda.synchronize()                     # the host blocks at its sync
    blocked_s = time.monotonic() - t0
    watcher.join()
    rankscope.step(3)
    dist.destroy_process_group()
    rankscope.shutdown()
    stalls = read_log(run_dir, "stall")[-1:]  # the hang's (NCCL's set-up may have been slower than 3 s)
    first = stalls[0]["in_flight"] if stalls else []
    hb = json.loads(beats[0]) if beats else {}
    result = {"host_blocked_s": round(blocked_s, 2), "stall": stalls[0] if stalls else None,
              "device_pending": hb.get("device_pending")}
    result["pass"] = (bool(first) and first[0].get("op") == "all_reduce" and first[0].get("on_device") is True
                      and "on the GPU" in stalls[0].get("inside", "")
                      and [d.get("op") for d in hb.get("device_pending", [])] == ["all_reduce"])
    return result


def check_overhead(run_dir):
    import torch
    import rankscope
    rankscope.init(rank=0, world_size=1, run_dir=run_dir)
    model, opt, x, y = model_and_data(torch, width=2048, depth=4, batch=512)

    def steps(n, on, first):
        rankscope.set_enabled(on)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(n):
            with rankscope.phase("forward"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            with rankscope.phase("backward"):
                opt.zero_grad()
                loss.backward()
            with rankscope.phase("optimizer"):
                opt.step()
            rankscope.step(first + i, loss=loss)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n

    steps(20, True, 0)
    ratios, step = [], 100
    for r in range(12):  # interleaved A/B, the order alternating
        pair = {}
        for on in ((False, True) if r % 2 == 0 else (True, False)):
            pair[on] = steps(25, on, step)
            step += 25
        ratios.append(pair[True] / pair[False])
    rankscope.set_enabled(True)
    rankscope.shutdown()
    med = statistics.median(ratios)
    return {"ratios": [round(v, 4) for v in ratios], "median_ratio": med, "overhead_pct": 100 * (med - 1),
            "pass": None}  # a number for benchmarks/README.md (target <= 0.5 %), not a pass/fail


def run_one(name, out_dir):
    run_dir = tempfile.mkdtemp(prefix=f"rankscope-gpu-{name}-")
    try:
        result = globals()[f"check_{name}"](run_dir)
    except Exception as e:  # one check's failure is its result, the others still run
        result = {"pass": False, "error": f"{type(e).__name__}: {e}"}
    result["run_dir"] = run_dir
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    return result


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="rankscope-gpu-")
    os.makedirs(out_dir, exist_ok=True)
    import torch
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device: nothing here needs one until now"}))
        return 77
    if "--only" in sys.argv:
        name = sys.argv[sys.argv.index("--only") + 1]
        return 0 if run_one(name, out_dir).get("pass") is not False else 1
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
    failed = False
    for name in CHECKS:  # each in a process of its own: init once per process, as a trainer does
        t0 = time.monotonic()
        rc = subprocess.run([sys.executable, __file__, out_dir, "--only", name]).returncode
        path = os.path.join(out_dir, f"{name}.json")
        result = json.load(open(path)) if os.path.exists(path) else {"pass": False, "error": f"exit {rc}"}
        summary[name] = {k: v for k, v in result.items() if k not in ("run_dir", "first", "gpus")}
        summary[name]["seconds"] = round(time.monotonic() - t0, 1)
        failed |= result.get("pass") is False
    print(json.dumps(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
