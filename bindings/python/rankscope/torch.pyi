# Type stubs for rankscope.torch: the PyTorch integration (pure Python over the
# rankscope module). torch objects are typed loosely (Any) so the stubs do not
# pin a torch version; the supported range is torch 1.13 .. 2.x.
from typing import Any, Iterable, Iterator, List, Optional, TypeVar

from . import BatchAccounting

_T = TypeVar("_T")

def instrument() -> None:
    """Wraps torch.distributed's collectives (all_reduce, broadcast, reduce, all_gather,
    all_gather_into_tensor, reduce_scatter, all_to_all, barrier, send/recv and the *_object
    variants) with rankscope collective spans; async work is measured to completion via wait().
    Also copies PyTorch's own flight recorder next to each of rankscope's flight dumps
    (rank-<R>.torch-flight.json), which triage reads. Idempotent."""
    ...

def uninstrument() -> None:
    """Restores every function instrument() wrapped."""
    ...

def instrument_ddp(ddp_model: Any, per_bucket: bool = False) -> None:
    """Makes DDP's gradient all-reduce a collective span: by default one per backward pass in
    which DDP all-reduces (opened before DDP launches a bucket, ended when DDP has finished
    all-reducing; C++ hooks on the gradient accumulators, one per bucket once DDP has rebuilt
    its buckets, no Python per step; none after a forward under model.no_sync()), or with
    per_bucket=True one per bucket
    through a DDP comm hook (exact, but a Python comm hook costs DDP ~60-80 us per step).
    Calling it again does nothing; a deep copy of the model is not instrumented. Under torch 2.x
    compiled autograd use per_bucket=True (compiled autograd rejects the C++ hooks)."""
    ...

class TorchStoreExchange:
    """The invariant checks' exchange over the job's c10d store; never blocks past its timeout
    and names the ranks that did not arrive."""
    def __init__(self, store: Any = None, prefix: str = "rankscope/x/") -> None: ...
    def gather(self, key: str, payload: bytes, timeout_s: float) -> List[bytes]: ...

def use_torch_exchange(timeout_s: float = 60.0, store: Any = None) -> None:
    """Makes the invariant checks compare ranks online over torch.distributed's store."""
    ...

def timed_loader(iterable: Iterable[_T], accounting: Optional[BatchAccounting] = None) -> Iterator[_T]:
    """Yields from `iterable`, timing each blocking next() as the loader_wait phase; with a
    BatchAccounting, every batch is counted."""
    ...

class AmpSkips:
    """Counts optimizer steps GradScaler skipped (the scale decreases after update()), with no
    host-device sync: a CUDA step's result is counted once its async copy has landed."""
    skipped: int
    def __init__(self, scaler: Any) -> None: ...
    def update(self, new_scale: Any = None) -> None:
        """scaler.update(new_scale), and counts the step if GradScaler skipped it."""
        ...

def record_cuda_memory(device: Optional[int] = None) -> bool:
    """Sets the rankscope_cuda_memory_{allocated,reserved}_bytes gauges; False without CUDA."""
    ...

def check_distributed_sampler(sampler: Any, epoch: Optional[int] = None, first_k: int = 1024,
                              fail: bool = False) -> None:
    """Sampler invariants from a DistributedSampler: seed, epoch, shuffle, index fingerprint."""
    ...

class ReplicaCheck:
    """Every `every` calls, checks that data-parallel replicas hold bit-identical parameters."""
    mismatches: int
    def __init__(self, model: Any, every: int = 500, group: Any = None) -> None: ...
    def __call__(self) -> int: ...

def instrument_ddp_when_built(per_bucket: bool = False) -> None:
    """Instruments every DistributedDataParallel built from now on, as its construction returns
    (instrument_ddp): for code that wraps the model itself, such as a framework's fit() or
    train(). Idempotent; a DDP built before is not touched."""
    ...
