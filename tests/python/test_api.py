"""The Python API end to end: each test runs a fresh interpreter and reads the run log back."""
import json
import os

import pytest


def events(run_dir, rank=0):
    with open(os.path.join(run_dir, f"rank-{rank}.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_import_without_init_is_harmless(run_py):
    p = run_py("""
        import rankscope
        with rankscope.phase("forward"):
            pass
        rankscope.step(0, loss=1.0)
        rankscope.counter("c").add(1)
        rankscope.info("nothing", x=1)
        assert not rankscope.initialized()
        assert rankscope.stats()["inactive_calls"] >= 1
        print("ok")
    """)
    assert p.stdout.strip() == "ok"


def test_names_made_per_step_do_not_grow_memory_past_the_limit(run_py, tmp_path):
    run_py("""
        import os, rankscope
        from rankscope import _rankscope as core
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        with rankscope.phase("kept"):
            pass
        before = len(core._phase_handles)
        core._set_intern_limit(0)          # the name table counts as full
        for n in range(100):
            with rankscope.phase(f"step {n}"):   # a new name every step
                pass
        assert len(core._phase_handles) == before  # handles of new names are not cached
        assert rankscope.phase("kept") is rankscope.phase("kept")
        core._set_intern_limit(65536)
        rankscope.shutdown()
    """)
    names = [e["name"] for e in events(tmp_path / "run") if e["kind"] == "phase"]
    assert names.count("(too many names)") == 100
    assert names.count("kept") == 1


def test_phases_steps_metrics_and_logs_reach_the_run_log(run_py, tmp_path):
    run_py("""
        import os, rankscope
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"], run_config={"model": "mlp"})
        fwd = rankscope.phase("forward")
        assert fwd is rankscope.phase("forward")      # interned handles
        @rankscope.phase("backward")
        def backward(x):
            '''doc kept'''
            return x + 1
        assert backward.__doc__ == "doc kept"
        for n in range(3):
            with fwd:
                with rankscope.phase("attention"):
                    pass
            backward(n)
            rankscope.step(n, loss=0.5 - n / 10, lr=0.01, grad_norm=2.0, samples=8)
        rankscope.counter("samples_total", "Samples").add(24)
        rankscope.gauge("temp", labels={"gpu": "0"}).set(61.5)
        rankscope.histogram("batch_seconds", [0.1, 1.0]).observe(0.5)
        rankscope.warning("slow checkpoint", path="/ckpt", bytes=4096, ratio=0.5, ok=False)
        try:
            with rankscope.phase("optimizer"):
                raise KeyError("boom")                # the phase closes, the exception propagates
        except KeyError:
            pass
        rankscope.flush()
        st = rankscope.stats()
        assert st["events_recorded"] > 0 and st["events_dropped"] == 0
        assert st["background_cpu_ns"] > 0               # the background thread's own CPU time
        rankscope.shutdown()
    """)
    ev = events(tmp_path / "run")
    phases = [e for e in ev if e["kind"] == "phase"]
    assert [e["name"] for e in phases].count("forward") == 3
    assert [e["name"] for e in phases].count("backward") == 3
    att = [e for e in phases if e["name"] == "attention"]
    assert att and all(e["parent"] == "forward" and e["depth"] == 1 for e in att)
    assert any(e["name"] == "optimizer" and e["phase_kind"] == "optimizer" for e in phases)
    ends = [e for e in ev if e["kind"] == "step_end"]
    assert [e["step"] for e in ends] == [0, 1, 2]
    assert ends[1]["loss"] == pytest.approx(0.4) and ends[1]["samples"] == 8 and ends[1]["grad_norm"] == 2.0
    assert all(e["step"] == 1 for e in phases if e["name"] == "backward" and e["t"] > ends[0]["t"] and e["t"] < ends[1]["t"])
    log = next(e for e in ev if e["kind"] == "log")
    assert log["level"] == "warn" and log["fields"] == {"path": "/ckpt", "bytes": 4096, "ratio": 0.5, "ok": False}
    assert log["file"] == "<string>" and log["function"] == "<module>" and log["line"] == 20  # the Python caller
    metrics = {e["name"]: e for e in ev if e["kind"] == "metric"}
    assert metrics["samples_total"]["value"] == 24
    assert metrics["temp"]["labels"] == {"gpu": "0"} and metrics["temp"]["value"] == 61.5
    assert metrics["batch_seconds"]["counts"] == [0, 1, 0]


def test_hostile_text_never_raises_into_training_code(run_py, tmp_path):
    """A lone surrogate (what Python gives for a non-UTF-8 file name) in a log message, field,
    phase or metric name, a field whose __str__ raises, a phase named by a number: recorded,
    replaced and counted - no exception - and every run-log line stays valid UTF-8 JSON."""
    run_py("""
        import os, rankscope
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        bad = "shard-\\udcff.bin"
        class Unprintable:
            def __str__(self):
                raise RuntimeError("no str for you")
        rankscope.warning("cannot open " + bad, path=bad, what=Unprintable(), **{bad: 1})
        with rankscope.phase(bad):
            pass
        with rankscope.phase(7):
            pass
        rankscope.counter("files_" + bad, labels={"file": bad}).add(1)
        rankscope.shutdown()
    """)
    raw = (tmp_path / "run" / "rank-0.jsonl").read_bytes()
    raw.decode("utf-8")  # strict: valid UTF-8 throughout
    ev = events(tmp_path / "run")
    log = next(e for e in ev if e["kind"] == "log")
    assert log["msg"] == "cannot open shard-?.bin", log
    assert log["fields"]["path"] == "shard-?.bin" and log["fields"]["what"] == "<unprintable Unprintable>", log
    assert log["fields"]["shard-?.bin"] == 1, log
    names = [e["name"] for e in ev if e["kind"] == "phase"]
    assert "shard-?.bin" in names and "7" in names, names
    invalid = [e for e in ev if e["kind"] == "metric" and e["name"] == "rankscope_invalid_text_total"]
    assert invalid and invalid[-1]["value"] >= 5, invalid


def test_step_arguments_parse_like_a_python_signature(run_py, tmp_path):
    run_py("""
        import inspect, os, rankscope
        assert str(inspect.signature(rankscope.step)) == \
            "(n, *, loss=None, lr=None, grad_norm=None, samples=None, tokens=None, skipped=False)"
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        class Scalar:                                   # anything with __float__ / __index__
            def __float__(self): return 2.5
            def __index__(self): return 7
        rankscope.step(0, loss=Scalar(), lr=1, grad_norm=None, samples=Scalar(), tokens=3, skipped=1)
        rankscope.step(n=1)
        bad = {"rankscope.step()": "missing required argument 'n'",
               "rankscope.step(2, 3)": "one positional argument",
               "rankscope.step(2, los=1.0)": "unexpected keyword argument 'los'",
               "rankscope.step(2, n=3)": "multiple values for argument 'n'",
               "rankscope.step(2, loss='high')": "must be real number",
               "rankscope.step(2, samples=1.5)": "cannot be interpreted as an integer",
               "rankscope.step('2')": "cannot be interpreted as an integer"}
        for call, message in bad.items():
            try:
                eval(call)
                raise AssertionError(call + " did not raise")
            except TypeError as e:
                assert message in str(e), (call, str(e))
        rankscope.shutdown()
    """)
    ends = [e for e in events(tmp_path / "run") if e["kind"] == "step_end"]
    assert [e["step"] for e in ends] == [0, 1]
    assert ends[0]["loss"] == 2.5 and ends[0]["lr"] == 1.0 and "grad_norm" not in ends[0]
    assert ends[0]["samples"] == 7 and ends[0]["tokens"] == 3 and ends[0]["skipped"] is True
    assert "loss" not in ends[1] and "skipped" not in ends[1]


def test_disabled_at_runtime_records_no_phases(run_py, tmp_path):
    run_py("""
        import os, rankscope
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        rankscope.set_enabled(False)
        with rankscope.phase("forward"):
            rankscope.set_enabled(True)               # exit without a matching enter: nothing closes
        with rankscope.phase("forward"):
            pass
        rankscope.shutdown()
    """)
    assert sum(1 for e in events(tmp_path / "run") if e["kind"] == "phase") == 1


def test_run_config_reaches_every_rank_log_flat_and_without_secrets(run_py, tmp_path):
    p = run_py("""
        import argparse, os, rankscope
        cfg = {"optim": {"lr": 0.1, "betas": (0.9, 0.95)}, "batch": 64, "wandb_api_key": "s3cret",
               "data": "s3://user:pw@bucket/shards"}
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"], run_config=cfg)
        rankscope.shutdown()
        try:
            rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"], run_config=["lr", 0.1])
        except TypeError as e:
            print(e)
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"],
                       run_config=argparse.Namespace(lr=0.2, epochs=3))
        rankscope.shutdown()
    """)
    starts = [e for e in events(tmp_path / "run") if e["kind"] == "run_start"]
    assert starts[0]["environment"]["config"] == {"optim.lr": "0.1", "optim.betas": "(0.9, 0.95)", "batch": "64",
                                                  "wandb_api_key": "<redacted>", "data": "s3://bucket/shards"}
    assert starts[-1]["environment"]["config"] == {"lr": "0.2", "epochs": "3"}
    with open(tmp_path / "run" / "run.json") as f:
        assert json.load(f)["config"] == {"lr": "0.2", "epochs": "3"}
    assert "s3cret" not in open(tmp_path / "run" / "rank-0.jsonl").read()
    assert "run_config=...) takes a mapping, not list" in p.stdout


def test_bad_init_raises_value_error_naming_the_variable(run_py):
    p = run_py("""
        import rankscope
        try:
            rankscope.init()
        except ValueError as e:
            print(e)
    """, env={"RANK": "abc", "WORLD_SIZE": "2"})
    assert "RANK='abc'" in p.stdout


def test_invariants_raise_or_record_by_policy(run_py, tmp_path):
    p = run_py("""
        import os, rankscope
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        try:
            rankscope.check_batch_math(micro_batch=8, grad_accum=2, data_parallel=2, global_batch=64, fail=True)
        except rankscope.InvariantViolation as e:
            print("raised:", e)
        rankscope.check_batch_math(micro_batch=8, grad_accum=2, data_parallel=2, global_batch=64)  # default: warn
        acc = rankscope.BatchAccounting(dataset_size=1000, micro_batch=64, data_parallel=4, fail=True)
        print("expected", acc.expected_per_epoch)
        acc.start_epoch(0)
        acc.on_batch(0)
        try:
            acc.on_batch(2)
        except rankscope.InvariantViolation as e:
            print("raised:", e)
        fp = rankscope.fingerprint_indices([5, 1, 9])
        rankscope.check_sampler(seed=1, epoch=0, fingerprint=fp, num_indices=3)
        rankscope.shutdown()
        print("violations", rankscope.violation_count())
    """)
    assert "raised: batch_math: micro-batch 8 x grad-accum 2 x data-parallel 2 = 32" in p.stdout
    assert "expected 4" in p.stdout
    assert "raised: epoch_batches: rank 0 skipped batch 1 of epoch 0 (got batch 2)" in p.stdout
    assert "violations 3" in p.stdout
    facts = [e for e in events(tmp_path / "run") if e["kind"] == "fact"]
    assert {f["name"] for f in facts} >= {"batch_math", "sampler"}


def test_batch_accounting_by_default_never_ends_training(run_py, tmp_path):
    """The loop users write first: no start_epoch(), epochs restart at batch 0. One warning, no exception."""
    p = run_py("""
        import os, rankscope
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        acc = rankscope.BatchAccounting(dataset_size=512, micro_batch=64, data_parallel=2)
        for epoch in range(3):
            for i in range(4):
                acc.on_batch(i)
        acc.on_batch(2)  # a real repeat: recorded and warned, never raised by default
        rankscope.shutdown()
        print("survived, violations", rankscope.violation_count())
    """)
    assert "survived, violations 1" in p.stdout
    assert p.stderr.count("start_epoch() was not called") == 1, p.stderr
    warned = [e for e in events(tmp_path / "run") if e["kind"] == "log" and "start_epoch()" in e.get("msg", "")]
    assert len(warned) == 1 and warned[0]["level"] == "warn"


CLEAN_RUN = """
    import os, rankscope
    rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
    for n in range(3):
        with rankscope.phase("forward"):
            pass
        rankscope.step(n, loss=1.0)
    rankscope.shutdown()
"""


def test_cli_from_python(run_py, tmp_path):
    run_py(CLEAN_RUN)
    import subprocess, sys
    env = dict(os.environ)
    run = str(tmp_path / "run")
    # The `rankscope` command pip installed beside the interpreter (the package's entry point).
    cmd = subprocess.run([os.path.join(os.path.dirname(sys.executable), "rankscope"), "triage", run], env=env,
                         capture_output=True, text=True)
    assert cmd.returncode == 0 and "healthy" in cmd.stdout, cmd.stdout + cmd.stderr
    tri = subprocess.run([sys.executable, "-m", "rankscope", "triage", run, "--json"], env=env, capture_output=True,
                         text=True)
    assert tri.returncode == 0, tri.stderr
    report = json.loads(tri.stdout)
    assert report["exit_code"] == 0 and report["schema"] == "rankscope.triage/1"
    win = subprocess.run([sys.executable, "-m", "rankscope", "triage", run, "--json", "--since", "+1h"], env=env,
                         capture_output=True, text=True)
    assert win.returncode == 0 and json.loads(win.stdout)["window"]["since_ns"] > 0, win.stderr
    bad_time = subprocess.run([sys.executable, "-m", "rankscope", "triage", run, "--until", "soon"], env=env,
                              capture_output=True, text=True)
    assert bad_time.returncode == 2 and "bad time 'soon'" in bad_time.stderr
    tl = subprocess.run([sys.executable, "-m", "rankscope", "timeline", run, "-o", str(tmp_path / "t.json")], env=env,
                        capture_output=True, text=True)
    assert tl.returncode == 0 and json.load(open(tmp_path / "t.json"))["traceEvents"]
    bad = subprocess.run([sys.executable, "-m", "rankscope", "triage", str(tmp_path / "nope")], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not a run directory" in bad.stderr


def test_exporters_from_the_environment(run_py):
    p = run_py("""
        import os, socket, urllib.request, rankscope
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        os.environ["RANKSCOPE_PROMETHEUS_PORT"] = str(port)
        rankscope.init(rank=0, world_size=1, local_rank=0, run_dir=os.environ["RUN_DIR"])
        rankscope.step(0, loss=0.25)
        rankscope.flush()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120).read().decode()
        print([l for l in text.splitlines() if l.startswith("rankscope_loss{")][0])
        rankscope.shutdown()
    """)
    assert p.stdout.strip().endswith("} 0.25")
    bad = run_py("""
        import rankscope
        try:
            rankscope.init(rank=0, world_size=1)
        except ValueError as e:
            print(e)
    """, env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert "OTEL_EXPORTER_OTLP_PROTOCOL='grpc' is not supported" in bad.stdout


def test_pyi_files_cover_the_public_api():
    """Every public function and class of rankscope and rankscope.torch is declared in its .pyi
    file (IDEs complete from those), and the .pyi files parse."""
    import ast
    import inspect
    import rankscope
    import rankscope.torch as rst
    for module, pyi in [(rankscope, "__init__.pyi"), (rst, "torch.pyi")]:
        path = os.path.join(os.path.dirname(module.__file__), pyi)
        tree = ast.parse(open(path).read())
        declared = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        declared |= {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
                     for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        public = {name for name, obj in vars(module).items()
                  if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj)
                                                   or inspect.isbuiltin(obj))
                  and getattr(obj, "__module__", "").startswith("rankscope")}
        assert public <= declared, f"{pyi} lacks {sorted(public - declared)}"


def test_one_command_layer_same_exit_codes_and_valid_json(run_py, tmp_path):
    """The installed script, `python -m rankscope` and the Python functions are one
    implementation: the same exit codes (summary: 1 when a rank is missing) and
    JSON that parses even with a quote in a communicator's name."""
    run_py("""
        import os, rankscope
        rankscope.init(rank=0, world_size=2, run_dir=os.environ["RUN_DIR"])
        comm = rankscope.communicator('tp"0', 2, 0)
        for n in range(3):
            with rankscope.collective(comm, "all_reduce", 16, "float32"):
                pass
            rankscope.step(n)
        rankscope.shutdown()
    """)
    import subprocess, sys
    import rankscope
    run = str(tmp_path / "run")
    script = os.path.join(os.path.dirname(sys.executable), "rankscope")
    codes = set()
    for cmd in ([script], [sys.executable, "-m", "rankscope"]):
        p = subprocess.run(cmd + ["summary", run, "--json"], capture_output=True, text=True)
        codes.add(p.returncode)
        report = json.loads(p.stdout)
        assert report["missing_ranks"] == [1] and report["communicators"][0]["comm"] == 'tp"0', p.stdout
        h = subprocess.run(cmd + ["--help"], capture_output=True, text=True)
        assert h.returncode == 0 and "triage" in h.stdout
        bad = subprocess.run(cmd + ["triage"], capture_output=True, text=True)  # RUN_DIR missing
        assert bad.returncode == 2, bad.stdout + bad.stderr
    codes.add(rankscope.summary(run, json=True)[1])
    assert codes == {1}


def test_a_nan_loss_is_not_healthy(run_py, tmp_path):
    run_py("""
        import os, rankscope
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        for n in range(20):
            with rankscope.phase("forward"):
                pass
            rankscope.step(n, loss=float("nan") if n >= 10 else 1.0 / (n + 1))
        rankscope.shutdown()
    """)
    import rankscope
    text, code = rankscope.triage(str(tmp_path / "run"), json=True)
    report = json.loads(text)
    assert code == 1 and report["findings"][0]["kind"] == "numerics", text
    assert "rank 0: loss is NaN from step 10" in report["findings"][0]["summary"]


KILLED_MID_RUN = """
    import os, signal, rankscope
    rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
    for n in range(50):
        with rankscope.phase("forward"):
            pass
        rankscope.step(n)
    os.kill(os.getpid(), signal.SIGKILL)  # no drain, no exit handler: the steps are only in the rings
"""


def test_the_python_functions_and_the_command_recover_a_killed_ranks_records(run_py, tmp_path):
    import subprocess, sys
    import rankscope
    # Drains a second apart: the last steps before the kill are in the rings only
    # (all 50 take a few milliseconds), so without recovery the count falls short.
    slow = {"RANKSCOPE_HEARTBEAT_INTERVAL": "120", "RANKSCOPE_DRAIN_INTERVAL_MS": "1000"}
    runs = [str(tmp_path / "by-python"), str(tmp_path / "by-command")]
    for run in runs:
        p = run_py(KILLED_MID_RUN, env=dict(slow, RUN_DIR=run), check=False)
        assert p.returncode == -9, p.stderr
    text, code = rankscope.summary(runs[0], json=True)
    assert json.loads(text)["ranks"][0]["steps"] == 50, text
    script = os.path.join(os.path.dirname(sys.executable), "rankscope")
    p = subprocess.run([script, "summary", runs[1], "--json"], capture_output=True, text=True)
    assert json.loads(p.stdout)["ranks"][0]["steps"] == 50, p.stdout + p.stderr
    assert code == p.returncode


def test_every_command_is_a_python_function_with_the_commands_exit_codes(run_py, tmp_path):
    import subprocess, sys
    import rankscope
    run_py(CLEAN_RUN)
    run = str(tmp_path / "run")
    script = os.path.join(os.path.dirname(sys.executable), "rankscope")
    help_text = subprocess.run([script, "--help"], capture_output=True, text=True).stdout
    calls = {
        "summary": (rankscope.summary, [run]), "status": (rankscope.status, [run]),
        "triage": (rankscope.triage, [run]), "goodput": (rankscope.goodput, [run]),
        "diff": (rankscope.diff, [run, run]), "stacks": (rankscope.stacks, [run]),
        "timeline": (rankscope.timeline, [run, str(tmp_path / "t.json")]),
        "report": (rankscope.report, [run, str(tmp_path / "r.html")]),
    }
    for name, (fn, args) in calls.items():
        assert name in help_text
        text, code = fn(*args)
        argv = [script, name, *args[:2 if name == "diff" else 1]]
        if name in ("timeline", "report"):
            argv += ["-o", args[1] + ".cli"]
        p = subprocess.run(argv, capture_output=True, text=True)
        assert code == p.returncode, (name, text, p.stdout, p.stderr)
    with open(tmp_path / "t.json") as f:
        assert json.load(f)["traceEvents"]
    assert (tmp_path / "r.html").stat().st_size > 1000
    assert not list(tmp_path.glob("*.tmp"))
    text, code = rankscope.summary(str(tmp_path / "no-such-run"))
    assert code == 2 and "rankscope summary:" in text
