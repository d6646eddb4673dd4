"""`rankscope` / `python -m rankscope`: the same command as the installed C++
binary (one implementation, lib/cli/cli.cpp): summary, status, triage, timeline.
Exit codes: 0 healthy, 1 findings, 2 the run could not be read or bad arguments.

One more, Python's own: `rankscope run [--] COMMAND...` runs COMMAND (torchrun and the
script, unmodified) in no-code mode: RANKSCOPE_AUTO=1 (rankscope/_auto.py)."""
import os
import sys

from rankscope import _rankscope


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["run"]:
        return _run(args[1:])
    sys.stdout.flush()  # the C++ side writes to the same file descriptors
    sys.stderr.flush()
    return _rankscope._cli_main(["rankscope", *args])


def _run(command):
    if command[:1] == ["--"]:
        command = command[1:]
    if not command or command[0] in ("-h", "--help"):
        print("usage: rankscope run [--] COMMAND [ARGS...]\n\n"
              "Runs COMMAND (for example: torchrun --nproc-per-node 8 train.py) with every Python rank it\n"
              "starts recorded, no code changed (RANKSCOPE_AUTO=1; docs/frameworks.md).",
              file=sys.stderr if not command else sys.stdout)
        return 2 if not command else 0
    os.environ["RANKSCOPE_AUTO"] = "1"
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"rankscope run: cannot run {command[0]!r}: {e.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
