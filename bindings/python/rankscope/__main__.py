"""`rankscope` / `python -m rankscope`: the same command as the installed C++
binary (one implementation, lib/cli/cli.cpp): summary, status, triage, timeline.
Exit codes: 0 healthy, 1 findings, 2 the run could not be read or bad arguments."""
import sys

from rankscope import _rankscope


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    sys.stdout.flush()  # the C++ side writes to the same file descriptors
    sys.stderr.flush()
    return _rankscope._cli_main(["rankscope", *args])


if __name__ == "__main__":
    sys.exit(main())
