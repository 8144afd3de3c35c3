"""Why an attempt failed, sorted by cause: one table, a test per row (tests/test_failures.py). The agent classifies
each job that ended badly on this host from its exit code and the tail of its output (and, for three causes, from
what the agent itself saw), and the cause decides what happens next:

- oom: HBM ("Ran out of memory in memory space hbm", "Program hbm requirement", RESOURCE_EXHAUSTED allocating a
  device buffer), or host RAM (exit 137 with the kernel's OOM kill counted in the agent's cgroup): never restarted,
  --max-restarts notwithstanding (the same program runs out again), with a hint;
- device-busy ("The TPU is already in use", libtpu's lockfile, "Device or resource busy") and no-tpu ("No
  accelerator found", "Failed to get global TPU topology", FAILED_PRECONDITION from the TPU driver): libtpu's
  lockfile is cleared when no process holds it and the job restarts once, not counted; a second time on this host
  the host is marked sick (layout.host_sick) and the run fails;
- coordinator (JAX distributed start-up or heartbeat time-outs): restarted per --max-restarts, with the firewall
  hint of docs/multihost.md;
- preempted (the agent was stopped), lost-host (another host went quiet, rounds.py), stalled (doctor.py): told by
  the agent, not by the output;
- job: anything else, the job's own error, restarted per --max-restarts as xpk does (restarts.py).
docs/troubleshooting.md holds the same table for users.

The texts are as libtpu, XLA and JAX print them (tensorflow's
tpu_initializer_helper.cc TryAcquireTpuLock for the lockfile; jax-ml/jax#13260, #10192, #23599; marin-community/marin
job-monitoring-loop.md, which treats "No accelerator found", FAILED_PRECONDITION and "Device or resource busy" as a bad
node; erfanzar/EasyDeL#78 and #166, huggingface/diffusers#8358 for HBM OOM). A tail matching several rows gets the
first: an OOM on this host ends its coordinator's heartbeats too.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass

from ..core import layout
from ..core.store import BlobStore

LOCKFILE = "/tmp/libtpu_lockfile"   # libtpu's lockf(F_TLOCK) file (tpu_initializer_helper.cc)
TAIL_BYTES = 64 * 1024              # the output the patterns are matched against
HOST_OOM_EXIT = 137                 # 128 + SIGKILL: what the kernel's OOM killer leaves
DEVICE = ("device-busy", "no-tpu")


@dataclass(frozen=True)
class Row:
    cause: str
    patterns: tuple[str, ...]   # regular expressions over the tail of the job's output
    hint: str


TABLE: tuple[Row, ...] = (
    Row("oom", (r"Ran out of memory in memory space (hbm|vmem)", r"Program hbm requirement",
                r"Largest program allocations in hbm", r"Total hbm usage >=",
                r"RESOURCE_EXHAUSTED:.*(Error allocating device buffer|[Oo]ut of memory|hbm|HBM)"),
        "the program does not fit the TPU's memory, and would not on a restart: use a smaller batch (or model, or "
        "sequence), or a larger --type (more chips, more HBM); not restarted"),
    Row("device-busy", (r"TPU is already in use", r"libtpu\.so already in use", r"libtpu_lockfile",
                        r"Device or resource busy"),
        "another process held the TPU (a job left running, or its lockfile left behind by a killed one)"),
    Row("no-tpu", (r"No accelerator found", r"Failed to get global TPU topology", r"Unable to initialize backend 'tpu'",
                   r"FAILED_PRECONDITION", r"open\(/dev/accel\d+\): Operation not permitted",
                   r"TPU initialization failed"),
        "the job found no usable TPU on this host (its driver refused it)"),
    Row("coordinator", (r"Barrier timed out", r"PjRT_Client_Connect", r"Wait_for_all_tasks_to_register",
                        r"heartbeat timeout", r"cluster registration failed",
                        r"Failed to send RPC to coordination service",
                        r"JAX distributed service detected fatal errors"),
        "the hosts' JAX processes could not reach each other: a host that never started, or a firewall that "
        "closes tcp 8080-8081, 8470-8476 and 8482 between them (docs/multihost.md: `up --network NET "
        "--create-firewall`)"),
)
AGENT_SEEN = {   # causes the agent tells from what it saw, not from the output
    "preempted": "the agent was stopped: its host shut down, went into maintenance or was preempted",
    "lost-host": "another host of the run went quiet or was stopped",
    "stalled": "the run stopped moving (the run doctor)",
}
JOB_HINT = "the job's own error: its log's last lines say which"


@dataclass
class Tally:
    """An attempt's count on this host (attempt.py): the kernel's OOM kills when its job last started, TPU failures
    so far (device-busy, no-tpu), and whether the restart decided now is one --max-restarts does not count."""
    oom_before: int = -1
    device: int = 0
    free: bool = False
    moved: str = ""   # a GKE pod's sick host: its node was cordoned (cordon.py), and what to say of it


@dataclass(frozen=True)
class Failure:
    cause: str
    hint: str
    line: str = ""   # the line of the output that told it

    @property
    def restartable(self) -> bool | None:
        """False: never restart (oom); True: restart once, not counted (device); None: as --max-restarts says."""
        return False if self.cause == "oom" else True if self.cause in DEVICE else None


def classify(rc: int, tail: str, host_oom: bool = False, seen: str = "") -> Failure:
    """The cause of a job's failure: `seen`, one of AGENT_SEEN's, when the agent saw it; else from `tail` (its last
    output) and `rc`; `host_oom`: the kernel OOM-killed a process in the agent's cgroup while the job ran."""
    if seen:
        return Failure(seen, AGENT_SEEN[seen])
    for row in TABLE:
        for pattern in row.patterns:
            m = re.search(pattern, tail)
            if m:
                start, end = tail.rfind("\n", 0, m.start()) + 1, tail.find("\n", m.end())
                return Failure(row.cause, row.hint, tail[start:end if end >= 0 else None].strip()[:300])
    if rc == HOST_OOM_EXIT and host_oom:
        return Failure("oom", "the kernel ended the job for want of host memory (exit 137): load less at once "
                              "(data, a smaller batch), or a --type with more host RAM; not restarted",
                       "killed by the kernel's OOM killer")
    return Failure("job", JOB_HINT)


def oom_kills() -> int:
    """The kernel's OOM kills so far in this process's memory cgroup (v2: memory.events `oom_kill`; v1:
    memory.oom_control `oom_kill`), -1 where it cannot be read. The job runs in the agent's cgroup (or one below
    it: v2's memory.events counts the cgroup's descendants too, "all fields in this file are hierarchical": the
    kernel's Documentation/admin-guide/cgroup-v2.rst). /proc/self/cgroup names the cgroup: `0::PATH` on v2 (the
    unified hierarchy, mounted at /sys/fs/cgroup), `N:memory:PATH` on v1 (the memory controller's hierarchy, at
    /sys/fs/cgroup/memory); a hybrid host lists both, and its `0::` line names the unified hierarchy, which has no
    memory controller there, so the v1 line answers (cgroups(7), "/proc/[pid]/cgroup").
    TPUCTL_PROC_CGROUP and TPUCTL_CGROUP_ROOT point the tests at a fixture tree."""
    root = os.environ.get("TPUCTL_CGROUP_ROOT") or "/sys/fs/cgroup"
    try:
        with open(os.environ.get("TPUCTL_PROC_CGROUP") or "/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return -1
    for line in lines:
        try:
            _, controllers, path = line.split(":", 2)
        except ValueError:
            continue
        path = path.rstrip("/")   # "/" inside a container's cgroup namespace: the container's own cgroup
        where = f"{root}{path}/memory.events" if controllers == "" else \
            f"{root}/memory{path}/memory.oom_control" if "memory" in controllers.split(",") else ""
        try:
            with open(where) as f:
                for field in f.read().splitlines():
                    if field.startswith("oom_kill "):
                        return int(field.split()[1])
        except (OSError, ValueError):
            continue
    return -1


def lockfile() -> str:
    """libtpu's lockfile (TPUCTL_LIBTPU_LOCKFILE for the tests)."""
    return os.environ.get("TPUCTL_LIBTPU_LOCKFILE") or LOCKFILE


def clear_lockfile() -> str:
    """Removes libtpu's lockfile when no process has it open (lsof's answer, from /proc/*/fd): what was done, in
    words. A holder is named, not killed: it may be another user's job."""
    path = lockfile()
    if not os.path.exists(path):
        return f"no {path} to clear"
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                    return f"{path} is held by pid {pid}: left alone"
            except OSError:
                continue
    try:
        os.unlink(path)
    except OSError as e:
        return f"could not remove {path}: {e.strerror}"
    return f"removed {path}, which no process held"


SICK_RESTARTS = 8   # restarts a sick host's run waits through for the recovery watcher to replace the host


def replaced_by_watcher(store: BlobStore) -> bool:
    """Whether the cluster is armed for recovery (`up --recover`: layout.WATCH_ARMED, control/armed.py), whose
    watcher replaces a sick host (control/watch.py)."""
    try:
        doc = json.loads(store.read(layout.WATCH_ARMED) or b"null")
    except ValueError:
        return False
    return bool(isinstance(doc, dict) and doc.get("armed") and not doc.get("ended"))


def mark_sick(store: BlobStore, host: str, worker: int, why: str) -> None:
    """This host failed to get its TPU twice: recorded for `status` and for the host's replacement."""
    store.write(layout.host_sick(host), json.dumps({"host": host, "worker": worker, "why": why,
                                                    "time": time.time()}).encode())
