"""Functional collectives (torch.ops._c10d_functional) as collective spans.

What DTensor, tensor parallelism and torch.compile'd graphs issue never passes
through torch.distributed's Python functions, so it is seen at the dispatcher: a
kernel at the ADInplaceOrView key (which every tensor op passes and these ops fall
through) records the span and redispatches below it, leaving autograd and the
backends' kernels as they are. No private torch state is read. The span completes
when wait_tensor() is called on an output (or the output dies unwaited).
"""
import weakref

import torch
import torch.distributed as dist

import rankscope
from . import _rankscope as _rs

_FUNCTIONAL_OPS = {
    "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce", "all_reduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all", "broadcast": "broadcast", "broadcast_": "broadcast",
}
_lib = None
_pending = {}   # storage address of an output -> (span, wait phase name), until wait_tensor or the output dies
_comms = {}     # group name -> communicator
_communicator = None  # rankscope.torch's: process group -> communicator
_wait_phase_name = None  # rankscope.torch's: op -> the phase of its wait
_stream_ordered = None  # rankscope.torch's: process group -> whether it runs on a CUDA stream
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _communicator_named(group_name):
    """(communicator, whether its backend is stream-ordered) of a group, by its name."""
    c = _comms.get(group_name)
    if c is None:
        pg = dist.distributed_c10d._resolve_process_group(group_name)
        group = None if pg is dist.group.WORLD else pg
        c = _comms[group_name] = (_communicator(group), _stream_ordered(group))
    return c


def _end_pending(key, ok=True):
    entry = _pending.pop(key, None)
    if entry is not None:
        entry[0].end(ok)


def _functional_kernel(overload, op, group_arg):
    below = torch._C._AutoDispatchBelowADInplaceOrView
    enabled = rankscope.enabled

    def kernel(*args, **kwargs):
        first = args[0]
        tensors = [t for t in (first if isinstance(first, (list, tuple)) else [first]) if isinstance(t, torch.Tensor)]
        # Only real data: not while a compiler traces the op with fake or functional tensors.
        if not enabled() or not all(type(t) in _PLAIN_TENSORS for t in tensors):
            with below():
                return overload(*args, **kwargs)
        group = args[group_arg] if group_arg < len(args) else kwargs.get("group_name")
        comm, stream_ordered = _communicator_named(group)
        # On a CUDA stream (NCCL): timed there, and complete when the device is, since the
        # wait_tensor() that ends the span only makes the current stream wait for it.
        on_device = stream_ordered or any(t.is_cuda for t in tensors[:1])
        span = _rs.collective(comm, op, sum(t.numel() for t in tensors),
                              str(tensors[0].dtype) if tensors else "unknown", -1, on_device)
        wait_name = _wait_phase_name(op)
        try:
            with below():
                out = overload(*args, **kwargs)
        except Exception:
            span.end(False)
            raise
        # Complete when wait_tensor() is called on an output (or the output dies unwaited).
        for t in out if isinstance(out, (list, tuple)) else [out]:
            key = t.untyped_storage().data_ptr()
            _pending[key] = (span, wait_name)
            weakref.finalize(t, _end_pending, key)
        return out

    return kernel


def _wait_kernel(overload):
    below = torch._C._AutoDispatchBelowADInplaceOrView

    def kernel(tensor):
        entry = _pending.get(tensor.untyped_storage().data_ptr()) if _pending and type(tensor) in _PLAIN_TENSORS else None
        if entry is None:
            with below():
                return overload(tensor)
        with _rs.phase(entry[1]), below():  # blocked on the collective: communication, whatever phase encloses it
            out = overload(tensor)
        _end_pending(tensor.untyped_storage().data_ptr())
        return out

    return kernel


def instrumented():
    return _lib is not None


def instrument(communicator, wait_phase_name, stream_ordered):
    """Registers the kernels; `communicator` maps a process group (None: the default) to its
    communicator, `wait_phase_name` an op to the phase its wait_tensor() is, `stream_ordered`
    a process group to whether its collectives run on a CUDA stream."""
    global _lib, _communicator, _wait_phase_name, _stream_ordered
    _communicator = communicator
    _wait_phase_name = wait_phase_name
    _stream_ordered = stream_ordered
    ns = torch.ops._c10d_functional
    lib = torch.library.Library("_c10d_functional", "IMPL")
    for name, op in _FUNCTIONAL_OPS.items():
        try:
            overload = getattr(ns, name).default
        except (AttributeError, RuntimeError):  # not in this torch
            continue
        group_arg = next((i for i, a in enumerate(overload._schema.arguments) if a.name == "group_name"), None)
        if group_arg is not None:
            lib.impl(name, _functional_kernel(overload, op, group_arg), "ADInplaceOrView")
    lib.impl("wait_tensor", _wait_kernel(ns.wait_tensor.default), "ADInplaceOrView")
    _lib = lib


def uninstrument():
    global _lib
    if _lib is not None:
        _lib._destroy()
        _lib = None
    _comms.clear()
