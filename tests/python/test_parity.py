"""C++ / Python parity: every public C++ function and type (include/rankscope/,
namespace rankscope) has a Python counterpart of the same name, a named one
(RENAMED), or a reason it has none (CPP_ONLY, also in docs/python.md). A new
C++ capability without either fails here."""
import os
import re

import rankscope
import rankscope.torch as rst

from conftest import ROOT

RENAMED = {  # C++ name -> Python name (one concept, the spelling each language expects)
    "end_step": "step", "StepScope": "step", "StepScalars": "step", "PhaseTimer": "phase",
    "CollectiveSpan": "collective", "Config": "init", "ContextOverrides": "init", "RunContext": "context",
    "Stats": "stats", "StepBreakdown": "last_step_breakdown", "HeartbeatStatus": "heartbeat_status",
    "LocalExchangeGroup": "use_local_exchange", "BatchMath": "check_batch_math",
    "SamplerState": "check_sampler", "CheckpointMeta": "check_resume", "Field": "info",
    "exchange_timeout": "set_exchange", "exchange": "set_exchange",
    "replica_checksum": "ReplicaCheck", "CheckpointOp": "record_checkpoint_failure",
}
CPP_ONLY = {  # why Python has no counterpart
    "collective_op_name": "ops are strings in Python", "dtype_name": "dtypes are strings in Python",
    "collective_result_name": "the span's end(ok) says ok or failed; the run log has the name",
    "dtype_size": "Python passes counts and dtype names; the span computes bytes",
    "collective_bytes": "computed by the span", "bus_bandwidth_factor": "computed by the span",
    "Bandwidth": "computed by the span", "collective_fingerprint": "computed by the span",
    "communicator_for": "keyed by C++ handles; rankscope.torch maps process groups itself",
    "register_communicator": "keyed by C++ handles; rankscope.torch maps process groups itself",
    "release_communicator": "keyed by C++ handles; rankscope.torch maps process groups itself",
    "live_communicators": "in stats() as the run log's `communicators`",
    "flight_complete": "device completion callback of the NCCL hooks",
    "launcher_name": "context()['launcher'] spelling helper", "missing_ranks": "C++ Status helper",
    "format_ranks": "formatting helper", "join_ranks": "formatting helper", "set_heartbeat_publisher": "rankscope.torch publishes to the store",
    "level_name": "Python levels are names already", "Logger": "Python code uses the logging module's names",
    "SourceLocation": "a log call site (file, function, line); Python records the caller's frame itself", "Throttle": "RANKSCOPE_LOG_THROTTLED internals",
    "observe_ungated": "internal", "Site": "macro internals", "intern": "Python phases intern on creation",
    "intern_limit": "macro internals", "set_intern_limit": "tests only", "DynamicName": "Python names are dynamic",
    "Sink": "custom sinks are C++ (export/sink.hpp)", "OnViolation": "fail=True/False",
    "collective_bandwidth": "computed by the span (the run log's algbw_gbps/busbw_gbps)",
    "exchange_timeout_error": "C++ Status helper", "resolve_context": "init() resolves it; context() shows it",
    "classify_phase": "phases are classified when created", "phase_kind_name": "last_step_breakdown() keys",
}
# Namespace-level declarations (not indented: members are their class's business).
DECL = re.compile(r"^(?!\s)(?:[\w:<>,*&]+[\w:<>,*& ]*?\s)?[*&]?(\w+)\([^;]*?\)\s*(?:noexcept)?\s*(?:;|\{)", re.M)
TYPE = re.compile(r"^(?:class|struct) (?:\[\[\w+\]\] )?(\w+)\s*(?:final\s*)?[:{]", re.M)


def without_detail(text):
    """The text without its `namespace detail { ... }` blocks (brace-matched)."""
    out, i = [], 0
    while (j := text.find("namespace detail {", i)) >= 0:
        out.append(text[i:j])
        depth, k = 0, text.index("{", j)
        while True:
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            k += 1
            if depth == 0:
                break
        i = k
    return "".join(out) + text[i:]


def public_names():
    names = set()
    inc = os.path.join(ROOT, "include", "rankscope")
    for f in sorted(os.listdir(inc)):
        if not f.endswith(".hpp"):
            continue
        text = open(os.path.join(inc, f)).read()
        text = without_detail(text)
        names |= {m.group(1) for m in DECL.finditer(text) if not m.group(1).startswith(("operator", "RANKSCOPE"))}
        names |= {m.group(1) for m in TYPE.finditer(text)}
    return names


def test_every_public_cpp_name_has_a_python_counterpart_or_a_reason():
    py = set(dir(rankscope)) | set(dir(rst))
    names = public_names()
    assert len(names) > 40, names
    missing = []
    for n in sorted(names):
        if n in py or (n in CPP_ONLY and CPP_ONLY[n]):
            continue
        if n in RENAMED:
            assert RENAMED[n] in py, f"{n} -> {RENAMED[n]}: no such Python name"
            continue
        missing.append(n)
    assert not missing, f"public C++ API without a Python counterpart or a reason in this table: {missing}"


def test_python_counterparts_work(run_py):
    p = run_py("""
        import os, rankscope
        rankscope.init(rank=0, world_size=1, run_dir=os.environ["RUN_DIR"])
        for n in range(3):
            with rankscope.phase("forward"):
                pass
            rankscope.step(n)
        rankscope.flush()
        b = rankscope.last_step_breakdown()
        h = rankscope.heartbeat_status()
        rankscope.set_log_level("warning")
        print(b["step"], sorted(b["by_kind_s"])[:2], h["stalled"], rankscope.log_level())
        rankscope.check_data(0x1234)
        try:
            rankscope.set_log_level("loud")
        except ValueError as e:
            print("bad level:", e)
        rankscope.shutdown()
    """)
    assert "False warn" in p.stdout and "bad level: set_log_level('loud')" in p.stdout, p.stdout + p.stderr
