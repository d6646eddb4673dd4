"""rankscope for PyTorch Lightning, in one line:

    from rankscope.integrations.lightning import RankscopeCallback
    trainer = L.Trainer(..., callbacks=[RankscopeCallback()])

Under torchrun (or Lightning's own launcher) every rank then writes its run log,
heartbeats and flight recorder as a hand-instrumented script does: the step (Lightning's
global_step: optimizer steps, so gradient accumulation is counted right), the wait for the
next batch (loader_wait, at Lightning's data fetcher), training_step (forward), backward,
the optimizer step, validation (eval) and checkpoint writes (checkpoint_save, with a failed
write recorded) as phases; every collective, DDP's gradient all-reduce included; each
rank's own loss per step (what training_step returned, the mean over accumulated batches,
read back without a sync), the learning rate and the samples of each step.

The `lightning` package is used where it is installed, else `pytorch_lightning`."""
import rankscope

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package
    from pytorch_lightning import Callback

from . import _recorder
from ._recorder import never_raises


class RankscopeCallback(Callback):
    """Records a Lightning run with rankscope; add it to `Trainer(callbacks=[...])`. Starts
    rankscope (init, torch.distributed and DDP instrumented) unless the script did."""

    def __init__(self):
        _recorder.start()
        self._rec = _recorder.StepRecorder()
        self._ended = 0  # global_step at the last step this callback ended
        self._micro = 0  # the last training batch's size

    @never_raises
    def on_train_start(self, trainer, pl_module):
        self._ended = trainer.global_step
        rankscope.begin_step(self._ended + 1)
        self._time_data(trainer)
        self._time_checkpoint_writes(trainer)

    @never_raises
    def on_train_epoch_start(self, trainer, pl_module):
        self._time_data(trainer)  # the fetcher is made again when the loaders are reloaded

    def _time_data(self, trainer):
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        if fetcher is not None:
            _recorder.time_next(fetcher)

    def _time_checkpoint_writes(self, trainer):
        io = trainer.strategy.checkpoint_io
        if getattr(io.save_checkpoint, "_rankscope", False):
            return
        write = io.save_checkpoint

        def save_checkpoint(checkpoint, path, *args, **kwargs):
            with rankscope.checkpoint("save", str(path)):
                return write(checkpoint, path, *args, **kwargs)

        save_checkpoint._rankscope = True
        io.save_checkpoint = save_checkpoint

    @never_raises
    def on_train_end(self, trainer, pl_module):
        self._rec.switch(None)
        rankscope.flush()

    # -- one batch: training_step, backward, and every accumulate_grad_batches an optimizer step --
    @never_raises
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._rec.in_step = True
        self._rec.switch("forward")
        t = _recorder.first_tensor((batch,), {})
        if t is not None and t.dim() > 0:
            self._micro = int(t.shape[0])
            self._rec.samples += self._micro

    @never_raises
    def on_before_backward(self, trainer, pl_module, loss):
        self._rec.switch("backward")

    @never_raises
    def on_after_backward(self, trainer, pl_module):
        self._rec.switch(None)

    @never_raises
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self._rec.switch("optimizer")
        self._rec.lr = optimizer.param_groups[0]["lr"]

    @never_raises
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._rec.switch(None)
        loss = _recorder.loss_of(outputs)
        if loss is not None:
            self._rec.losses.append(loss)
        if trainer.global_step != self._ended:  # the optimizer stepped: the step ends here
            self._ended = trainer.global_step
            self._rec.in_step = False
            self._rec.end_step(trainer.global_step)

    # -- validation -------------------------------------------------------------------
    @never_raises
    def on_validation_start(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self._rec.switch("eval")

    @never_raises
    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        self._rec.switch(None)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if getattr(v, "numel", lambda: 1)() == 1}
        if metrics:
            rankscope.info("evaluation", step=trainer.global_step, **metrics)
        # What validation_step logged as its loss (self.log("val_loss", ...)), by the usual names.
        for key in ("val_loss", "val/loss", "validation_loss", "valid_loss"):
            if key in metrics:
                rankscope.report_evaluation(metrics[key], name="eval")
                break

    @never_raises
    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        world = max(1, trainer.world_size)
        global_batch = self._micro * trainer.accumulate_grad_batches * world
        rankscope.record_checkpoint_save(id=f"step={trainer.global_step}", step=trainer.global_step,
                                         consumed_samples=trainer.global_step * global_batch, world_size=world,
                                         global_batch=global_batch, optimizer_step=trainer.global_step)
