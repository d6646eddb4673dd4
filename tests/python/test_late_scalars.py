"""rankscope.step(loss=<a CUDA tensor>): read back without a host-device sync and written a
few steps later as a step_scalars line, which the numerics monitor and triage count as its
step's. No GPU here: tensors of a subclass whose is_cuda is True stand for CUDA ones, and the CUDA
copy and event are doubles with their call shape (Readback._queue is where the real put()
hands them over); the rest is the real package."""
import json
import os
import subprocess
import sys
import textwrap

from conftest import FAKE_CUDA_EVENT, run_log_events

RANKSCOPE = os.path.join(os.path.dirname(sys.executable), "rankscope")


def test_a_gpu_loss_is_written_when_it_lands_and_a_late_nan_is_still_named_at_its_step(run_py, tmp_path):
    p = run_py(FAKE_CUDA_EVENT + textwrap.dedent("""
        import os, torch, rankscope
        from rankscope import _late_scalars, _readback

        events = []
        def put(self, values, payload):  # what the real put() queues, without CUDA
            events.append(Event())
            self._queue([v.clone() for v in values], [events[-1]], payload)
        _readback.Readback.put = put
        class Cuda(torch.Tensor):  # what step() and _late_scalars ask a tensor: is_cuda
            is_cuda = property(lambda self: True)

        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(40):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step == 30:
                loss = loss * float("nan")
            for ev in events[:-2]:
                ev.landed = True  # the GPU is still on the last two steps
            rankscope.step(step, loss=loss.as_subclass(Cuda), grad_norm=grad_norm.as_subclass(Cuda), lr=0.01,
                           samples=8)
        events[-3].landed = True          # step 37's lands; a step without tensors still polls
        rankscope.step(40, loss=1.0)
        print(len(_late_scalars._late))   # two on the "GPU": steps 38, 39
        rankscope.shutdown()              # waits for them, then says so
    """))
    assert p.stdout.split() == ["2"], p.stdout + p.stderr
    run = str(tmp_path / "run")
    ends = run_log_events(run, "step_end")
    assert len(ends) == 41 and not any("loss" in e or "grad_norm" in e for e in ends[:40]), ends[:2]
    assert all(e["lr"] == 0.01 and e["samples"] == 8 for e in ends[:40])  # plain numbers: at once, as before
    late = run_log_events(run, "step_scalars")
    assert [e["step"] for e in late] == list(range(38)), late  # in order; 38 and 39 never landed
    assert all(set(e) >= {"loss", "grad_norm"} for e in late)
    assert late[30]["loss"] == "NaN" and late[29]["loss"] > 0, late[29:31]
    nan = [e for e in run_log_events(run, "numerics") if e["what"] == "nonfinite"]
    assert len(nan) == 1 and nan[0]["step"] == 30 and nan[0]["msg"] == "loss is NaN at step 30", nan
    lost = [e for e in run_log_events(run, "log") if "did not hand back" in e["msg"]]
    assert len(lost) == 1 and lost[0]["fields"]["steps"] == 2, lost

    t = subprocess.run([RANKSCOPE, "triage", "--json", run], capture_output=True, text=True, timeout=60)
    findings = json.loads(t.stdout)["findings"]
    assert findings[0]["kind"] == "numerics" and findings[0]["step"] == 30 and findings[0]["ranks"] == [0], findings


def test_cpu_tensors_and_numbers_are_read_at_once_and_a_failed_readback_never_reaches_training(run_py, tmp_path):
    p = run_py("""
        import os, numpy, torch, rankscope
        from rankscope import _readback
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        rankscope.step(0, loss=torch.tensor(2.5), grad_norm=numpy.float32(0.5), lr=torch.tensor(0.1, dtype=torch.float64))
        rankscope.step(1, loss=1.5)
        def broken(self, values, payload):
            raise RuntimeError("pinned memory exhausted")
        _readback.Readback.put = broken
        class Cuda(torch.Tensor):
            is_cuda = property(lambda self: True)
        rankscope.step(2, loss=torch.tensor(1.0).as_subclass(Cuda))   # lost and said once, not raised
        rankscope.step(3, loss=torch.tensor(1.0).as_subclass(Cuda))
        class Unreadable(Cuda):
            def __float__(self):
                raise AssertionError("read while disabled: a sync for nothing")
        rankscope.set_enabled(False)
        rankscope.step(5, loss=torch.tensor(1.0).as_subclass(Unreadable))
        rankscope.set_enabled(True)
        try:
            rankscope.step(4, loss="high")
        except TypeError as e:
            print("TypeError")
        try:                                             # not a scalar: read now, and refused as before
            rankscope.step(6, loss=torch.ones(2).as_subclass(Cuda))
        except ValueError as e:
            print("ValueError")
        rankscope.shutdown()
    """)
    assert p.stdout.split() == ["TypeError", "ValueError"], p.stdout + p.stderr
    run = str(tmp_path / "run")
    ends = {e["step"]: e for e in run_log_events(run, "step_end")}
    assert ends[0]["loss"] == 2.5 and ends[0]["grad_norm"] == 0.5 and ends[0]["lr"] == 0.1, ends[0]
    assert ends[1]["loss"] == 1.5 and "loss" not in ends[2], ends
    assert not run_log_events(run, "step_scalars")
    said = [e for e in run_log_events(run, "log") if "cannot read the scalars back" in e["msg"]]
    assert len(said) == 1 and "pinned memory exhausted" in said[0]["fields"]["error"], said


def test_with_rankscope_torch_a_cpu_tensor_scalar_is_read_in_place_not_through_item(run_py, tmp_path):
    # rankscope.torch's C++ part reads a plain CPU tensor of one element itself (~150 ns less than
    # .item()); whatever it does not know for sure still goes through .item(), with the same values.
    p = run_py("""
        import os, torch, rankscope, rankscope.torch as rst
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        items = []
        real_item = torch.Tensor.item
        torch.Tensor.item = lambda self: items.append(str(self.dtype)) or real_item(self)
        w = torch.nn.Parameter(torch.tensor([3.0]))
        cases = [
            dict(loss=(w * 2).sum()),                                  # requires grad: 6.0
            dict(loss=torch.arange(10, dtype=torch.float32)[7]),       # a view at an offset: 7.0
            dict(loss=torch.tensor(0.25, dtype=torch.float16)),
            dict(loss=torch.tensor(1.5, dtype=torch.bfloat16), lr=torch.tensor(0.125, dtype=torch.float64)),
            dict(loss=torch._neg_view(torch.tensor(2.0))),             # a negative view: -2.0, via .item()
            dict(loss=torch.tensor(3)),                                # an integer tensor, via .item()
            dict(grad_norm=torch.tensor([[4.5]])),                     # one element in two dimensions
        ]
        for n, kw in enumerate(cases):
            rankscope.step(n, **kw)
        freed = torch.tensor([1.0])
        freed.untyped_storage().resize_(0)                             # as FSDP frees a parameter's storage
        try:
            rankscope.step(7, loss=freed)                              # .item()'s error, never a read of freed memory
        except RuntimeError:
            print("RuntimeError")
        rankscope.step(8, loss=torch._efficientzerotensor(()))         # no storage at all: .item() says 0
        print("native", rst._torch_hooks is not None)
        print("items", *items)
        rankscope.shutdown()
    """)
    native = "native True" in p.stdout
    items = p.stdout.split("items")[1].split()
    assert "RuntimeError" in p.stdout, p.stdout + p.stderr
    if native:  # built against this torch: only the four it leaves to torch
        assert items == ["torch.float32", "torch.int64", "torch.float32", "torch.float32"], p.stdout
    else:       # torch without the C++ part (2.6 here): every tensor through .item(), as before
        assert items == ["torch.float32", "torch.float32", "torch.float16", "torch.bfloat16", "torch.float64",
                         "torch.float32", "torch.int64", "torch.float32", "torch.float32", "torch.float32"], p.stdout
    ends = [e for e in run_log_events(str(tmp_path / "run"), "step_end")]
    got = [(e.get("loss"), e.get("lr"), e.get("grad_norm")) for e in ends]
    assert got == [(6.0, None, None), (7.0, None, None), (0.25, None, None), (1.5, 0.125, None),
                   (-2.0, None, None), (3, None, None), (None, None, 4.5), (0, None, None)], got
    assert [e["step"] for e in ends][-1] == 8                   # step 7 raised: no line for it
