"""python -m rankscope triage|status|summary|timeline RUN_DIR [--json] [--since T] [--until T] [-o trace.json]"""
import argparse
import sys

import rankscope


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m rankscope", description="rankscope's tools over a run directory")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in [("triage", "what went wrong, on which rank (exit 0 healthy, 1 findings, 2 unreadable)"),
                        ("status", "is every rank alive and progressing"),
                        ("summary", "per-rank steps, step time by phase, drops")]:
        s = sub.add_parser(name, help=help_)
        s.add_argument("run_dir")
        s.add_argument("--json", action="store_true", help="machine-readable output")
    for opt in ("--since", "--until"):
        sub.choices["triage"].add_argument(opt, default="", help="time window: epoch s/ns, ISO-8601 UTC, or +15m after the start")
    t = sub.add_parser("timeline", help="Chrome/Perfetto trace JSON of the run")
    t.add_argument("run_dir")
    t.add_argument("-o", "--output", default="trace.json")
    a = p.parse_args(argv)
    if a.command == "timeline":
        text, code = rankscope.timeline(a.run_dir, a.output)
        sys.stderr.write(text)
        return code
    if a.command == "triage":
        text, code = rankscope.triage(a.run_dir, a.json, a.since, a.until)
    else:
        text, code = getattr(rankscope, a.command)(a.run_dir, a.json)
    (sys.stdout if code != 2 else sys.stderr).write(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
