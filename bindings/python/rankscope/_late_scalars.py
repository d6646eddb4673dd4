"""rankscope.step()'s tensor scalars: a loss or gradient norm still on the GPU is reported
when it lands on the host (a `step_scalars` line for its step), never with a sync.

step() (the extension) reads numbers, CPU tensors and numpy scalars itself, at once, and
calls take() when loss, lr or grad_norm is a CUDA tensor (`is_cuda`), or while earlier ones
are pending. CUDA scalars go through a Readback, and their values reach the run log a step
or two later as report_step_scalars(n, ...), which the numerics monitor, triage and the
report count as step n's. Never imports torch: a tensor in hand means torch is imported."""
import os
import sys

from . import _rankscope
from ._readback import Readback

_NAMES = ("loss", "lr", "grad_norm")
_late = None  # the Readback, made at the first CUDA tensor
_warned = False


def _deferrable(v):
    """A one-element CUDA tensor of its own (a DTensor, or several elements: read now, as before)."""
    torch = sys.modules.get("torch")
    return (torch is not None and isinstance(v, torch.Tensor) and v.is_cuda and v.numel() == 1
            and not hasattr(v, "to_local"))


def _landed(hosts, payload):
    n, which = payload
    _rankscope.report_step_scalars(n, **{_NAMES[i]: float(h) for i, h in zip(which, hosts)})


def _warn_once(what, **fields):
    global _warned
    if not _warned and _rankscope.initialized():
        _warned = True
        _rankscope.warning(what, **fields)


def take(n, loss, lr, grad_norm):
    """Step n's scalars: (loss, lr, grad_norm) to read now, None for each one read back later."""
    global _late
    now = [loss, lr, grad_norm]
    which, values = [], []
    for i, v in enumerate(now):
        if v is not None and _deferrable(v):
            which.append(i)
            values.append(v.detach())
            now[i] = None
    if values:
        if _late is None:
            _late = Readback(_landed)
            import atexit
            atexit.register(finish)  # before the extension's own exit hook: Python's run first
        try:
            _late.put(values, (n, tuple(which)))
        except Exception as e:  # never into training: these scalars are lost, said once
            _warn_once("rankscope.step(): cannot read the scalars back from the GPU; they are not recorded",
                       error=f"{type(e).__name__}: {e}", step=n)
    elif _late is not None:
        _late.poll()
    _rankscope._set_scalars_pending(_late is not None and len(_late) > 0)  # step() polls through take() meanwhile
    return tuple(now)


def finish(timeout_s=1.0):
    """Writes what has landed, waiting up to timeout_s; shutdown() and the exit call it."""
    if _late is None:
        return
    lost = _late.finish(timeout_s)
    _rankscope._set_scalars_pending(False)
    if lost:
        _warn_once("rankscope.step(): the GPU did not hand back the last steps' scalars at shutdown", steps=lost)
    if _late.errors:
        _warn_once("rankscope.step(): scalars read back from the GPU could not be recorded", entries=_late.errors)


def _forget():  # a forked child: the parent's events and pinned copies are not its own
    global _late
    _late = None


os.register_at_fork(after_in_child=_forget)
