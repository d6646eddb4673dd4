"""PyTorch's own flight recorder, read into the run directory whenever rankscope dumps its own.

PyTorch 2.x keeps a flight recorder per process-group backend (on by default: the last 2000
collectives, `TORCH_FR_BUFFER_SIZE`; 0 turns it off): every collective the process group ran,
with its own sequence number per group, whether it was enqueued, started and completed (on
NCCL from its CUDA events), and its tensor sizes. It sees what rankscope does not wrap (a
library calling the backend directly) and how far each process group got by PyTorch's count.

rankscope's flight dump (`rank-<R>.flight.json`) is written by its C++ background thread at a
stall, at a peer's request and on signals; that thread never runs Python (the GIL may be held by
the stuck thread). So a daemon thread here looks at that file's modification time once a second
and, when it changed, writes PyTorch's dump next to it as `rank-<R>.torch-flight.json`
(`{"pid", "flight_mtime_ns", "torch": {<backend>: <PyTorch's JSON dump>}}`), which `rankscope
triage` reads.
Nothing happens on the training thread; a torch without the dump call is told once and skipped.
"""
import atexit
import json
import os
import sys
import threading

import rankscope

_started = False
_lock = threading.Lock()
_stop = threading.Event()
_POLL_S = 1.0


def start():
    """Starts the watcher once per process (idempotent; a forked child starts its own)."""
    global _started
    with _lock:
        if _started:
            return
        try:
            from torch._C import _distributed_c10d as c10d
        except ImportError:
            return
        dump = getattr(c10d, "_dump_fr_trace_json", None)
        if dump is None:  # torch before the backend-neutral recorder (2.6's is NCCL-only)
            rankscope.info("rankscope.torch: this torch has no backend-neutral flight recorder dump; "
                           "rankscope's own flight dumps are written without PyTorch's")
            _started = True
            return
        _started = True
        watcher = threading.Thread(target=_watch, args=(dump,), name="rankscope-torch-flight", daemon=True)
        watcher.start()
        # Stopped at exit, before the interpreter finalizes: a daemon thread that is inside a C++
        # call releasing the GIL then (PyTorch's dump of a shutdown-time flight dump) is unwound by
        # pthread_exit through a noexcept destructor, and the process aborts ("terminate called
        # without an active exception"). atexit runs in reverse: before rankscope's own shutdown.
        atexit.register(_stop_watching, watcher)


def _stop_watching(watcher):
    _stop.set()
    watcher.join(timeout=10)


def _watch(dump):
    seen = _flight_mtime()  # a dump already there is an earlier process's (a restart): not ours
    while not _stop.wait(_POLL_S):
        try:
            mtime = _flight_mtime()
            if mtime is None or mtime == seen or _stop.is_set() or sys.is_finalizing():
                continue
            seen = mtime
            _write(mtime, {b: _as_json(dump(True, False, backend=b)) for b in _backends()})
        except Exception as e:  # never into training; say it once and stop
            rankscope.warning("rankscope.torch: PyTorch's flight recorder could not be read into the run directory",
                              error=f"{type(e).__name__}: {e}")
            return


def _path(suffix):
    return os.path.join(rankscope.run_dir(), f"rank-{rankscope.context()['rank']}.{suffix}")


def _flight_mtime():
    if not rankscope.initialized():
        return None
    try:
        return os.stat(_path("flight.json")).st_mtime_ns
    except OSError:
        return None


def _backends():
    """The recorder instances to dump: the default group's backends PyTorch records for."""
    import torch.distributed as dist
    if not dist.is_initialized():
        return []
    named = str(dist.get_backend())  # "gloo", "nccl", or "cpu:gloo,cuda:nccl"
    return [b for b in ("gloo", "nccl") if b in named]


def _as_json(raw):
    return json.loads(raw.decode() if isinstance(raw, bytes) else raw)


def _write(mtime, by_backend):
    path = _path("torch-flight.json")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "flight_mtime_ns": mtime, "torch": by_backend}, f)
        f.write("\n")
    os.replace(tmp, path)
