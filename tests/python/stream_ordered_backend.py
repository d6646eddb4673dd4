"""A process-group backend with NCCL's shape, for tests without a GPU.

NCCL does not run a collective on the calling thread: it enqueues a kernel on a CUDA stream
and returns at once; the kernel runs on the device until every peer has taken part, and the
host sees the result only at its next sync (`loss.item()`, `torch.cuda.synchronize()`). So on
a GPU the host of a rank whose peer never issued all_reduce #K does not hang inside #K: it
hangs later, at a sync, while its GPU is stuck in #K. This backend reproduces exactly that on
CPU, through tests/fake_cudart.c (the CUDA runtime rankscope finds through
RANKSCOPE_CUDA_RUNTIME):

- it is registered through torch.distributed's public backend API
  (`Backend.register_backend`), so `init_process_group(NAME)` and every `torch.distributed`
  call use it as they would use NCCL;
- each collective enqueues a kernel on the current stream (the legacy default stream, which is
  what rankscope sees with a CPU-only torch) that runs until the collective is done, and
  returns a work that is already complete for the host, as NCCL's is (its `wait()` only orders
  the current stream after the collective: the same stream here);
- one worker thread per backend runs the collectives over gloo in issue order (NCCL's stream
  order) and then lets each kernel finish;
- `synchronize()` is the host's sync: it returns once the stream has run everything enqueued.
"""
import atexit
import ctypes
import os
import queue
import threading

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as c10d
from torch._C._distributed_c10d import Backend, _create_work_from_future

NAME = "fake_nccl"
_DEFAULT_STREAM = None  # the legacy default stream: what rankscope records on with a CPU-only torch


def _fake_cuda():
    lib = ctypes.CDLL(os.environ["RANKSCOPE_CUDA_RUNTIME"])  # the same library rankscope loaded
    for name in ("fake_cuda_block", "fake_cuda_release", "fake_cuda_synchronize"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
        getattr(lib, name).restype = None
    return lib


class StreamOrderedBackend(Backend):
    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore(NAME, store), rank, size, timeout)
        self._cuda = _fake_cuda()
        self._queue = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._stream, name=f"{NAME} stream", daemon=True)
        self._worker.start()
        atexit.register(self._stop)  # a daemon thread left in torch's code at exit aborts the process

    def getBackendName(self):
        return NAME

    def _stop(self):
        self._queue.put(None)
        self._worker.join()

    def _stream(self):
        while (run := self._queue.get()) is not None:
            try:
                run().wait()
            finally:
                self._cuda.fake_cuda_release(_DEFAULT_STREAM)  # the kernel finishes

    def _enqueue(self, run):
        self._cuda.fake_cuda_block(_DEFAULT_STREAM)  # runs until the peers have taken part
        self._queue.put(run)
        done = torch.futures.Future()
        done.set_result(None)
        return _create_work_from_future(done)  # the host returns at once, as with NCCL

    # The options arrive as a reference to a C++ temporary: copied before the call returns.
    def allreduce(self, tensors, opts):
        o = c10d.AllreduceOptions()
        o.reduceOp = opts.reduceOp
        return self._enqueue(lambda: self._gloo.allreduce(tensors, o))

    def broadcast(self, tensors, opts):
        o = c10d.BroadcastOptions()
        o.rootRank, o.rootTensor = opts.rootRank, opts.rootTensor
        return self._enqueue(lambda: self._gloo.broadcast(tensors, o))

    def allgather(self, outputs, inputs, opts):
        return self._enqueue(lambda: self._gloo.allgather(outputs, inputs, c10d.AllgatherOptions()))

    def barrier(self, opts):
        return self._enqueue(lambda: self._gloo.barrier(c10d.BarrierOptions()))


def register():
    dist.Backend.register_backend(NAME, StreamOrderedBackend, devices=["cpu"])


def synchronize():
    """The host waits for its (fake) GPU, as `torch.cuda.synchronize()` does."""
    _fake_cuda().fake_cuda_synchronize(_DEFAULT_STREAM)
