"""pytest setup: the package comes from the build tree (build/python), and each
test gets a fresh process for init() (rankscope is one runtime per process)."""
import os
import subprocess
import sys
import textwrap

import pytest

BUILD_PY = os.environ.get("RANKSCOPE_PYTHONPATH", os.path.join(os.path.dirname(__file__), "..", "..", "build", "python"))
sys.path.insert(0, os.path.abspath(BUILD_PY))


@pytest.fixture
def run_py(tmp_path):
    """Runs a snippet in a fresh /usr/bin/python3 with the package on its path; returns CompletedProcess."""

    def run(code, env=None, check=True):
        e = dict(os.environ, PYTHONPATH=os.path.abspath(BUILD_PY), RUN_DIR=str(tmp_path / "run"))
        e.update(env or {})
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                           timeout=120)
        if check and p.returncode != 0:
            raise AssertionError(f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    return run
