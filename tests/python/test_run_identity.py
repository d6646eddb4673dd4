"""One run directory per job, one session per elastic restart: torchrun launches
with the defaults users get (no --rdzv-id, so TORCHELASTIC_RUN_ID=none)."""
import glob
import json
import os
import subprocess
import sys

from conftest import run_log_events

RANKSCOPE = os.path.join(os.path.dirname(sys.executable), "rankscope")

JOB = r"""
import os, sys, torch, torch.distributed as dist
import rankscope, rankscope.torch as rst
rankscope.init()
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if attempt == 0 and "--fail-once" in sys.argv:
    # The first attempt dies before its process group forms; torchrun restarts
    # the job. (With a gloo group formed or forming, the restarted ranks can pick
    # up the previous attempt's addresses from the store and fail to connect,
    # with or without rankscope: a torch race, not what this tests.)
    rankscope.shutdown()
    os._exit(3)
dist.init_process_group("gloo")
rst.instrument()
for step in range(5):
    with rankscope.phase("forward"):
        t = torch.ones(4)
    dist.all_reduce(t)
    rankscope.step(step)
dist.barrier()
dist.destroy_process_group()
if rank == 0:
    print(rankscope.run_dir(), flush=True)
rankscope.shutdown()
"""


def _sessions(run_dir):
    """(rank, restart_count) of every run_start in the run directory."""
    return sorted((e["rank"], e["restart"]) for e in run_log_events(run_dir, "run_start"))


def _triage(run_dir):
    p = subprocess.run([RANKSCOPE, "triage", run_dir, "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)


def _jobs(tmp_path, torchrun, **kw):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    dirs = []
    for _ in range(2):  # the same command twice, one after the other
        p = torchrun(script, 2, timeout=600, **kw)
        assert p.returncode == 0, p.stderr[-3000:]
        dirs.append(str(tmp_path / p.stdout.strip().splitlines()[-1]))
    return dirs


def test_two_standalone_jobs_back_to_back_get_two_run_directories(tmp_path, torchrun):
    first, second = _jobs(tmp_path, torchrun)
    assert first != second
    assert os.path.basename(first).startswith("torchrun-")  # not "none"
    assert sorted(glob.glob(str(tmp_path / "rankscope-runs" / "*"))) == sorted([first, second])
    for d in (first, second):
        assert _sessions(d) == [(0, 0), (1, 0)]
        kinds = {f["kind"] for f in _triage(d)["findings"]}
        assert "restart" not in kinds, kinds


def test_two_jobs_on_one_rendezvous_endpoint_get_two_run_directories(tmp_path, torchrun, port):
    # Identical environments: the same endpoint (reserved for this test), no --rdzv-id.
    first, second = _jobs(tmp_path, torchrun, endpoint=port)
    assert first != second
    for d in (first, second):
        assert _sessions(d) == [(0, 0), (1, 0)]


def test_an_elastic_restart_is_a_new_session_in_the_same_run_directory(tmp_path, torchrun):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    p = torchrun(script, 2, "--fail-once", extra=["--max-restarts", "1"], timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = str(tmp_path / p.stdout.strip().splitlines()[-1])
    assert glob.glob(str(tmp_path / "rankscope-runs" / "*")) == [run_dir]
    # Both ranks' second attempt, and the first attempts that started a session
    # before torchrun stopped them (the first rank to die gets the other stopped).
    sessions = set(_sessions(run_dir))
    assert {(0, 1), (1, 1)} <= sessions <= {(0, 0), (0, 1), (1, 0), (1, 1)} and len(sessions) >= 3, sessions
    restarts = [f for f in _triage(run_dir)["findings"] if f["kind"] == "restart"]
    # One finding for the restart; it names the rank that ended the attempt (here
    # whichever first-attempt rank exited first: both exit alike) and lists every
    # rank whose first attempt it saw as restarted. Which ranks got a first session
    # depends on how fast torchrun stops the second one, so both cases are checked.
    first = sorted({r for r, n in sessions if n == 0})
    listed = ("rank " if len(first) == 1 else "ranks ") + ",".join(map(str, first)) + " restarted"
    assert len(restarts) == 1 and restarts[0]["ranks"] in [[r] for r in first], restarts
    assert listed in restarts[0]["summary"], restarts


def test_an_explicit_run_id_wins(tmp_path, torchrun):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    p = torchrun(script, 2, env={"RANKSCOPE_RUN_ID": "mine"}, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == os.path.join("rankscope-runs", "mine")


def test_an_unreachable_store_is_said_once_and_the_environment_decides(run_py, tmp_path, port):
    # The port is reserved for this test and nothing listens there: connecting is refused.
    p = run_py("""
        import rankscope, rankscope._run_identity as ri
        ri.agreed_run_id.__defaults__ = (2.0,)   # the store's connect timeout, shortened for the test
        rankscope.init()
        print(rankscope.context()["run_id"])
        rankscope.shutdown()
    """, env={"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "none",
              "TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
              "RANKSCOPE_DIR": str(tmp_path / "run")})
    assert p.stderr.count("could not agree on a run id through torchrun's store") == 1, p.stderr
    assert p.stdout.strip().splitlines()[-1] == f"run-127.0.0.1-{port}"
