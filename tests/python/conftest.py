"""pytest setup: the package is the one `pip install .` put in this interpreter's
environment (the project's .venv), and each test gets a fresh process for init()
(rankscope is one runtime per process).

No test here depends on how fast the machine is: CI runs these files side by side
(one ctest entry per file, tests/CMakeLists.txt) on a shared 2-core host whose cores slow
down 1.3-2x for minutes. What a rule decides from time (a straggler, a throughput drop, a
stall, goodput's categories) is tested on run logs the test writes itself
(synthetic_run.py); real runs assert what holds at any speed. Timeouts are "must not hang"
guards, orders of magnitude above a normal run; nothing sleeps to let something happen: a
test waits for the condition itself. Statistics on real runs: benchmarks/python/."""
import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

try:
    import rankscope  # noqa: F401
except ImportError as e:  # say how, once, rather than fail every test alike
    raise pytest.UsageError(f"rankscope is not installed in {sys.executable} ({e}): "
                            "run `pip install --no-build-isolation .` from the checkout first") from e

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
RANKSCOPE = os.path.join(os.path.dirname(sys.executable), "rankscope")

# Findings that only say a rank or the job was slower, measured by real time: a clean real run
# on a busy host can show them (its cores slow down for tens of steps at a time), so a test of a
# real run accepts them beside what it asserts. (resource_growth is not one: it counts threads
# and communicators across in-process restores, whatever the speed.) What each of these rules
# finds is tested on synthetic run logs (test_training_health.py).
TIME_ONLY = frozenset({"straggler", "slow_steps", "throughput"})

_own_shm_dir = None


def pytest_configure(config):
    """This pytest session's own RANKSCOPE_SHM_DIR. Every rankscope process scans its
    directory's rankscope-<uid>/ at init and every 5 s and recovers a dead process's rings
    into that process's run log: sessions run side by side (ctest -j2, the second venv) would
    otherwise append `recovered` lines to each other's logs. A tmpfs as in production;
    rankscope makes rankscope-<uid>/ inside it (the directory itself must exist)."""
    global _own_shm_dir
    if "RANKSCOPE_SHM_DIR" in os.environ and os.environ["RANKSCOPE_SHM_DIR"] in ("", "off"):
        return  # the caller turned the rings in shared memory off: keep it so
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    _own_shm_dir = tempfile.mkdtemp(prefix="rankscope-pytest-", dir=base)
    os.environ["RANKSCOPE_SHM_DIR"] = _own_shm_dir


def pytest_unconfigure(config):
    if _own_shm_dir:
        shutil.rmtree(_own_shm_dir, ignore_errors=True)  # a SIGKILLed rank's ring file stays behind


@contextlib.contextmanager
def reserved_port():
    """A local TCP port that stays this test's until the block ends: bound here (never
    listening) with SO_REUSEADDR, so no other process gets it - not another test's
    bind(0), not a connection's ephemeral port - while the c10d store, which binds with
    SO_REUSEADDR too, can listen on it. (A port released before its user binds it can be
    taken in between by whatever runs beside the test.) Nothing listens there until a
    store does: connecting to it before is refused."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def port():
    """A reserved_port() for the whole test."""
    with reserved_port() as p:
        yield p


def run_log_events(run_dir, kind):
    """Every line of `kind` in the run directory's rank logs, rank by rank."""
    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "rank-*.jsonl"))):
        with open(path) as f:
            out += [e for e in map(json.loads, f) if e["kind"] == kind]
    return out


def wait_for(condition, what, proc=None, guard_s=300):
    """Polls `condition()` until it returns something true and returns that. Fails if `proc`
    (a Popen) ends first, or after guard_s: a guard against hanging, never a measurement."""
    deadline = time.monotonic() + guard_s
    while True:
        got = condition()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process ended (exit {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {guard_s} s")
        time.sleep(0.1)


def holds_open(pid, directory):
    """Whether process `pid` has a file under `directory` open (a rank: its run log)."""
    root = os.path.realpath(directory) + os.sep
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(root):
                return True
        except OSError:
            pass
    return False


def kill_job(job, run_dirs):
    """SIGKILLs a torchrun job (a Popen started with start_new_session=True) and its ranks.
    torchrun starts its workers in sessions of their own: killing its group leaves them
    running (blocked in a collective), so each rank is killed by its heartbeat's pid - while
    that pid still holds its run directory open: pids come round again. Returns once they
    have died."""
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    killed = []
    for d in run_dirs:
        for hb in glob.glob(os.path.join(d, "rank-*.heartbeat.json")):
            try:
                with open(hb) as f:
                    pid = json.load(f)["pid"]
                if holds_open(pid, d):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            except (OSError, ValueError, KeyError):
                pass
    # Until each has died (its /proc entry gone, or a zombie nobody reaps: torchrun died first).
    wait_for(lambda: all(_dead(pid) for pid in killed), "the killed ranks gone", guard_s=60)


def _dead(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


@pytest.fixture
def run_py(tmp_path):
    """Runs a snippet in a fresh interpreter (this one) in tmp_path; returns CompletedProcess."""

    def run(code, env=None, check=True):
        e = dict(os.environ, RUN_DIR=str(tmp_path / "run"))
        e.update(env or {})
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)
        if check and p.returncode != 0:
            raise AssertionError(f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    return run


# torch.cuda.Event's shape for tests without a GPU: it lands when the test says so.
# Prepend to a run_py snippet (dedented first): run_py(FAKE_CUDA_EVENT + textwrap.dedent(code)).
FAKE_CUDA_EVENT = """
class Event:
    def __init__(self):
        self.landed = False
    def query(self):
        return self.landed
    def synchronize(self):
        self.landed = True
"""


@pytest.fixture
def torchrun(tmp_path):
    """Launches SCRIPT on NPROC local ranks with torchrun, as users do: --standalone
    by default, or an explicit c10d rendezvous endpoint (endpoint=PORT, or True for
    a reserved one). Runs in tmp_path (the default ./rankscope-runs lands there)."""

    def run(script, nproc, *args, endpoint=None, extra=(), env=None, cwd=None, timeout=600):
        with contextlib.ExitStack() as stack:
            cmd = [TORCHRUN]
            if endpoint:
                port = stack.enter_context(reserved_port()) if endpoint is True else endpoint
                cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--nnodes", "1"]
            else:
                cmd += ["--standalone"]
            cmd += ["--nproc-per-node", str(nproc), *extra, str(script), *map(str, args)]
            e = dict(os.environ, OMP_NUM_THREADS="1")
            e.update(env or {})
            return subprocess.run(cmd, cwd=cwd or tmp_path, env=e, capture_output=True, text=True, timeout=timeout)

    return run
