"""Checks `rankscope triage --json` (stdin) of a real run for the tests.

  triage_expect.py RC clean             no finding but those that cost only time
  triage_expect.py RC KIND RANKS [TEXT] the first finding is KIND on RANKS ("1,3"),
                                        its summary has TEXT; it rests on evidence
                                        (KIND costs only time: no fault, and one
                                        such finding among those of that kind)

RC is triage's exit code. A real run on a shared machine can have findings that
cost only time (a straggler, slow steps, a throughput drop: a core the host ran
slower for a while is a real straggler), so "clean" allows them and prints
them; triage lists them after every fault, so they never take the first place
from the fault a test injected.
"""
import json
import sys


def main():
    rc, kind = int(sys.argv[1]), sys.argv[2]
    r = json.load(sys.stdin)
    assert r["schema"] == "rankscope.triage/1", r["schema"]
    findings = r["findings"]
    slower = [f for f in findings if f["costs_only_time"]]
    for f in slower:
        print(f"  (the host's or real: [{f['kind']}] {f['summary']})")
    if kind == "clean":
        faults = [f for f in findings if not f["costs_only_time"]]
        assert not faults, faults
        assert rc == (1 if findings else 0) and r["healthy"] == (not findings), (rc, r["healthy"])
        return
    ranks = [int(x) for x in sys.argv[3].split(",")]
    text = sys.argv[4] if len(sys.argv) > 4 else ""
    assert rc == 1 and findings, (rc, findings)
    if findings[0]["costs_only_time"]:  # a straggler the test made; the host may have made others
        matching = [f for f in findings if f["kind"] == kind and f["ranks"] == ranks and text in f["summary"]]
        assert matching, findings
        f = matching[0]
    else:
        f = findings[0]
        assert f["kind"] == kind and f["ranks"] == ranks and text in f["summary"], f
    assert f["lines"] or f["evidence"], f


if __name__ == "__main__":
    main()
