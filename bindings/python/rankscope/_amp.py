"""rst.AmpSkips: optimizer steps GradScaler skipped, counted without a host-device sync."""
import rankscope
from . import _rankscope as _rs
from ._readback import Readback


class AmpSkips:
    """Counts optimizer steps GradScaler skipped (inf/NaN gradients: the scale went
    down in update()). Call update() instead of scaler.update().

    Never a host-device sync: asking GradScaler for its scale (get_scale()) waits for
    the GPU, which would stop the CPU from queueing the next step. The comparison
    stays on the device; its result is copied to host memory asynchronously and
    counted once that copy has landed, a step or two later. `skipped` is the count
    so far; each skipped step also makes the next rankscope.step() end with
    skipped=True, so a run of them is reported as a skip storm."""

    def __init__(self, scaler):
        self._scaler = scaler
        self._counter = rankscope.counter("rankscope_amp_skipped_steps_total", "Optimizer steps skipped by GradScaler")
        self._readback = Readback(lambda hosts, _: self._count(bool(hosts[0])))  # the CUDA results
        self.skipped = 0

    def update(self, new_scale=None):
        scaler = self._scaler
        scale = getattr(scaler, "_scale", None) if scaler.is_enabled() else None
        if scale is None:  # disabled, or no scale() yet (GradScaler's own error then)
            return scaler.update(new_scale)
        before = scale.clone()  # update() changes the scale in place
        scaler.update(new_scale)
        try:
            went_down = scaler._scale < before
            if went_down.device.type == "cuda":
                self._readback.put([went_down], None)
            else:  # the CPU (no sync to avoid); other devices: read now
                self._count(bool(went_down))
        except Exception as e:  # never into training: a lost count is logged once
            if not getattr(self, "_warned", False):
                self._warned = True
                rankscope.warning("rst.AmpSkips: cannot compare GradScaler's scale; skipped steps are not counted",
                                  error=f"{type(e).__name__}: {e}")

    def _count(self, skipped):
        if skipped:
            self.skipped += 1
            self._counter.add(1)
            _rs._note_skipped_step()  # the next rankscope.step() ends skipped: skip storms (numerics)
