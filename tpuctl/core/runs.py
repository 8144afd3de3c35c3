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
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Callable, TypeVar

from . import jobfiles, knobs, layout
from .errors import ErrorKind, TpuctlError, bad_input
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
    STALLED = "stalled"        # it stopped moving (host/stall.py) and `submit --on-stall` ended it (stop, or restarts spent)

    @property
    def final(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.LOST, RunState.ENDED,
                        RunState.STALLED)


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
    stall_after: float = 0.0          # `submit --stall-after` in seconds; 0: the default rule (host/stall.py)
    on_stall: str = "restart"         # `submit --on-stall`: notify, restart or stop (host/doctor.py)
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
    stalled_since: float | None = None   # the run's last progress, while it is stalled (host/stall.py)
    failure: str = ""                 # the cause of its last failed attempt (host/failures.py), "" while none

    def __post_init__(self) -> None:
        self.state = RunState(self.state)


# Today's ids carry milliseconds (YYYYMMDD-HHMMSS-mmm-xxxx); ids of earlier releases (no milliseconds) are still
# accepted in the stores that hold them.
_ID_RE = re.compile(r"^[0-9]{8}-[0-9]{6}(-[0-9]{3})?-[0-9a-f]{4}$")


def stalls(store: BlobStore, run_id: str) -> list[dict[str, Any]]:
    """The run's stall records (host/doctor.py), oldest first: `since` (its last progress), `at` (when seen),
    `action`, `worker`, `why`."""
    out = []
    for key, _ in store.list(layout.run_stalls(run_id)):
        doc = read_json(store, key)
        if doc:
            out.append(doc)
    return sorted(out, key=lambda d: float(d.get("at") or 0))


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


class Unreadable(TpuctlError):
    """A run's job.json or status.json that is no such record (a job or a host wrote it, and either can write
    anything): that run's problem, said on its row, never the cluster's (core/jobfiles.py)."""

    def __init__(self, run_id: str, why: str) -> None:
        super().__init__(ErrorKind.ERROR, f"run {run_id}: {why}",
                         "its job or host wrote it: its other files, and the cluster's other runs, are still read")
        self.why = why


# What each field of a record must hold, by its annotation (the records are flat: models.JsonRecord)
_HOLDS: dict[str, Callable[[Any], bool]] = {
    "str": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "dict[str, str]": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
}
R = TypeVar("R", RunSpec, RunStatus)


def _record(cls: type[R], store: BlobStore, run_id: str, key: str) -> R | None:
    name = key.rsplit("/", 1)[-1]
    try:
        d = jobfiles.read_object(store, key)
        if d is None:
            return None
        rec = cls.from_json(d)
    except jobfiles.Unreadable as e:
        raise Unreadable(run_id, str(e)) from None
    except (TypeError, ValueError) as e:   # a field missing, a state no RunState has
        raise Unreadable(run_id, f"{name} is unreadable: {str(e)[:120]}") from None
    for f in fields(rec):
        kind = str(f.type)
        base = kind.removesuffix(" | None")
        v = getattr(rec, f.name)
        if v is None and base != kind:
            continue
        if base in _HOLDS and not _HOLDS[base](v):
            raise Unreadable(run_id, f"{name} is unreadable: its {f.name} is {type(v).__name__}, not {base}")
        if base == "float":
            setattr(rec, f.name, float(v))
    return rec


def job(store: BlobStore, run_id: str) -> RunSpec | None:
    """The run's job.json; None when there is none; Unreadable when it is no RunSpec."""
    return _record(RunSpec, store, run_id, layout.run_job(run_id))


def status(store: BlobStore, run_id: str, worker: int = 0) -> RunStatus:
    """Worker `worker`'s status of the run (queued when none is written yet); Unreadable when it is no RunStatus."""
    return _record(RunStatus, store, run_id, layout.run_status(run_id, worker)) or RunStatus()


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
