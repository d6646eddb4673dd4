"""Values still on a GPU, read on the host without a host-device sync.

Asking a CUDA tensor for its value (.item(), float(), bool()) makes the CPU wait until
the GPU has finished everything queued before it: the CPU cannot queue the next step
meanwhile, and the GPU idles while it does. A Readback copies the values into pinned host
memory asynchronously, records a CUDA event behind the copy on each device's current stream,
and hands them to its callback once the events have completed - usually a step or two
later, in the order they were put."""
import collections
import time


class Readback:
    MAX_PENDING = 64  # not yet landed; beyond this the oldest is waited for (64 steps old:
    #                   long finished on any GPU that is not hung)

    def __init__(self, on_landed):
        self._on_landed = on_landed  # on_landed(host tensors, payload), oldest first
        self._pending = collections.deque()  # (host tensors, events marking the copies done, payload)
        self.errors = 0  # entries whose callback raised (dropped)

    def put(self, values, payload):
        """values: CUDA tensors, read back together; payload goes to on_landed with them."""
        import torch
        hosts, events = [], {}
        for value in values:
            host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
            host.copy_(value, non_blocking=True)  # on the current stream of the value's device
            hosts.append(host)
            if value.device not in events:
                events[value.device] = None
        for device in events:  # the event on the stream each copy was queued on
            events[device] = torch.cuda.Event()
            events[device].record(torch.cuda.current_stream(device))
        self._queue(hosts, list(events.values()), payload)

    def _queue(self, hosts, events, payload):
        """Queues one entry, then hands over every landed one (the test doubles enter here)."""
        self._pending.append((hosts, events, payload))
        self.poll()
        if len(self._pending) > self.MAX_PENDING:
            hosts, events, payload = self._pending.popleft()
            for e in events:
                e.synchronize()
            self._hand_over(hosts, payload)

    def poll(self):
        while self._pending and all(e.query() for e in self._pending[0][1]):
            hosts, _, payload = self._pending.popleft()
            self._hand_over(hosts, payload)

    def _hand_over(self, hosts, payload):
        try:
            self._on_landed(hosts, payload)
        except Exception:  # one entry lost and counted, never the ones behind it
            self.errors += 1

    def finish(self, timeout_s=1.0):
        """Hands over what lands within timeout_s (at shutdown: a hung GPU must not hang the
        exit); returns how many entries were given up."""
        deadline = time.monotonic() + timeout_s
        try:
            while self._pending:
                self.poll()
                if not self._pending or time.monotonic() >= deadline:
                    break
                time.sleep(0.001)
        except Exception:  # the device is gone (a device-side assert): what is left is lost
            pass
        lost = len(self._pending)
        self._pending.clear()
        return lost

    def __len__(self):
        return len(self._pending)
