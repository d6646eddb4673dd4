"""Values still on a GPU, read on the host without a host-device sync.

Asking a CUDA tensor for its value (.item(), float(), bool()) makes the CPU wait until
the GPU has finished everything queued before it: the CPU cannot queue the next step
meanwhile, and the GPU idles while it does. A Readback copies the values into pinned host
memory asynchronously, records a CUDA event after the copy, and hands them to its callback
once the event has completed - usually a step or two later, in the order they were put."""
import collections
import time


class Readback:
    MAX_PENDING = 64  # not yet landed; beyond this the oldest is waited for (64 steps old:
    #                   long finished on any GPU that is not hung)

    def __init__(self, on_landed):
        self._on_landed = on_landed  # on_landed(host tensors, payload), oldest first
        self._pending = collections.deque()  # (host tensors, event marking the copy done, payload)

    def put(self, values, payload):
        """values: CUDA tensors, read back together; payload goes to on_landed with them."""
        import torch
        hosts = [torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for v in values]
        for host, value in zip(hosts, values):
            host.copy_(value, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._queue(hosts, done, payload)

    def _queue(self, hosts, done, payload):
        """Hands over every landed entry, then queues this one (the test doubles enter here)."""
        self.poll()
        self._pending.append((hosts, done, payload))
        if len(self._pending) > self.MAX_PENDING:
            hosts, done, payload = self._pending.popleft()
            done.synchronize()
            self._on_landed(hosts, payload)

    def poll(self):
        while self._pending and self._pending[0][1].query():
            hosts, _, payload = self._pending.popleft()
            self._on_landed(hosts, payload)

    def finish(self, timeout_s=1.0):
        """Hands over what lands within timeout_s (at shutdown: a hung GPU must not hang the
        exit); returns how many entries were given up."""
        deadline = time.monotonic() + timeout_s
        while self._pending:
            self.poll()
            if not self._pending or time.monotonic() >= deadline:
                break
            time.sleep(0.001)
        lost = len(self._pending)
        self._pending.clear()
        return lost

    def __len__(self):
        return len(self._pending)
