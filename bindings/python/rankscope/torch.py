"""rankscope.torch: PyTorch integration on top of the rankscope module.

    import rankscope, rankscope.torch as rst
    rankscope.init()
    rst.instrument()                          # torch.distributed collectives become collective spans
    ddp = DDP(model); rst.instrument_ddp(ddp) # DDP's gradient all-reduce: one span per backward
    rst.use_torch_exchange()                  # invariant checks compare ranks online over the job's store
    for batch in rst.timed_loader(loader, accounting=acc):   # time blocked in next() = loader_wait
        ...
        amp.update()                          # rst.AmpSkips(scaler): skipped optimizer steps, counted
        rst.record_cuda_memory()              # allocated / reserved gauges when CUDA exists
    rst.uninstrument()

Tested with torch 2.6 and 2.15. Nothing in torch is changed except the
torch.distributed functions instrument() wraps (restored by uninstrument()).
"""
import collections
import re
import sys
import threading
import os
import functools
import itertools
import time
import weakref

import torch
import torch.distributed as dist

import rankscope
from . import _functional
from . import _torch_flight
from ._amp import AmpSkips  # noqa: F401  (rst.AmpSkips)
from . import _rankscope as _rs



def _load_torch_hooks():
    """The C++ DDP hooks, when built against this very torch; else (None, why)."""
    try:
        from ._build_info import torch_missing, torch_version as built
    except ImportError:
        built, torch_missing = "", "this installation has no build record"
    if not built:
        return None, f"the C++ part was not built: {torch_missing or 'RANKSCOPE_WITH_TORCH was off'}"
    if built != torch.__version__:
        return None, (f"it was built against torch {built}, this is torch {torch.__version__} (to build them against "
                      "this torch: pip install --no-build-isolation from the source)")
    try:
        from . import _torch_hooks as hooks
    except ImportError as e:
        return None, f"it does not load: {e}"
    return hooks, None


# C++ autograd hooks for DDP; without them Python hooks do the same at ~10 us per step.
_torch_hooks, _no_hooks_reason = _load_torch_hooks()
if _torch_hooks is not None:
    _rs._set_tensor_reader(_torch_hooks.tensor_reader())  # step(loss=<CPU tensor>) read in place, not via .item()
else:
    import warnings

    warnings.warn(f"rankscope.torch: using Python hooks for DDP because {_no_hooks_reason}", RuntimeWarning,
                  stacklevel=2)

# torch.distributed function -> (rankscope op, how to find its tensors)
_OPS = {
    "all_reduce": "all_reduce",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "all_gather_single": "all_gather",          # torch 2.10+ (FSDP2's all-gather)
    "all_gather_coalesced": "all_gather",
    "reduce_scatter_single": "reduce_scatter",  # torch 2.10+ (FSDP2's reduce-scatter)
    "all_reduce_coalesced": "all_reduce",
    "batch_isend_irecv": "other",               # a batch of point-to-point ops: one span
    "monitored_barrier": "barrier",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "isend": "send",
    "irecv": "recv",
    "broadcast_object_list": "broadcast",
    "all_gather_object": "all_gather",
    "gather_object": "other",
    "scatter_object_list": "other",
}
_PEER_ARG = {"broadcast": 1, "reduce": 1, "send": 1, "recv": 1, "isend": 1, "irecv": 1}

_originals = {}
_comms = weakref.WeakKeyDictionary()  # process group -> communicator; a destroyed group drops out


def _group_name(group):
    """torch's own name of a group ("1", "2", ... in creation order, so the same on every rank)."""
    c10d = dist.distributed_c10d
    names = getattr(c10d, "_pg_names", None)  # torch 1.x
    if names is None:
        names = getattr(getattr(c10d, "_world", None), "pg_names", {})  # torch 2.x
    return names.get(group)


def _communicator(group):
    """One rankscope communicator per process group: sequence numbers line up across its ranks."""
    if group is None or group is dist.group.WORLD:
        return _rs.communicator("world", dist.get_world_size(), dist.get_rank())
    try:
        c = _comms.get(group)
    except TypeError:  # not weak-referenceable: not cached
        c = None
    if c is None:
        torch_name = _group_name(group)
        # Named after torch's group name, not the order this rank first used it:
        # every rank must give a group the same name for triage to compare them.
        name = f"pg{torch_name}" if torch_name is not None else f"pg@{id(group):x}"
        c = _rs.communicator(name, dist.get_world_size(group), dist.get_rank(group))
        try:
            _comms[group] = c
        except TypeError:
            pass
    return c


# Backends whose collectives run on a CUDA stream, as NCCL's do: rankscope times them on the
# device (events on the current stream at issue and at the end) and completes them when the
# device has. Collectives on CUDA tensors are timed there whatever the backend. Add the name
# of another stream-ordered backend here (the tests add a CPU stand-in).
stream_ordered_backends = {"nccl", "nccl-legacy"}
_backends = weakref.WeakKeyDictionary()  # process group -> its backend's name


def _stream_ordered(group):
    g = dist.group.WORLD if group is None else group
    try:
        name = _backends.get(g)
    except TypeError:
        name = None
    if name is None:
        try:
            name = str(dist.get_backend(g))
        except Exception:  # a group this rank is not in, a torch without the call
            name = ""
        try:
            _backends[g] = name
        except TypeError:
            pass
    return name in stream_ordered_backends


def _describe(fn_name, args, kwargs):
    """(count, dtype, peer, on CUDA) of a call: the elements this rank contributes."""
    if fn_name == "barrier" or fn_name.endswith("_object") or fn_name.endswith("_object_list"):
        return 0, "unknown", -1, False
    first = args[0] if args else next(iter(kwargs.values()), None)
    tensors = []
    if fn_name in ("all_gather",):  # (tensor_list, tensor)
        first = args[1] if len(args) > 1 else kwargs.get("tensor")
    if fn_name == "reduce_scatter":  # (output, input_list)
        tensors = [args[0] if args else kwargs.get("output")]
    elif fn_name == "all_to_all":  # (output_list, input_list)
        tensors = list(args[1] if len(args) > 1 else kwargs.get("input_tensor_list", []))
    elif fn_name in ("all_gather_into_tensor", "_all_gather_base", "reduce_scatter_tensor", "_reduce_scatter_base",
                     "all_to_all_single", "all_gather_single", "reduce_scatter_single"):
        tensors = [args[1] if len(args) > 1 else kwargs.get("input_tensor", kwargs.get("input"))]
    elif fn_name == "all_reduce_coalesced":  # (tensors, ...)
        tensors = list(args[0] if args else kwargs.get("tensors", []))
    elif fn_name == "all_gather_coalesced":  # (output_tensor_lists, input_tensor_list)
        tensors = list(args[1] if len(args) > 1 else kwargs.get("input_tensor_list", []))
    elif fn_name == "batch_isend_irecv":  # ([P2POp, ...])
        tensors = [getattr(o, "tensor", None) for o in (args[0] if args else kwargs.get("p2p_op_list", []))]
    else:
        tensors = [first]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    count = sum(t.numel() for t in tensors)
    cuda = any(t.is_cuda for t in tensors)
    dtype = str(tensors[0].dtype) if tensors else "unknown"
    peer = -1
    if fn_name in _PEER_ARG:
        i = _PEER_ARG[fn_name]
        p = args[i] if len(args) > i else kwargs.get("src", kwargs.get("dst"))
        if isinstance(p, int):
            peer = p
    return count, dtype, peer, cuda


def _end_on_completion(fut, span):
    """Ends `span` when `fut` completes: ok unless the future holds an error."""
    def done(f):
        try:
            f.value()
        except BaseException:
            span.end(False)
            return
        span.end(True)

    fut.then(done)


class _SharedEnd:
    """One span for several requests (a batch_isend_irecv): ends with the last of them,
    as failed if any failed."""

    def __init__(self, span, n):
        self._span, self._left, self._ok = span, n, True

    def end(self, ok=True):
        self._ok = self._ok and ok
        self._left -= 1
        if self._left == 0:
            self._span.end(self._ok)


def _wait_phase_name(op):
    """The phase a rank is in while it blocks on a collective's completion: of the collective
    kind by its name, so time blocked inside forward (FSDP's all-gathers) or backward counts as
    communication in the step breakdown, goodput and triage's who-waits-for-whom."""
    return f"{op}_wait" if op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
                                  "barrier") else "comm_wait"


class _TimedWork:
    """An async work handle whose wait() (or future) ends the collective span, once. A wait()
    that blocks is a nested phase of the collective kind (_wait_phase_name)."""

    def __init__(self, work, span, op):
        self._work, self._span, self._open, self._op = work, span, True, op

    def _finish(self, ok):
        if self._open:
            self._open = False
            self._span.end(ok)

    def wait(self, *args, **kwargs):
        try:
            if self._open and not self._work.is_completed():
                with _rs.phase(_wait_phase_name(self._op)):
                    r = self._work.wait(*args, **kwargs)
            else:
                r = self._work.wait(*args, **kwargs)
        except Exception:
            self._finish(False)
            raise
        self._finish(True)
        return r

    def get_future(self):
        fut = self._work.get_future()
        _end_on_completion(fut, self)  # completion through the future ends the span too
        return fut

    def end(self, ok=True):
        self._finish(ok)

    def __del__(self):
        # Dropped without wait() (a fire-and-forget isend, stream-ordered NCCL
        # work): end the span when the work completes, or now if this backend's
        # work has no future; a span never ends as failed just for being dropped.
        if not self._open:
            return
        try:
            if self._work.is_completed():
                self._finish(True)
            else:
                _end_on_completion(self._work.get_future(), self)
        except BaseException:
            self._finish(True)

    def __getattr__(self, name):
        return getattr(self._work, name)


def _wrap(fn_name, fn):
    op = _OPS[fn_name]
    is_compiling = torch.compiler.is_compiling

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        # Under torch.compile, dynamo traces the original (into functional
        # collectives, which the dispatcher kernels record when the graph runs).
        if is_compiling() or not rankscope.enabled() or not dist.is_initialized():
            return fn(*args, **kwargs)
        group = kwargs.get("group")
        count, dtype, peer, cuda = _describe(fn_name, args, kwargs)
        span = _rs.collective(_communicator(group), op, count, dtype, peer, cuda or _stream_ordered(group))
        try:
            work = fn(*args, **kwargs)
        except Exception:
            span.end(False)
            raise
        if work is not None and hasattr(work, "wait") and (kwargs.get("async_op") or fn_name in ("isend", "irecv")):
            return _TimedWork(work, span, op)
        if fn_name == "batch_isend_irecv" and work:  # ends when every request of the batch has completed
            shared = _SharedEnd(span, len(work))
            return [_TimedWork(w, shared, op) for w in work]
        span.end(True)
        return work

    traced._rankscope_wrapped = True
    return traced


def _p2p_op_class(base):
    """P2POp accepts only torch's own isend/irecv (an identity check): given
    dist.isend while it is wrapped, it is handed the original. The batch is one
    span (batch_isend_irecv), not one per member."""

    def unwrap(op):
        return getattr(op, "__wrapped__", op) if getattr(op, "_rankscope_wrapped", False) else op

    class P2POp(base):
        def __new__(cls, op, *args, **kwargs):
            return super().__new__(cls, unwrap(op), *args, **kwargs)

        def __init__(self, op, *args, **kwargs):
            super().__init__(unwrap(op), *args, **kwargs)

    P2POp.__qualname__ = P2POp.__name__ = base.__name__
    P2POp.__doc__ = base.__doc__
    return P2POp


def _backend_warnings(backend, env):
    """What a job on `backend` (dist.get_backend(): "nccl", "cpu:gloo,cuda:nccl", ...) with the
    environment `env` should be told at start-up, as (message, fields) pairs."""
    if "nccl" not in str(backend):
        return []
    out = []
    if not env.get("NCCL_DEBUG"):
        out.append(("NCCL_DEBUG is not set: NCCL's own warnings (an InfiniBand port that fails, a fallback "
                    "to sockets, why a collective timed out) will not reach the job's output; NCCL_DEBUG=WARN "
                    "costs nothing while all is well", {"variable": "NCCL_DEBUG"}))
    for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"):
        if env.get(name, "").strip() == "0":
            out.append((f"{name}=0: a collective that fails or times out leaves this rank hanging instead of "
                        "ending it, so the job stalls rather than restarts; unset it (torch's default ends the "
                        "process)", {"variable": name}))
            break
    return out


_backend_checked = False


def _check_backend_settings():
    """Once per process, on global rank 0 (one warning for the job, not one per rank): the
    settings of the default process group's backend that decide what a failure will say."""
    global _backend_checked
    if _backend_checked or not dist.is_available() or not dist.is_initialized():
        return
    _backend_checked = True
    try:
        if dist.get_rank() != 0:
            return
        for msg, fields in _backend_warnings(dist.get_backend(), os.environ):
            rankscope.warning(msg, **fields)
    except Exception:  # never into the training script
        pass


class _CompileWatch:
    """torch.compile's compilations (TorchDynamo's start/end callbacks): each is a `compile`
    phase, so the step breakdown, goodput and a hang's position show time spent compiling; each
    recompilation of a frame (its compile id "F/N", N > 0: a guard failed on new shapes, dtypes
    or Python values) is an info line and counts in rankscope_torch_recompilations_total."""

    def __init__(self):
        self._local = threading.local()
        self._recompiles = rankscope.counter("rankscope_torch_recompilations_total",
                                             "Frames torch.compile compiled again (a guard failed)")
        self.registered = False

    def start(self, *args):
        try:
            ph = rankscope.phase("compile")
            ph.__enter__()
            stack = getattr(self._local, "open", None)
            if stack is None:
                stack = self._local.open = []
            stack.append(ph)
        except Exception:  # never into the compiler
            pass

    def end(self, *args):
        try:
            stack = getattr(self._local, "open", None)
            if stack:
                stack.pop().__exit__(None, None, None)
            compile_id = str(getattr(args[0], "compile_id", "")) if args else ""  # torch 2.8+ only
            m = re.fullmatch(r"(\d+)/(\d+)", compile_id)
            if m and int(m.group(2)) > 0:
                self._recompiles.add(1)
                rankscope.info(f"torch.compile recompiled frame {m.group(1)} (compilation {int(m.group(2)) + 1} of "
                               "it): a guard failed on a new input shape, dtype or Python value; TORCH_LOGS=recompiles "
                               "says which", compile_id=compile_id)
        except Exception:
            pass

    def register(self):
        """Once TorchDynamo is imported (importing it here would cost seconds every run)."""
        if self.registered or "torch._dynamo" not in sys.modules:
            return
        try:
            from torch._dynamo import callback
            callback.on_compile_start(self.start)
            callback.on_compile_end(self.end)
            self.registered = True
        except Exception as e:  # another torch layout: compilations are not phases
            rankscope.warning("rankscope.torch: torch.compile's compilations are not recorded",
                              error=f"{type(e).__name__}: {e}")

    def unregister(self):
        if not self.registered:
            return
        from torch._dynamo import callback
        callback.callback_handler.remove_start_callback(self.start)
        callback.callback_handler.remove_end_callback(self.end)
        self.registered = False


_compile_watch = None


def _watch_compilations():
    """Registers _CompileWatch now if TorchDynamo is loaded, else at the first torch.compile call."""
    global _compile_watch
    if _compile_watch is None:
        _compile_watch = _CompileWatch()
    _compile_watch.register()
    if _compile_watch.registered or "compile" in _originals:
        return
    _originals["compile"] = torch.compile

    @functools.wraps(torch.compile)
    def compile(*args, **kwargs):
        result = _originals["compile"](*args, **kwargs)  # imports TorchDynamo
        _compile_watch.register()
        return result

    torch.compile = compile


def instrument():
    """Records every collective as a span (idempotent): torch.distributed's functions (wrapped),
    and the functional collectives that DTensor and torch.compile'd graphs issue (at the dispatcher).
    DDP's gradient all-reduce runs in C++: instrument_ddp() records it. PyTorch's own flight
    recorder is copied next to each of rankscope's flight dumps (rank-<R>.torch-flight.json)."""
    rankscope._time_process_group_init()
    _use_store_for_dump_requests()
    _check_backend_settings()
    _watch_compilations()
    _torch_flight.start()  # PyTorch's flight recorder next to each of rankscope's dumps
    for name in _OPS:
        if name in _originals or not hasattr(dist, name):
            continue
        _originals[name] = getattr(dist, name)
        setattr(dist, name, _wrap(name, _originals[name]))
    if "P2POp" not in _originals and hasattr(dist, "P2POp"):
        _originals["P2POp"] = dist.P2POp
        dist.P2POp = _p2p_op_class(dist.P2POp)
    if not _functional.instrumented():
        try:
            _functional.instrument(_communicator, _wait_phase_name, _stream_ordered)
        except Exception as e:  # a torch without them, or another layout: say so once, record the rest
            rankscope.warning("rankscope.torch: functional collectives (DTensor, compiled graphs) are not recorded",
                              error=f"{type(e).__name__}: {e}")


def uninstrument():
    """Restores every function instrument() wrapped and removes its dispatcher kernels."""
    for name, fn in _originals.items():
        setattr(torch if name == "compile" else dist, name, fn)
    _originals.clear()
    if _compile_watch is not None:
        _compile_watch.unregister()
    _functional.uninstrument()


def _grad_tensors(out, found, depth=0):
    """The tensors of a forward's output that backward can enter through."""
    if isinstance(out, torch.Tensor):
        if out.grad_fn is not None and all(out.grad_fn is not t.grad_fn for t in found):
            found.append(out)
    elif depth < 3 and isinstance(out, (list, tuple)):
        for o in out:
            _grad_tensors(o, found, depth + 1)
    elif depth < 3 and isinstance(out, dict):
        for o in out.values():
            _grad_tensors(o, found, depth + 1)
    return found


_instrumented_ddp = {False: weakref.WeakSet(), True: weakref.WeakSet()}  # by per_bucket
_ddp_syncs = weakref.WeakKeyDictionary()  # DDP model -> its C++ hooks


def instrument_ddp(ddp_model, per_bucket=False):
    """Makes DDP's gradient all-reduce (done in C++, not through torch.distributed's
    Python functions) a collective span. Calling it again on the same model does
    nothing; a copy.deepcopy of the model is not instrumented.

    Default: one span per backward pass in which DDP all-reduces, on DDP's
    process group, counting every gradient element: opened when the first
    parameter gradient of that backward is ready (before DDP can launch a
    bucket; once DDP has rebuilt its buckets in gradient-ready order, the
    first gradient of its first bucket), ended when DDP has finished
    all-reducing (an autograd final callback queued behind DDP's own), so it
    includes the backward compute the buckets overlap (wrap backward in a
    phase and the step breakdown counts that time as backward). A backward opens one only if DDP's reducer expects
    it to all-reduce: not after a forward inside no_sync() or with
    require_backward_grad_sync off, one that raised, or a call of ddp.module
    directly, nor in a second backward of one forward or torch.autograd.grad()
    (a gradient penalty). Reentrant activation checkpointing inside the model
    is fine (the span ends with the outermost backward). With the C++
    extension built there is no Python per step at all: a C++ hook on each
    parameter's gradient accumulator (the nodes DDP's reducer hooks) reads the
    reducer's state, and the module keeps torch's hook-free fast path. Once
    DDP has rebuilt its buckets (its second iteration) only each bucket's first
    accumulator keeps a hook, enough to open the span before any bucket
    launches (all keep theirs with find_unused_parameters, static_graph or
    reentrant checkpointing, where a bucket can launch without them).
    Compiled autograd (torch 2.x) rejects C++ autograd hooks: with it on,
    backward raises once these hooks are installed, even with rankscope
    disabled, so there use per_bucket=True instead.

    per_bucket=True: one span per gradient bucket through a DDP communication
    hook, ended by the bucket's future. Exact per-bucket timing, but any Python
    comm hook costs DDP ~60-70 us per step (torch's own Python allreduce_hook
    measures the same), so keep it for diagnosis."""
    if ddp_model in _instrumented_ddp[per_bucket]:
        return
    comm = _communicator(getattr(ddp_model, "process_group", None))
    if per_bucket:
        _instrument_ddp_buckets(ddp_model, comm)
    else:
        params = [p for p in ddp_model.parameters() if p.requires_grad]
        count = sum(p.numel() for p in params)
        dtype = str(params[0].dtype) if params else "float32"
        on_device = _ddp_on_device(ddp_model, params)
        sync = None
        # On a device the span's events go on the current stream: the C++ hooks name it only
        # where this torch's c10::Stream does (2.7+); else the Python hooks, through torch._C.
        if _torch_hooks is not None and (not on_device or getattr(_torch_hooks, "names_cuda_streams", False)):
            try:
                sync = _torch_hooks.DdpSync(ddp_model.reducer, comm, "all_reduce", count, dtype, on_device)
            except Exception as e:  # a reducer this build cannot reach (another pybind11 ABI)
                rankscope.warning("rankscope.torch: C++ DDP hooks unavailable, using Python hooks",
                                  error=f"{type(e).__name__}: {e}")
        if sync is None:
            _instrument_ddp_python(ddp_model, comm, count, dtype, on_device)
        else:
            _ddp_syncs[ddp_model] = sync  # unhooks when the model goes; a deep copy has its own reducer
    _instrumented_ddp[per_bucket].add(ddp_model)


_ddp_init = None  # DistributedDataParallel.__init__ before instrument_ddp_when_built() wrapped it
_ddp_built_hooks = []  # more to do with each DDP as it is built (_after_ddp_built)


def instrument_ddp_when_built(per_bucket=False):
    """Instruments every DistributedDataParallel built from now on, as its construction
    returns (instrument_ddp): for code that wraps the model itself, such as a framework's
    fit() or train(). Idempotent; a DDP built before is not touched."""
    global _ddp_init
    ddp_cls = torch.nn.parallel.DistributedDataParallel
    if _ddp_init is not None:
        return
    _ddp_init = original = ddp_cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        for what, act in [("instrumented", lambda m: instrument_ddp(m, per_bucket=per_bucket))] + \
                [(name, hook) for name, hook in _ddp_built_hooks]:
            try:
                act(self)
            except Exception as e:  # never into the framework's setup: said, and the rest is recorded
                rankscope.warning(f"rankscope.torch: a DistributedDataParallel built here is not {what}",
                                  error=f"{type(e).__name__}: {e}")

    ddp_cls.__init__ = __init__


def _after_ddp_built(what, hook):
    """hook(ddp_model) runs for every DDP built from now on, after it is instrumented (the one
    wrapper of DistributedDataParallel.__init__); its failure is said as "not <what>"."""
    instrument_ddp_when_built()
    _ddp_built_hooks.append((what, hook))


def _mean_loss(losses):
    """One loss for a step from its micro-batches' (gradient accumulation): the mean, as a
    tensor (no GPU sync); None without any."""
    if not losses:
        return None
    return losses[0] if len(losses) == 1 else torch.stack(losses).mean()


def _ddp_on_device(ddp_model, params=None):
    """Whether DDP's buckets run on a CUDA stream (NCCL): CUDA parameters, or a
    stream-ordered backend. Its spans then end when the device has finished."""
    params = params if params is not None else list(ddp_model.parameters())
    return any(p.is_cuda for p in params[:1]) or _stream_ordered(getattr(ddp_model, "process_group", None))


def _instrument_ddp_python(ddp_model, comm, count, dtype, on_device=False):
    """The same span from Python hooks (no C++ extension): ~10 us per step."""
    engine = torch.autograd.Variable._execution_engine
    enabled = rankscope.enabled

    def open_span():
        span = _rs.collective(comm, "all_reduce", count, dtype, on_device=on_device)
        # Final callbacks run in order once backward is done, and DDP queues its
        # finalize (which waits for every bucket) when its last bucket is ready:
        # a callback queued from the first one runs after DDP's.
        engine.queue_callback(lambda: engine.queue_callback(lambda: span.end(True)))

    target = weakref.ref(ddp_model)

    def after_forward(module, inputs, output):
        # DDP sets require_forward_param_sync when this forward prepared it to all-reduce
        if module is target() and enabled() and getattr(module, "require_forward_param_sync", False):
            fired = []

            def on_backward(grad):  # once: a second backward of this forward all-reduces nothing
                if not fired:
                    fired.append(True)
                    open_span()

            for t in _grad_tensors(output, []):
                t.register_hook(on_backward)

    ddp_model.register_forward_hook(after_forward)


def _instrument_ddp_buckets(ddp_model, comm):
    world = comm.size
    group = ddp_model.process_group  # not the model: DDP's reducer holds this hook, unseen by the GC

    on_device = _ddp_on_device(ddp_model)

    def hook(state, bucket):
        # What DDP's default allreduce_hook does, through the un-instrumented
        # all_reduce so the bucket is one span, ended when its future completes
        # (on NCCL at enqueue, its callback on the collective's stream: the end
        # event recorded there completes with the collective on the device).
        buf = bucket.buffer()
        span = _rs.collective(comm, "all_reduce", buf.numel(), str(buf.dtype), on_device=on_device)
        buf.div_(world)
        all_reduce = _originals.get("all_reduce", dist.all_reduce)
        fut = all_reduce(buf, async_op=True, group=group).get_future()

        def done(f):
            try:
                out = f.value()[0]
            except BaseException:
                span.end(False)
                raise
            span.end(True)
            return out

        return fut.then(done)

    ddp_model.register_comm_hook(None, hook)


class TorchStoreExchange(_rs.Exchange):
    """The invariant checks' exchange over the job's c10d store: set this rank's
    payload, then bump its arrival counter; poll the others' counters with
    add(key, 0), which never blocks (torch 1.13's Python stores have no
    check(), and get() would wait for a missing rank), and report the ranks
    that did not arrive when the timeout passes."""

    def __init__(self, store=None, prefix="rankscope/x/"):
        super().__init__(dist.get_rank(), dist.get_world_size())
        self._store = store if store is not None else dist.distributed_c10d._get_default_store()
        # A restarted job may reuse the store (an elastic agent's): its rounds start again at 1.
        self._prefix = f"{prefix}{_rs.context()['restart_count']}/"
        self._rank, self._size = dist.get_rank(), dist.get_world_size()
        self._posted = {}  # check -> this rank's keys of its last rounds, oldest first

    def _forget_old_round(self, key, base):
        # Keys are "<check>/<call number>". Every rank that reached round n finished
        # reading round n-1, so once this rank posts round n+1 its keys of round n-1
        # are read by no one: deleted, so the store holds at most two rounds per check.
        posted = self._posted.setdefault(key.rpartition("/")[0], collections.deque())
        posted.append(base)
        if len(posted) > 2:
            old = posted.popleft()
            for k in (old + str(self._rank), old + "arrived/" + str(self._rank)):
                try:
                    self._store.delete_key(k)
                except Exception:  # a store without delete_key: keys stay, nothing else changes
                    pass

    def gather(self, key, payload, timeout_s):
        base = f"{self._prefix}{key}/"
        self._store.set(base + str(self._rank), payload)
        self._store.add(base + "arrived/" + str(self._rank), 1)
        self._forget_old_round(key, base)
        out = [None] * self._size
        deadline = time.monotonic() + timeout_s
        pause = 0.001
        while True:
            for r in range(self._size):
                if out[r] is None and self._store.add(base + "arrived/" + str(r), 0) > 0:
                    out[r] = bytes(self._store.get(base + str(r)))
            missing = [r for r in range(self._size) if out[r] is None]
            if not missing:
                return out
            if time.monotonic() >= deadline:
                e = TimeoutError(f"ranks {missing} did not arrive")
                e.missing = missing
                raise e
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


_exchange = None


def _use_store_for_dump_requests():
    """Coordinated dumps (the first rank to see a stall asks every rank to dump) also go through
    the default process group's store, which every rank of the job reaches, whatever the run
    directory. Needs the C++ hooks (pip install --no-build-isolation); else the run directory
    carries them alone."""
    if _torch_hooks is None or not dist.is_initialized():
        return
    try:
        _torch_hooks.use_store_for_dump_requests(dist.distributed_c10d._get_default_store())
    except Exception as e:  # another torch layout: the run directory still carries them
        rankscope.warning("rankscope.torch: dump requests go through the run directory only",
                          error=f"{type(e).__name__}: {e}")


def use_torch_exchange(timeout_s=60.0, store=None):
    """Makes rankscope's invariant checks compare ranks online over torch.distributed's store."""
    global _exchange
    _exchange = TorchStoreExchange(store)  # kept alive here: the C++ side holds it too
    _rs.set_exchange(_exchange, timeout_s)


def timed_loader(iterable, accounting=None):
    """Yields from `iterable`, timing each blocking next() as the loader_wait phase;
    with a BatchAccounting, every batch is counted (index = position in the epoch).
    The iterator is written in C: no generator frame and no Python call per batch."""
    return _rs._timed_loader(iterable, accounting)


_cuda_present = None   # torch.cuda.is_available(), asked once: ~0.8 us a call, and a step calls us
_cuda_gauges = {}      # device -> (allocated, reserved) gauges: a lookup by name and labels per step cost ~1 us


def record_cuda_memory(device=None):
    """Sets rankscope_cuda_memory_allocated_bytes / _reserved_bytes for this
    rank's device; does nothing (and raises nothing) without CUDA."""
    global _cuda_present
    if _cuda_present is None:
        _cuda_present = torch.cuda.is_available()
    if not _cuda_present:
        return False
    d = torch.cuda.current_device() if device is None else device
    gauges = _cuda_gauges.get(d)
    if gauges is None:
        labels = {"gpu": str(d)}
        gauges = _cuda_gauges[d] = (
            rankscope.gauge("rankscope_cuda_memory_allocated_bytes", "torch.cuda.memory_allocated", labels),
            rankscope.gauge("rankscope_cuda_memory_reserved_bytes", "torch.cuda.memory_reserved", labels))
    gauges[0].set(float(torch.cuda.memory_allocated(d)))
    gauges[1].set(float(torch.cuda.memory_reserved(d)))
    return True


def check_distributed_sampler(sampler, epoch=None, first_k=1024, fail=False):
    """Sampler invariants from a DistributedSampler: seed, epoch, shuffle, and a
    fingerprint of this rank's first indices of the epoch."""
    if epoch is not None:
        sampler.set_epoch(epoch)
    # The sampler makes the epoch's whole permutation either way (the check's real cost,
    # ~14 ns per sample of the dataset); only the first indices are copied out of it.
    first = list(itertools.islice(iter(sampler), first_k))
    rankscope.check_sampler(seed=int(sampler.seed), epoch=int(sampler.epoch), shuffle=bool(sampler.shuffle),
                            fingerprint=rankscope.fingerprint_indices(first, first_k),
                            num_indices=len(sampler), fail=fail)


from ._replicas import ReplicaCheck  # noqa: E402,F401  (silent data corruption; its own module)
