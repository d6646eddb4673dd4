"""What the framework callbacks share: starting rankscope where the script did not, and
recording a step from the framework's hooks on the training thread.

The framework calls us between its own steps; nothing here may raise into it: a failure
is said once (a warning in the run log) and that part stops being recorded."""
import functools

import rankscope

_said = set()


def never_raises(hook):
    """A framework hook that records and never raises into the training loop: a failure is
    said once, by hook name, and training goes on."""
    @functools.wraps(hook)
    def guarded(*args, **kwargs):
        try:
            hook(*args, **kwargs)
        except Exception as e:
            say_once(f"{hook.__qualname__} failed; what it records is missing", e)
        return None

    return guarded


def say_once(what, error):
    """Warns once per `what`: something the integration could not record."""
    if what not in _said:
        _said.add(what)
        rankscope.warning(f"rankscope.integrations: {what}", error=f"{type(error).__name__}: {error}")


def start():
    """rankscope.init() unless the script did it, every torch.distributed and functional
    collective recorded, and every DDP built from now on instrumented where it is built
    (frameworks wrap the model themselves, inside their fit() or train())."""
    if not rankscope.initialized():
        rankscope.init()
    import rankscope.torch as rst
    rst.instrument()
    rst.instrument_ddp_when_built()


_set_class = object.__dict__["__class__"].__set__
_timed_classes = {}  # (a class, the method timed) -> its subclass whose method is timed


def _time_method(obj, method, make):
    """Swaps `obj`'s class for a subclass of its own whose `method` is make(original): only
    this object changes and every isinstance() check still holds. Returns whether it did."""
    cls = type(obj)
    if getattr(cls, "_rankscope_timed", None) == method:
        return True
    sub = _timed_classes.get((cls, method))
    if sub is None:
        sub = type(cls.__name__, (cls,), {method: make(getattr(cls, method)), "_rankscope_timed": method,
                                          "__module__": cls.__module__, "__qualname__": cls.__qualname__})
        _timed_classes[(cls, method)] = sub
    try:  # through object's own descriptor: accelerate's loaders define a read-only __class__ property
        _set_class(obj, sub)
    except TypeError as e:  # __slots__ or a C type: its wait is not timed
        say_once("the data loader's wait is not timed", e)
        return False
    return True


def time_batches(loader):
    """Makes each next() on the iterators of `loader` (a DataLoader the framework iterates
    itself) a loader_wait phase, as rankscope.torch.timed_loader does."""
    import rankscope.torch as rst

    def make(original):
        def __iter__(self):
            return rst.timed_loader(original(self))
        return __iter__

    return _time_method(loader, "__iter__", make)


def time_next(fetcher):
    """Makes each next() on `fetcher` (an iterator the framework keeps, such as Lightning's
    data fetcher) a loader_wait phase."""
    wait = rankscope.phase("loader_wait")

    def make(original):
        def __next__(self):
            with wait:
                return original(self)
        return __next__

    return _time_method(fetcher, "__next__", make)


def first_tensor(args, kwargs):
    """The batch's first tensor: input_ids, else the first tensor argument, or the first
    tensor inside an argument that is a mapping, list or tuple (a batch passed whole)."""
    import torch
    for v in (kwargs.get("input_ids"), *args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            return v
        inside = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else ()
        for t in inside:
            if isinstance(t, torch.Tensor):
                return t
    return None


def loss_of(output):
    """The loss a forward returned: `.loss` of a transformers ModelOutput, "loss" of a mapping,
    or a 0-d tensor; None when it returned none (the loss is computed outside the model)."""
    import torch
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if loss is None and isinstance(output, torch.Tensor) and output.dim() == 0:
        loss = output
    return loss.detach() if isinstance(loss, torch.Tensor) and loss.dim() == 0 else None


class StepRecorder:
    """One training step as a framework's hooks see it, on the training thread: the phase
    between two hooks (one at a time, opened and closed by this recorder only, so phases
    the user opens nest around or inside it), the model's forward (module hooks), and the
    step's loss, samples and tokens - all without a host-device sync: the loss stays a
    tensor until rankscope.step() reads it back asynchronously."""

    def __init__(self):
        self._open = None
        self._hooks = []
        # transformers passes the step's token count to the model (num_items_in_batch): each
        # micro-batch's loss is then its share of the step's, summed, not averaged; counted
        # over every rank (average_tokens_across_devices) it is scaled back by this factor.
        self.items_scale = 1
        self.in_step = False  # between the framework's step start and end: eval forwards are not counted
        self.reset()

    def reset(self):
        self.losses, self.samples, self.tokens, self.lr = [], 0, 0, None
        self.shares = False  # the micro-batch losses are shares of the step's (num_items_in_batch)

    @property
    def open_phase(self):
        """The name of the phase this recorder has open, or None."""
        return self._open.name if self._open is not None else None

    def switch(self, name):
        """Closes the phase this recorder opened, then opens `name` (None: none)."""
        p, self._open = self._open, None
        if p is not None:
            p.__exit__(None, None, None)
        if name is not None:
            p = rankscope.phase(name)
            p.__enter__()
            self._open = p

    def watch(self, model, forward=True):
        """Hooks `model`'s forward: with forward=True it is the forward phase and backward
        starts when it returns; in any case the loss it returns and the batch it was given
        (samples: the first dimension; tokens: input_ids' size) are the step's."""
        if self._hooks:
            return
        self._forward = forward
        try:
            self._hooks = [model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
                           model.register_forward_hook(self._after_forward)]
        except Exception as e:
            say_once("the model's forward is not timed", e)

    def unwatch(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _before_forward(self, module, args, kwargs):
        if not (self.in_step and module.training):
            return None
        try:
            if self._forward:
                self.switch("forward")
            if kwargs.get("num_items_in_batch") is not None:
                self.shares = True
            t = first_tensor(args, kwargs)
            if t is not None and t.dim() > 0:
                self.samples += int(t.shape[0])
                ids = kwargs.get("input_ids")
                if ids is not None and hasattr(ids, "numel"):
                    self.tokens += int(ids.numel())
        except Exception as e:
            say_once("a forward's batch is not counted", e)
        return None

    def _after_forward(self, module, args, output):
        if not (self.in_step and module.training):
            return None
        try:
            loss = loss_of(output)
            if loss is not None:
                self.losses.append(loss)
            if self._forward:
                self.switch("backward")
        except Exception as e:
            say_once("a forward's loss is not read", e)
        return None

    def step_loss(self):
        """The step's loss on this rank, a tensor: the mean over its micro-batches (gradient
        accumulation), or their sum when each is a share of the step's (num_items_in_batch)."""
        if not self.losses:
            return None
        if self.shares:
            import torch
            total = self.losses[0] if len(self.losses) == 1 else torch.stack(self.losses).sum()
            return total * self.items_scale if self.items_scale != 1 else total
        from rankscope.torch import _mean_loss
        return _mean_loss(self.losses)

    def end_step(self, n, loss=None, lr=None):
        """Closes the open phase and ends step n with what the step gathered (`loss`/`lr`
        given here win)."""
        self.switch(None)
        try:
            loss = loss if loss is not None else self.step_loss()
            rankscope.step(n, loss=loss, lr=lr if lr is not None else self.lr,
                           samples=self.samples or None, tokens=self.tokens or None)
        except Exception as e:
            say_once("a step is not recorded", e)
        self.reset()
