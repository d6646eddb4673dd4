"""rankscope for the Hugging Face Trainer, in one line:

    from rankscope.integrations.transformers import RankscopeCallback
    trainer = Trainer(model, args, train_dataset=..., callbacks=[RankscopeCallback()])

Under torchrun (or accelerate launch) every rank then writes its run log, heartbeats and
flight recorder as a hand-instrumented script does: the step (Trainer's global_step, so
step numbers match the Trainer's own logs and checkpoint names), the time blocked in the
training DataLoader (loader_wait), forward (the model's forward hooks), backward (to the
optimizer step, gradient clipping included), optimizer, eval and checkpoint saves as phases;
every collective, DDP's gradient all-reduce included; each rank's own loss per step (the
mean over its micro-batches under gradient accumulation, read back without a sync - the
Trainer's logged loss is averaged over ranks and steps, and hides a NaN by default), the
learning rate the step used, grad_norm on logging steps, samples and tokens; each save as
a checkpoint record; an exception, a hang or a NaN on one rank named by `rankscope triage`.
"""
import rankscope
from transformers import TrainerCallback

from . import _recorder
from ._recorder import never_raises


class RankscopeCallback(TrainerCallback):
    """Records a transformers.Trainer run with rankscope; add it to `callbacks=[...]`.
    Starts rankscope (init, torch.distributed and DDP instrumented) unless the script did."""

    def __init__(self):
        _recorder.start()
        self._rec = _recorder.StepRecorder()
        self._after_step = []        # phases to run after a step's end, in the Trainer's order
        self._awaiting_log = False   # the step's log comes before its eval and save

    # -- the run -----------------------------------------------------------------------
    @never_raises
    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        if model is not None:
            self._rec.watch(model)
        if getattr(args, "average_tokens_across_devices", False):
            self._rec.items_scale = max(1, int(args.world_size))
        if train_dataloader is not None:
            _recorder.time_batches(train_dataloader)
        rankscope.begin_step(state.global_step + 1)

    @never_raises
    def on_train_end(self, args, state, control, **kwargs):
        self._rec.switch(None)
        self._rec.in_step = False
        self._rec.unwatch()
        rankscope.flush()

    # -- one optimizer step: micro-batches, then clip and step ---------------------------
    @never_raises
    def on_step_begin(self, args, state, control, **kwargs):
        self._rec.switch(None)  # an eval or save the Trainer did not report back ends here
        self._after_step = []
        self._rec.in_step = True

    @never_raises
    def on_substep_end(self, args, state, control, **kwargs):
        self._rec.switch(None)  # a micro-batch's backward has returned (gradient accumulation)

    @never_raises
    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self._rec.switch("optimizer")

    @never_raises
    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self._rec.switch(None)
        try:  # the rate this step used: the scheduler steps after this hook
            self._rec.lr = optimizer.param_groups[0]["lr"]
        except Exception:
            pass

    @never_raises
    def on_step_end(self, args, state, control, **kwargs):
        self._rec.in_step = False
        self._rec.end_step(state.global_step)
        self._then(control)

    @never_raises
    def on_epoch_end(self, args, state, control, **kwargs):
        self._then(control)  # an epoch-strategy eval or save follows

    # -- what follows a step: log, eval, save (DefaultFlowCallback decided, it runs first) --
    def _then(self, control):
        self._after_step = (["eval"] if control.should_evaluate else []) + \
                           (["checkpoint_save"] if control.should_save else [])
        self._awaiting_log = bool(control.should_log)
        if not self._awaiting_log:
            self._next()

    def _next(self):
        self._rec.switch(self._after_step.pop(0) if self._after_step else None)

    @never_raises
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "grad_norm" in logs and "loss" in logs:  # a training log: this step's norm
            try:
                rankscope.report_step_scalars(state.global_step, grad_norm=float(logs["grad_norm"]))
            except Exception as e:
                _recorder.say_once("grad_norm is not recorded", e)
        if self._awaiting_log:
            self._awaiting_log = False
            self._next()

    @never_raises
    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self._rec.open_phase == "eval":
            self._next()
        if metrics:
            rankscope.info("evaluation", step=state.global_step,
                           **{k: v for k, v in metrics.items() if isinstance(v, (int, float))})
            # One key per dataset: `eval_loss`, or `eval_<name>_loss` when eval_dataset is a dict.
            for key, value in metrics.items():
                if key.startswith("eval_") and key.endswith("loss") and isinstance(value, (int, float)):
                    name = key[len("eval_"):-len("loss")].rstrip("_")
                    rankscope.report_evaluation(float(value), name=name or "eval")

    @never_raises
    def on_save(self, args, state, control, **kwargs):
        if self._rec.open_phase == "checkpoint_save":
            self._next()
        try:
            world = max(1, int(args.world_size))
            global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
            rankscope.record_checkpoint_save(id=f"checkpoint-{state.global_step}", step=state.global_step,
                                             consumed_samples=state.global_step * global_batch, world_size=world,
                                             global_batch=global_batch, optimizer_step=state.global_step)
        except Exception as e:
            _recorder.say_once("a checkpoint save is not recorded", e)
