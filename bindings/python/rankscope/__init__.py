"""rankscope: rank-aware observability for distributed training.

    import rankscope
    rankscope.init()                      # rank, world size, run dir from the environment
    for n, batch in enumerate(loader):
        with rankscope.phase("forward"):
            loss = model(batch)
        with rankscope.phase("backward"):
            loss.backward()
        rankscope.step(n, loss=loss, lr=lr, samples=len(batch))  # a CUDA loss: no sync
    rankscope.shutdown()                  # also runs at exit

Importing does nothing; calls before init() are counted no-ops. The extension
(_rankscope) is the C++ library; this package adds the decorator form of
phase() and the command line (python -m rankscope triage|status|timeline|summary).
"""
import functools as _functools

from . import _late_scalars, _rankscope
from ._rankscope import (  # noqa: F401  (the public API)
    BatchAccounting,
    CollectiveSpan,
    Communicator,
    Counter,
    Exchange,
    Gauge,
    Histogram,
    InvariantViolation,
    Phase,
    begin_step,
    check_batch_math,
    check_data,
    check_resume,
    check_sampler,
    clear_exchange,
    collective,
    communicator,
    context,
    counter,
    current_step,
    debug,
    dump_flight_recorder,
    enabled,
    error,
    fatal,
    fingerprint_bytes,
    fingerprint_indices,
    flush,
    gauge,
    heartbeat_status,
    histogram,
    info,
    initialized,
    last_step_breakdown,
    log_enabled,
    log_level,
    phase,
    progress,
    record_checkpoint_failure,
    record_checkpoint_save,
    record_replica_mismatch,
    report_evaluation,
    report_step_scalars,
    run_dir,
    set_enabled,
    set_exchange,
    set_log_level,
    stats,
    step,
    use_local_exchange,
    violation_count,
    warning,
)

__version__ = _rankscope.__version__
_rankscope._set_tensor_hook(_late_scalars.take)  # step(loss=<a CUDA tensor>) without a sync


def shutdown(timeout_s=5.0):
    """Stops recording and writes what is left, waiting at most timeout_s (idempotent; also
    runs at exit). Scalars step() is still reading back from the GPU are waited for first."""
    try:
        _late_scalars.finish(timeout_s)
    finally:
        _rankscope.shutdown(timeout_s)


def _flat_config(config, prefix=""):
    """{"optim": {"lr": 0.1}, "batch": 64} -> {"optim.lr": "0.1", "batch": "64"}: what a Hydra or
    argparse config holds, as the strings every rank's run log carries."""
    if hasattr(config, "items"):
        items = config.items()
    elif hasattr(config, "__dict__"):  # an argparse.Namespace, a dataclass instance
        items = vars(config).items()
    else:
        raise TypeError(f"rankscope.init(run_config=...) takes a mapping, not {type(config).__name__}")
    out = {}
    for k, v in items:
        key = f"{prefix}{k}"
        if hasattr(v, "items"):
            out.update(_flat_config(v, key + "."))
        else:
            out[key] = str(v)
    return out


def init(rank=None, world_size=None, local_rank=None, run_dir=None, run_id=None, enabled=None, run_config=None):
    """Starts recording. Unset arguments come from the environment (torchrun's RANK, WORLD_SIZE,
    LOCAL_RANK, ...; Slurm's; RANKSCOPE_*). Exporters too: RANKSCOPE_PROMETHEUS_PORT (/metrics on
    127.0.0.1:port + local rank), RANKSCOPE_PROMETHEUS_TEXTFILE_DIR, OTEL_EXPORTER_OTLP_ENDPOINT and
    the other OTEL_* variables. Under torchrun the ranks agree on a run id unique to the job through
    torchrun's store (restarts of the job keep it). Raises ValueError naming the variable and the
    fix on bad input."""
    if run_id is None and run_dir is None and not _rankscope.initialized():
        try:
            from . import _run_identity
            run_id = _run_identity.agreed_run_id()
        except Exception as e:  # the store unreachable: the environment's id, said once
            import sys
            why = _rankscope._strip_userinfo(f"{type(e).__name__}: {e}")  # it may quote MASTER_ADDR
            sys.stderr.write(f"rankscope: could not agree on a run id through torchrun's store ({why}); "
                             f"using the environment's (set RANKSCOPE_RUN_ID to choose one)\n")
    _add_versions()
    _rankscope.init(rank=rank, world_size=world_size, local_rank=local_rank, run_dir=run_dir, run_id=run_id,
                    enabled=enabled, run_config=None if run_config is None else _flat_config(run_config))
    _install_exit_hooks()
    _install_stack_capture()
    _time_process_group_init()


def _time_process_group_init():
    """torch.distributed.init_process_group (the store rendezvous, the communicators' set-up) and
    new_group run inside phases of their own, so a rank that hangs there is seen in flight
    (heartbeat, stall, flight dump, triage) before its first step. Only if the program has
    imported torch.distributed (never imported here); rankscope.torch.instrument() does it too.
    A name bound before (`from torch.distributed import init_process_group`) stays unwrapped."""
    import functools
    import sys
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    for name in ("init_process_group", "new_group"):
        original = getattr(dist, name, None)
        if original is None or getattr(original, "_rankscope", False):
            continue

        def make(fn, phase_name):
            @functools.wraps(fn)
            def timed(*args, **kwargs):
                with _rankscope.phase(phase_name):
                    result = fn(*args, **kwargs)
                if phase_name == "init_process_group":  # its store carries dump requests from now on
                    try:
                        from . import torch as rst
                        rst._use_store_for_dump_requests()
                        rst._check_backend_settings()
                    except Exception:  # never into the training script
                        pass
                return result
            timed._rankscope = True
            return timed

        setattr(dist, name, make(original, name))


_stack_pipe = None  # faulthandler's write end: it must stay open as long as faulthandler may write


def _install_stack_capture():
    """Python stacks for dumps and stalls (the `stacks` run-log line): CPython's faulthandler,
    registered for a real-time signal, writes every interpreter thread's stack from its signal
    handler without taking the GIL - a thread holding the GIL in a busy loop cannot block it. It
    writes into a non-blocking pipe that rankscope reads (a full pipe cuts the text short, never
    blocks the handler). Chained to rankscope's own handler for that signal, which faulthandler
    calls after its last write: the capture ends then. Once per process; skipped with
    RANKSCOPE_SIGNALS=0."""
    global _stack_pipe
    signo = _rankscope._python_stack_signal()
    if _stack_pipe is not None or signo == 0:
        return
    import faulthandler
    import os
    try:
        r, w = os.pipe()
    except OSError:
        return
    try:
        os.set_blocking(w, False)
        try:
            import fcntl
            fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)  # room for deep stacks
        except OSError:
            pass
        # chain=True only in front of rankscope's own handler: chaining to the default action
        # of a real-time signal would end the process.
        chain = _rankscope._python_stack_chainable()
        faulthandler.register(signo, file=w, all_threads=True, chain=chain)
    except (OSError, RuntimeError, ValueError):
        os.close(r)
        os.close(w)
        return
    _stack_pipe = w
    _rankscope._set_python_stack_pipe(r, chain)


def _add_versions():
    """Python's and torch's versions join the environment summary: triage's config_drift
    compares them across ranks. torch only if the program imported it (never imported here)."""
    import sys
    _rankscope._add_environment_entry("python", sys.version.split()[0])
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "__version__"):
        _rankscope._add_environment_entry("torch", str(torch.__version__))


def _install_exit_hooks():
    """An uncaught exception is an `exit` line in the run log (type, message, traceback) before
    Python prints it and dies, and the final heartbeat says "failed": triage then names the rank
    and the exception instead of calling it finished. Chains to the hooks already installed."""
    import sys
    import threading
    import traceback

    if getattr(sys.excepthook, "_rankscope", False):
        return

    def record(cause, tp, value, tb):
        try:
            text = "".join(traceback.format_exception(tp, value, tb))
            _rankscope._record_exit(cause, getattr(tp, "__qualname__", str(tp)), str(value), text)
        except Exception:  # never let the hook itself fail
            pass

    previous = sys.excepthook

    def excepthook(tp, value, tb):
        record("exception", tp, value, tb)
        previous(tp, value, tb)

    excepthook._rankscope = True
    sys.excepthook = excepthook
    previous_thread = threading.excepthook

    def thread_excepthook(args):
        if args.exc_type is not SystemExit:
            record("thread_exception", args.exc_type, args.exc_value, args.exc_traceback)
        previous_thread(args)

    threading.excepthook = thread_excepthook


class checkpoint:
    """Times a checkpoint save or load as a phase and records its outcome:

        with rankscope.checkpoint("save", path):
            torch.save(state, path)

    An exception inside is recorded (record_checkpoint_failure: the run log, the
    rankscope_checkpoint_failures_total metric, triage's checkpoint_failed finding; the
    checkpoint age keeps counting from the last good save) and then raised as it was."""

    def __init__(self, op, id=""):
        if op not in ("save", "load"):
            raise ValueError(f"op must be 'save' or 'load', not {op!r}")
        self.op, self.id = op, str(id)
        self._phase = _rankscope.phase("checkpoint_" + op)

    def __enter__(self):
        self._phase.__enter__()
        return self

    def __exit__(self, tp, value, tb):
        if tp is not None and issubclass(tp, Exception):
            record_checkpoint_failure(self.op, self.id, f"{tp.__qualname__}: {value}")
        return self._phase.__exit__(tp, value, tb)


def _decorate(handle, fn):
    """@rankscope.phase("name") on a function: times every call as that phase."""

    @_functools.wraps(fn)
    def timed(*args, **kwargs):
        with handle:
            return fn(*args, **kwargs)

    return timed


_rankscope._set_decorator(_decorate)


def _command(name, run_dir, **options):
    # The `rankscope` command's own table (lib/cli/commands.hpp): the same
    # recovery of a killed rank's rings, the same files, the same exit codes.
    out, note, code = _rankscope._command(name, str(run_dir), **options)
    return (out if out else note), code


def triage(run_dir, json=False, since="", until="", threads=0):
    """What went wrong in RUN_DIR, on which rank, with the evidence: (text, exit code 0/1/2).

    json: the versioned JSON report (docs/triage-schema.md) instead of text.
    since/until: keep events in a window: epoch seconds or ns, ISO-8601 UTC
    ("2026-11-22T05:30:00Z"), or "+15m" after the run's start.
    """
    return _command("triage", run_dir, json=json, since=since, until=until, threads=threads)


def status(run_dir, json=False):
    """Is every rank alive and progressing? (text, exit code)."""
    return _command("status", run_dir, json=json)


def summary(run_dir, json=False):
    """Per-rank summary of a run directory: (text, exit code)."""
    return _command("summary", run_dir, json=json)


def goodput(run_dir, json=False):
    """Where the wall time went (compute, loader wait, communication, checkpoints, stalls, restarts): (text, exit code)."""
    return _command("goodput", run_dir, json=json)


def diff(run_a, run_b, json=False):
    """What changed from run A to run B: (text, exit code; 1 when B has findings A has not)."""
    return _command("diff", run_a, other_dir=str(run_b), json=json)


def stacks(run_dir, json=False):
    """Where every rank's threads were at their last stack capture: (text, exit code)."""
    return _command("stacks", run_dir, json=json)


def timeline(run_dir, output="trace.json"):
    """Writes the run as Chrome/Perfetto trace JSON (output "-": returns it): (message or trace, exit code)."""
    return _command("timeline", run_dir, output=str(output))


def report(run_dir, output="report.html"):
    """Writes one self-contained HTML page of the run: (message, exit code)."""
    return _command("report", run_dir, output=str(output))
