"""What tpuctl tells a job through its environment (paths, the run, a session's end) and the exit codes a job answers
with."""
from __future__ import annotations

import os
import time


CONTINUE_CODE = 85   # "my checkpoint is written: run me again in the next session" (a notebook service's chain)
# "restart me from my checkpoint": xpk's code (its JobSet restarts exit 42 and 127-255); `submit --max-restarts N`
# lets a run restart up to N times (tpuctl/host/restarts.py). $TPUCTL_RESTARTS says how many restarts came before.
RESTART_CODE = 42


def session_ending(margin: float = 0.0) -> bool:
    """True once the session this job runs in is within `margin` seconds of its end: a notebook service's session
    (Kaggle's, TPUCTL_SESSION_DEADLINE in epoch seconds) that tpuctl continues in the next one. A job that checks it
    between steps saves its checkpoint and exits with CONTINUE_CODE, and loses no step; one that does not is
    stopped at the deadline and resumes from its last checkpoint. Always False elsewhere."""
    deadline = float(os.environ.get("TPUCTL_SESSION_DEADLINE") or 0)
    return bool(deadline) and time.time() >= deadline - margin


def output_dir(default: str = "output") -> str:
    return os.environ.get("TPUCTL_OUTPUT_DIR") or default


def output_of(run_id_: str) -> str:
    """Another run's output directory on this cluster's store (a bucket on Google Cloud): how a job reads what an
    earlier run wrote, e.g. a second training phase starting from the first one's checkpoints."""
    from tpuctl.core import layout
    store = os.environ.get("TPUCTL_STORE")
    if not store:
        raise RuntimeError("TPUCTL_STORE is not set: only a job started by tpuctl knows its cluster's store")
    return f"{store.rstrip('/')}/{layout.run_output(run_id_)}"


def data_dir(default: str = "data") -> str:
    return os.environ.get("TPUCTL_DATA_DIR") or default


def run_id() -> str:
    return os.environ.get("TPUCTL_RUN_ID", "local")
