"""Run records in the store (keys in layout.py), shared by the CLI (submit, logs, jobs, cancel) and the agent:
the run spec (`job.json`), the run status (`status[-wN].json`), following a run's log chunks, and the two indexes
that keep every command's cost independent of how many runs the store holds (runindex.py).
Run ids sort by submission time, so the latest run is the greatest id.
"""
from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from . import knobs, layout
from .errors import bad_input
from .models import JsonRecord
from .store import BlobStore


class RunState(str, Enum):
    QUEUED = "queued"          # written, not yet claimed
    STARTING = "starting"      # claimed; unpacking, installing requirements
    RUNNING = "running"
    INTERRUPTED = "interrupted"  # its host stopped (shutdown, maintenance, preemption): the next agent resumes it
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"              # its host stopped heartbeating too many times
    ENDED = "ended"            # its compute is gone for good (`tpuctl down`): its status note says why

    @property
    def final(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.LOST, RunState.ENDED)


@dataclass
class RunSpec(JsonRecord):
    """`job.json`: what `submit` asks the agent to run. Written once."""
    id: str
    name: str
    command: str
    package: str                      # sha256 of the job package
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    requirements: str = ""
    submitted: float = 0.0
    cluster: str = ""
    framework: str = "tensorflow"     # models.Framework: which workers of a slice run the command
    down_after: bool = False          # `submit --down`: the host ends the compute once this run is final
    tensorflow: str = ""              # tpuctl.toml's `tensorflow`: what a host on a base runtime installs for it
    max_restarts: int = 0             # `submit --max-restarts`: restarts after exit 42 or a signal (host/restarts.py)
    keras_backend: str = ""           # tpuctl.toml's `keras_backend` (framework "keras"): "" lets the host pick
    queue: str = ""                   # `submit --queue` (GKE): the Kueue LocalQueue the run waits in; "": none
    priority: str = ""                # `submit --priority` (GKE): the run's PriorityClass; "": the cluster's default
    namespace: str = ""               # `submit --namespace` (GKE): the JobSet's namespace; "": default


@dataclass
class RunStatus(JsonRecord):
    """`status[-wN].json`: rewritten by the agent of worker N at each change and heartbeat."""
    state: RunState = RunState.QUEUED
    exit_code: int | None = None
    started: float | None = None
    ended: float | None = None
    heartbeat: float | None = None
    host: str = ""
    worker: int = 0
    attempt: int = 1
    pid: int | None = None
    note: str = ""                    # what went wrong around the run, not in it (the store full: storeguard.py)
    restarts: int = 0                 # of submit --max-restarts, spent so far (host/restarts.py)

    def __post_init__(self) -> None:
        self.state = RunState(self.state)


# Today's ids carry milliseconds (YYYYMMDD-HHMMSS-mmm-xxxx); ids of earlier releases (no milliseconds) are still
# accepted in the stores that hold them.
_ID_RE = re.compile(r"^[0-9]{8}-[0-9]{6}(-[0-9]{3})?-[0-9a-f]{4}$")


def heartbeats(store: BlobStore) -> list[dict[str, Any]]:
    """Every agent's last heartbeat (layout.agent_heartbeat, written by agent.Agent.beat); an unreadable one is
    skipped."""
    out = []
    for key, _ in store.list(layout.AGENTS_PREFIX):
        try:
            beat = json.loads(store.read(key) or b"{}")
        except ValueError:
            continue
        if isinstance(beat, dict):
            out.append(beat)
    return out


def stale_seconds() -> float:
    """No heartbeat for this long (TPUCTL_STALE_SECONDS, 90 s) means a run's host went quiet: agents take the run
    over, followers warn (hostwatch.py)."""
    return knobs.number("TPUCTL_STALE_SECONDS", 90)


def heartbeat_seconds() -> float:
    """How often a running attempt rewrites its status: every 5 s, and at least three times within the time that
    makes a host stale, so neither a peer (host/rounds.py) nor a follower takes a live host for a lost one."""
    return min(5.0, stale_seconds() / 3)


def stop_grace() -> float:
    """Seconds a job gets between its SIGTERM and its SIGKILL when its agent is stopped (TPUCTL_STOP_GRACE, 20 s):
    inside the agent unit's TimeoutStopSec (startup.sh) and a spot VM's 30-second preemption notice."""
    return knobs.number("TPUCTL_STOP_GRACE", 20)


def new_id(now: Callable[[], float] = time.time) -> str:
    """An id that sorts after every id this machine made before (its submission order), and after every other
    machine's made earlier by the clock: the millisecond, moved past the last one issued here (kept under
    tpuctl's state directory, taken under a lock, so processes submitting at once get distinct, ordered ids)."""
    from . import state
    ms = int(now() * 1000)
    ms = state.next_stamp(ms)
    return (time.strftime("%Y%m%d-%H%M%S", time.gmtime(ms // 1000)) + f"-{ms % 1000:03d}-"
            + secrets.token_hex(2))


def is_id(run_id: str) -> bool:
    """Whether `run_id` is one new_id could have made: its shape and a real date and time."""
    if not _ID_RE.match(run_id):
        return False
    try:
        time.strptime(run_id[:15], "%Y%m%d-%H%M%S")
    except ValueError:
        return False
    return True


def check_id(run_id: str) -> str:
    """A run id as new_id makes them; checked before any store access (an id is part of store keys)."""
    if not is_id(run_id):
        raise bad_input(f"{run_id!r} is not a run id",
                        "run ids look like 20261122-174500-123-3f2a (its start, as 20261122-1745, or its end, "
                        "as 3f2a, will do when only one run has it); `tpuctl jobs` lists them")
    return run_id


def read_json(store: BlobStore, key: str) -> dict[str, Any] | None:
    raw = store.read(key)
    return json.loads(raw) if raw else None


def read_object(store: BlobStore, key: str) -> dict[str, Any]:
    """A JSON object the CLI only reports on: {} when it is missing, corrupt or not an object, so a damaged file
    never stops `status`."""
    try:
        doc = json.loads(store.read(key) or b"null")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def cancel_request(now: float) -> bytes:
    """What `tpuctl cancel` writes: when, and who (the user and machine the CLI ran as), for the run's log."""
    import getpass
    import socket
    try:
        who = f"{getpass.getuser()}@{socket.gethostname()}"
    except Exception:  # noqa: BLE001 - no user name (a container without one): the machine alone
        who = socket.gethostname()
    return json.dumps({"time": now, "by": who}).encode()


def cancelled_by(store: BlobStore, run_id: str) -> str:
    """The line a cancelled run's log ends with: who cancelled it, and when (UTC); "" without a cancel request
    (the run's deadline ended it: its own line says so) or when the store cannot say (the run ends all the same)."""
    try:
        doc = read_object(store, layout.run_cancel(run_id))
    except Exception:  # noqa: BLE001 - a store outage must not keep a run from ending
        return ""
    if not doc:
        return ""
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(doc.get("time") or 0)))
    return f"cancelled by {doc.get('by') or 'tpuctl cancel'} at {at}"


def job(store: BlobStore, run_id: str) -> RunSpec | None:
    d = read_json(store, layout.run_job(run_id))
    return RunSpec.from_json(d) if d is not None else None


def status(store: BlobStore, run_id: str, worker: int = 0) -> RunStatus:
    d = read_json(store, layout.run_status(run_id, worker))
    return RunStatus.from_json(d) if d is not None else RunStatus()


def follow(store: BlobStore, run_id: str, write: Callable[[bytes], None], worker: int = 0, follow: bool = True,
           sleep: Callable[[float], None] = time.sleep, max_idle: float | None = None,
           watch: Callable[[RunStatus], None] = lambda st: None) -> RunStatus:
    """Write every chunk in order, once. While following, poll the next chunk with backoff when idle (so an idle
    run costs a bounded number of store requests) and stop once the run is final and its last chunk is out.
    Returns the final (or current, when not following) status."""
    max_idle = max_idle if max_idle is not None else knobs.number("TPUCTL_LOG_POLL_MAX", 1.0)
    n, idle = 1, 0.05
    while True:
        data = store.read(layout.log_chunk(run_id, worker, n))
        if data is not None:
            write(data)
            n += 1
            idle = 0.05
            continue
        st = status(store, run_id, worker)
        if st.state.final:
            # The agent writes its last chunk before the final status: drain what is left, then done.
            while (data := store.read(layout.log_chunk(run_id, worker, n))) is not None:
                write(data)
                n += 1
            return st
        if not follow:
            return st
        watch(st)   # may give up on a host that is gone (hostwatch.py)
        sleep(idle)   # idle: two requests per poll, polls spaced out to max_idle, so an idle run costs little
        idle = min(idle * 2, max_idle)
