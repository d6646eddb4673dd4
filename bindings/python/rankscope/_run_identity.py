"""The run id that every rank of one torchrun job agrees on.

torchrun without --rdzv-id sets TORCHELASTIC_RUN_ID=none in every job, so an id
taken from the environment alone puts two jobs launched one after the other in
one run directory (and triage then sees one job "restarting"). Each torchrun
invocation has its own c10d store, served by its agent for the job's whole life
(restarts included) at MASTER_ADDR:MASTER_PORT. The first rank to ask puts a
fresh id there; every other rank, and every restarted worker, reads it back: one
directory per job, a new session in it per elastic restart, and no clock guess.
"""
import datetime
import os
import secrets
import time
import uuid

_KEY = "rankscope/run_id"


def _is_uuid(s):
    try:
        uuid.UUID(s)
        return len(s) == 36
    except ValueError:
        return False


def agreed_run_id(timeout_s=60.0):
    """The job's run id from torchrun's agent store, or None when this process
    is not a torchrun worker (or the id is set explicitly: RANKSCOPE_RUN_ID)."""
    env = os.environ
    if "RANKSCOPE_RUN_ID" in env or "TORCHELASTIC_RUN_ID" not in env:
        return None
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() not in ("true", "1"):
        return None  # torch < 2 or a launcher without an agent store: the environment decides
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not addr or not (port or "").isdigit():
        return None
    from ._rankscope import _strip_userinfo
    addr = _strip_userinfo(addr)  # "user:pw@host" (some launch scripts): the host is what is reached
    from torch.distributed import TCPStore  # a torchrun worker has torch

    base = env["TORCHELASTIC_RUN_ID"]
    if base in ("", "none") or _is_uuid(base):  # no --rdzv-id, or --standalone's random one
        base = "torchrun"
    candidate = f"{base}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"
    store = TCPStore(addr, int(port), is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    # Sets the key only if it does not exist yet; returns what it holds either way.
    value = store.compare_set(_KEY, "", candidate)
    return value.decode() if isinstance(value, bytes) else str(value)
