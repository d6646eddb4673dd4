"""Validates a `rankscope timeline` trace: the Chrome trace-event JSON that
Perfetto UI and chrome://tracing load. Usage: check_trace.py TRACE RANKS STEPS"""
import collections
import json
import sys

path, ranks, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path) as f:
    doc = json.load(f)
events = doc["traceEvents"]
assert isinstance(events, list) and events, "no traceEvents"
names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
assert sorted(names) == list(range(ranks)), f"process tracks {sorted(names)}"
for e in events:
    assert e["ph"] in {"M", "X", "i", "s", "f"}, e
    if e["ph"] == "M":
        continue
    assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["ts"] >= 0, e
    if e["ph"] == "X":
        assert e["dur"] >= 0 and e["name"], e
threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
used = {(e["pid"], e["tid"]) for e in events if e["ph"] in "Xi"}
assert used <= threads, f"slices on unnamed threads: {used - threads}"
# Steps as instants, phases and collectives as slices, on every rank.
for r in range(ranks):
    mine = [e for e in events if e.get("pid") == r]
    n_steps = sum(1 for e in mine if e["ph"] == "i" and e["cat"] == "step")
    assert n_steps == steps, f"rank {r}: {n_steps} step instants"
    phases = {e["name"] for e in mine if e["ph"] == "X" and e["cat"] == "phase"}
    assert {"forward", "backward", "all_reduce", "optimizer", "loader_wait"} <= phases, phases
    colls = [e for e in mine if e["ph"] == "X" and e["cat"] == "collective"]
    assert len(colls) == steps + 1, f"rank {r}: {len(colls)} collectives"
# Flows: each id starts once and ends once, on ranks r and r+1, at the same sequence number.
ends = collections.defaultdict(list)
for e in events:
    if e["ph"] in "sf":
        ends[e["id"]].append(e)
assert ends, "no flows"
for fid, pair in ends.items():
    kinds = sorted(x["ph"] for x in pair)
    assert kinds == ["f", "s"], f"flow {fid}: {kinds}"
    s = next(x for x in pair if x["ph"] == "s")
    f = next(x for x in pair if x["ph"] == "f")
    assert f["pid"] == s["pid"] + 1, (s, f)
assert len(ends) == (steps + 1) * (ranks - 1), f"{len(ends)} flows"
print(f"trace ok: {len(events)} events, {len(ends)} flows, {ranks} ranks")
