"""No-code mode: an unmodified torchrun script, recorded.

    rankscope run -- torchrun --nproc-per-node 8 train.py
    RANKSCOPE_AUTO=1 torchrun --nproc-per-node 8 train.py     # launchers that own the command line

The package installs `rankscope-auto.pth`, which Python runs at every interpreter's start: it
imports this module only when RANKSCOPE_AUTO=1. Here it acts only in a rank (RANK from
torchrun, or SLURM_PROCID), once: it sets RANKSCOPE_AUTO=started, so the rank's own children
(DataLoader workers, subprocesses) and the launcher itself are left alone.

What it finds without code, all through torch's own public hooks:
  run identity, heartbeats, exit causes     rankscope.init()
  every collective                         rankscope.torch.instrument()
  DDP's gradient all-reduce; forward       DDP found where it is built; its forward hooks
  FSDP2's collectives; forward             fully_shard found where it is called; the outermost
                                           sharded module's forward hooks
  loader_wait                              every DataLoader iterator (time blocked in next())
  backward, the step's loss                Tensor.backward(): what it was called on, when 0-d
  optimizer, the step boundary, lr         the global optimizer step hooks (the first optimizer)
What it cannot know is said once on rank 0, never guessed."""
import os
import sys


def _say_not_found(rankscope):
    if int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) or 0) == 0:
        rankscope.info("rankscope run: no-code mode: steps end at each optimizer.step() of the first optimizer, "
                       "the loss is what backward() was called on (scaled, under AMP's GradScaler), forward is "
                       "timed for DDP and FSDP2 (fully_shard) models; evaluation, checkpoints and invariant checks need the API or a "
                       "framework callback (docs/python.md)")


class _Steps:
    """The step as torch's global hooks see it, on the training thread."""

    def __init__(self, rankscope):
        self.rs = rankscope
        self.n = 0
        self.optimizer = None   # the first optimizer that steps: its steps are the training steps
        self.losses = []
        self.samples = 0
        self.forward_depth = 0  # sharded modules inside a sharded root: only the outermost times forward
        self.optimizer_phase = rankscope.phase("optimizer")
        self.backward_phase = rankscope.phase("backward")
        self.forward_phase = rankscope.phase("forward")

    def before_optimizer_step(self, optimizer, args, kwargs):
        if self.optimizer is None:
            self.optimizer = optimizer
        if optimizer is self.optimizer:
            self.optimizer_phase.__enter__()

    def after_optimizer_step(self, optimizer, args, kwargs):
        if optimizer is not self.optimizer:
            return
        self.optimizer_phase.__exit__(None, None, None)
        try:
            from .torch import _mean_loss
            self.rs.step(self.n, loss=_mean_loss(self.losses), lr=optimizer.param_groups[0].get("lr"),
                         samples=self.samples or None)
        except Exception as e:
            self.rs.warning("rankscope run: a step is not recorded", error=f"{type(e).__name__}: {e}")
        self.n += 1
        self.losses, self.samples = [], 0

    def wrap_backward(self, backward):
        steps = self

        def recorded_backward(tensor, *args, **kwargs):
            if tensor.dim() == 0 and tensor.requires_grad:
                steps.losses.append(tensor.detach())
            with steps.backward_phase:
                return backward(tensor, *args, **kwargs)

        recorded_backward.__wrapped__ = backward
        return recorded_backward

    def watch_forward(self, model):
        steps = self

        def before(module, args):
            if not module.training:
                return
            steps.forward_depth += 1
            if steps.forward_depth == 1:
                steps.forward_phase.__enter__()
                for a in args:
                    if hasattr(a, "shape") and len(a.shape) > 0:
                        steps.samples += int(a.shape[0])
                        break

        def after(module, args, output):
            if module.training and steps.forward_depth > 0:
                steps.forward_depth -= 1
                if steps.forward_depth == 0:
                    steps.forward_phase.__exit__(None, None, None)

        model.register_forward_pre_hook(before)
        model.register_forward_hook(after, always_call=True)  # a forward that raised closes it too


def start():
    """Called at interpreter start (rankscope-auto.pth) with RANKSCOPE_AUTO=1."""
    if "RANK" not in os.environ and "SLURM_PROCID" not in os.environ:
        return  # the launcher (torchrun's agent), or a plain process: not a rank
    os.environ["RANKSCOPE_AUTO"] = "started"  # the rank's children inherit this, and stay out
    try:
        import rankscope
        rankscope.init()
    except Exception as e:  # a bad setting: rankscope says why; the script runs unrecorded
        print(f"rankscope run: not recording this rank: {type(e).__name__}: {e}", file=sys.stderr)
        return
    try:
        import torch
        import torch.utils.data
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        import rankscope.torch as rst
        rst.instrument()
        steps = _Steps(rankscope)
        register_optimizer_step_pre_hook(steps.before_optimizer_step)
        register_optimizer_step_post_hook(steps.after_optimizer_step)
        torch.Tensor.backward = steps.wrap_backward(torch.Tensor.backward)
        loader_iter = torch.utils.data.DataLoader.__iter__

        def timed_iter(self):
            return rst.timed_loader(loader_iter(self))

        torch.utils.data.DataLoader.__iter__ = timed_iter
        _on_ddp_built(rst, steps)
        _on_fully_shard(steps)
        _say_not_found(rankscope)
    except Exception as e:  # torch absent or another layout: the run is recorded without it
        rankscope.warning("rankscope run: torch is not instrumented", error=f"{type(e).__name__}: {e}")


def _on_ddp_built(rst, steps):
    """DDP instrumented where it is built, and its forward timed."""
    rst._after_ddp_built("timed in forward (rankscope run)", steps.watch_forward)


def _on_fully_shard(steps):
    """FSDP2 found where fully_shard() is called: each module it returns gets the forward hooks
    (its collectives are recorded by instrument() already). Layers sharded inside a sharded root
    run within the root's forward: only the outermost opens the phase. The module attribute is
    replaced before the script imports it; `fully_shard.state` and the like are kept."""
    import functools
    import importlib
    import torch
    for name in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        original = getattr(mod, "fully_shard", None)
        if original is None or getattr(original, "_rankscope", False):
            continue

        @functools.wraps(original)
        def fully_shard(module, *args, _original=original, **kwargs):
            out = _original(module, *args, **kwargs)
            try:
                for m in out if isinstance(out, (list, tuple)) else [out]:
                    if isinstance(m, torch.nn.Module):
                        steps.watch_forward(m)
            except Exception as e:
                steps.rs.warning("rankscope run: an FSDP2 module's forward is not timed",
                                 error=f"{type(e).__name__}: {e}")
            return out

        fully_shard._rankscope = True
        setattr(mod, "fully_shard", fully_shard)
