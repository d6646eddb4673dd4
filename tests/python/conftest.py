"""pytest setup: the package is the one `pip install .` put in this interpreter's
environment (the project's .venv), and each test gets a fresh process for init()
(rankscope is one runtime per process)."""
import os
import subprocess
import sys
import textwrap

import pytest

try:
    import rankscope  # noqa: F401
except ImportError as e:  # say how, once, rather than fail every test alike
    raise pytest.UsageError(f"rankscope is not installed in {sys.executable} ({e}): "
                            "run `pip install --no-build-isolation .` from the checkout first") from e

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


@pytest.fixture
def run_py(tmp_path):
    """Runs a snippet in a fresh interpreter (this one); returns CompletedProcess."""

    def run(code, env=None, check=True):
        e = dict(os.environ, RUN_DIR=str(tmp_path / "run"))
        e.update(env or {})
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                           timeout=120)
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


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def torchrun(tmp_path):
    """Launches SCRIPT on NPROC local ranks with torchrun, as users do: --standalone
    by default, or an explicit c10d rendezvous endpoint (endpoint=PORT, or True for
    a free one). Runs in tmp_path (the default ./rankscope-runs lands there)."""

    def run(script, nproc, *args, endpoint=None, extra=(), env=None, cwd=None, timeout=300):
        cmd = [TORCHRUN]
        if endpoint:
            port = free_port() if endpoint is True else endpoint
            cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--nnodes", "1"]
        else:
            cmd += ["--standalone"]
        cmd += ["--nproc-per-node", str(nproc), *extra, str(script), *map(str, args)]
        e = dict(os.environ, OMP_NUM_THREADS="1")
        e.update(env or {})
        return subprocess.run(cmd, cwd=cwd or tmp_path, env=e, capture_output=True, text=True, timeout=timeout)

    return run
