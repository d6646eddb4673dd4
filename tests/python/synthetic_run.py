"""Run directories the tests write themselves, in the run-log schema (docs/run-log-schema.md,
version 3): exact times, no randomness, read back with `rankscope triage --json` and
`rankscope goodput --json`. What a rule decides from time (a straggler, a throughput drop, a
stall, where the time went) is tested on these, so the verdict never depends on how fast the
machine running the test is; real runs assert what they decide regardless of speed.

Times are nanoseconds since the run began, on one host: a line's `t` is T0 + at and its
`mono` MONO0 + at."""
import json
import os

MS = 1_000_000
S = 1_000_000_000
T0 = 1_790_000_000_000_000_000  # wall clock at the run's start (ns since the epoch)
MONO0 = 1_000_000_000_000       # the host's CLOCK_MONOTONIC then

LAUNCH_NS = 50_000  # a device-timed phase's host time: launching its kernels

# DDP's gradient all-reduce in the examples' MLP (101,386 float32 parameters, one bucket).
DDP_COUNT = 101_386


def fingerprint(op, count, dtype):
    """16 hex digits that are the same on every rank for the same call (FNV-1a 64)."""
    h = 0xCBF29CE484222325
    for c in f"{op}/{count}/{dtype}".encode():
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def write_json(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


def write_run_json(run_dir, world_size, restart_count=0):
    os.makedirs(run_dir, exist_ok=True)
    write_json(os.path.join(run_dir, "run.json"),
               {"schema": 3, "library": "rankscope", "version": "0.1.0", "run_id": "synthetic", "world_size": world_size,
                "local_world_size": world_size, "start_time_ns": T0, "launcher": "torchrun",
                "restart_count": restart_count, "job_id": "", "master_addr": "127.0.0.1", "host": "node-0",
                "config": {}, "config_hash": "0000000000000000"})


class RankLog:
    """One rank's rank-R.jsonl, appended line by line in the order the rank writes them: a
    phase's line when it ends (nested ones first), `t`/`mono` its start."""

    def __init__(self, run_dir, rank, world_size):
        self.run_dir, self.rank, self.world_size = run_dir, rank, world_size
        self.tid = 5000 + rank
        self.pid = 0
        self.seq = 0
        self.last_at = 0
        self.f = open(os.path.join(run_dir, f"rank-{rank}.jsonl"), "a")

    def line(self, kind, at, step=None, **fields):
        doc = {"kind": kind, "t": T0 + at, "mono": MONO0 + at, "rank": self.rank}
        if step is not None:
            doc.update(step=step, tid=self.tid)
        doc.update(fields)
        self.f.write(json.dumps(doc, separators=(",", ":")) + "\n")
        self.last_at = max(self.last_at, at)

    def run_start(self, at, restart=0):
        # A pid above Linux's pid_max: never a live process of this host.
        self.pid = 5_000_000 + 100 * restart + self.rank
        self.seq = 0  # a new process: new communicators
        self.line("run_start", at, schema=3, version="0.1.0", world_size=self.world_size, local_rank=self.rank,
                  local_world_size=self.world_size, node_rank=0, restart=restart, pid=self.pid, launcher="torchrun",
                  run_id="synthetic", job_id="", host="node-0", clock="monotonic", ticks_per_second=S)

    def step_begin(self, at, step):
        self.line("step_begin", at, step)

    def phase(self, at, step, name, kind, dur, depth=0, parent=None, on_device=False):
        """`on_device`: timed on a GPU as well - `dur` is its device time (what the step's
        timeline spends), and the host's time on the line the same short launch for every
        phase (LAUNCH_NS): the host's times alone tell nothing."""
        extra = {"parent": parent} if parent else {}
        if on_device:
            extra["dev"] = dur
            dur = LAUNCH_NS
        self.line("phase", at, step, name=name, phase_kind=kind, dur=dur, depth=depth, **extra)

    def collective(self, at, step, dur, wait=0, phase=None, wait_phase=None, op="all_reduce", count=DDP_COUNT,
                   dtype="float32"):
        """A collective issued at `at` that completed `dur` later; `wait`: how long the
        issuing thread blocked for it at its end (DDP's all-reduce: `ddp_all_reduce_wait`)."""
        self.seq += 1
        extra = {"phase": phase} if phase else {}
        if wait:
            extra.update(wait=wait, wait_phase=wait_phase or "ddp_all_reduce_wait")
        size = 4 * count
        self.line("collective", at, step, op=op, comm="world", comm_id=0, seq=self.seq, count=count, dtype=dtype,
                  bytes=size, peer=-1, group_size=self.world_size, dur=dur, result="ok",
                  fingerprint=fingerprint(op, count, dtype), algbw_gbps=round(size / dur, 3),
                  busbw_gbps=round(size / dur, 3), **extra)

    def step_end(self, at, step, dur=None, samples=64, next_step=True, **scalars):
        extra = {"dur": dur} if dur is not None else {}
        if next_step:
            extra["next_step"] = step + 1
        self.line("step_end", at, step, samples=samples, **extra, **scalars)

    def stall(self, at, step, since, timeout, inside):
        self.line("stall", at, step, dur=at - since, progress_age_ns=at - since, timeout_ns=timeout, inside=inside,
                  open_phases=[], in_flight=[])

    def stall_end(self, at, step, dur):
        self.line("stall_end", at, step, dur=dur)

    def exit(self, at, step, exception, msg, cause="exception"):
        self.line("exit", at, step, msg=f"{exception}: {msg}", cause=cause, exception=exception,
                  traceback=f'Traceback (most recent call last):\n  File "train.py", line 12, in <module>\n'
                            f"{exception}: {msg}\n")

    def run_end(self, at, step):
        self.line("run_end", at, step, events_recorded=1000, events_dropped=0, export_errors=0, inactive_calls=0,
                  threads=2, os_threads=8, communicators=1, background_cpu_ns=1_000_000)

    def heartbeat(self, step, state="exited", exit_cause=None):
        doc = {"schema": 1, "kind": "heartbeat", "rank": self.rank, "world_size": self.world_size,
               "local_rank": self.rank, "pid": self.pid, "host": "node-0", "run_id": "synthetic", "state": state,
               "interval_ns": S, "stall_timeout_ns": 15 * S, "liveness_wall_ns": T0 + self.last_at,
               "progress_wall_ns": T0 + self.last_at, "progress_age_ns": 0, "step": step, "stalls": 0,
               "slow_steps": 0, "inside": "", "open_phases": [], "in_flight": []}
        if exit_cause:
            doc["exit_cause"] = exit_cause
        write_json(os.path.join(self.run_dir, f"rank-{self.rank}.heartbeat.json"), doc)

    def close(self):
        self.f.close()


ALL_REDUCE_NS = 200_000  # the all-reduce's own time once the last rank has joined it


def lockstep_run(run_dir, world_size, steps, phases, startup=500 * MS, samples=64, on_device=False):
    """A DDP job's run directory: per step every rank waits for its loader, runs forward and
    backward, then waits in the gradient all-reduce (issued at the end of its backward, nested
    in it) until the last rank joins, then runs its optimizer. `phases(rank, step)` gives that
    rank's (loader_wait, forward, backward, optimizer) in ns at that step: the only thing that
    varies, so what a rule finds is decided by it alone. `on_device`: forward, backward and
    optimizer ran on a GPU, their lines' host time only the launch (RankLog.phase). Returns the
    run directory."""
    write_run_json(run_dir, world_size)
    logs = [RankLog(run_dir, r, world_size) for r in range(world_size)]
    now = [0] * world_size  # each rank's clock position: where its next step begins
    for log in logs:
        log.run_start(0)
        now[log.rank] = startup
        log.step_begin(startup, 0)
    for step in range(steps):
        ph = [phases(r, step) for r in range(world_size)]
        arrive = [now[r] + ph[r][0] + ph[r][1] + ph[r][2] for r in range(world_size)]
        done = max(arrive) + ALL_REDUCE_NS  # the all-reduce completes once the last rank has joined
        for log in logs:
            r, (loader, forward, backward, optimizer) = log.rank, ph[log.rank]
            begin = now[r]
            log.phase(begin, step, "loader_wait", "loader_wait", loader)
            log.phase(begin + loader, step, "forward", "forward", forward, on_device=on_device)
            bwd = begin + loader + forward
            log.collective(arrive[r], step, done - arrive[r], wait=done - arrive[r], phase="backward")
            log.phase(bwd, step, "backward", "backward", done - bwd, on_device=on_device)
            log.phase(done, step, "optimizer", "optimizer", optimizer, on_device=on_device)
            now[r] = done + optimizer
            log.step_end(now[r], step, dur=now[r] - begin, samples=samples, loss=round(2.0 / (step + 1), 6),
                         lr=0.1)
    for log in logs:
        log.run_end(now[log.rank] + MS, steps)
        log.heartbeat(steps - 1)
        log.close()
    return run_dir
