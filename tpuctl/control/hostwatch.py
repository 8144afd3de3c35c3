"""What a follower (`submit`, `logs -f`) does when the run's host goes quiet: say so at once, keep following while
the compute is coming back (being recreated, booting, or lost on a cluster whose recovery watcher holds the lease),
and give up with exit 9 when nothing is bringing it back or after a limit, with the command that resumes the run.
Never a silent wait on a dead host. A host process that only tpuctl restarts (the local agent: Provider.revive) is
looked at every few seconds and restarted at once, whatever the heartbeat says."""
from __future__ import annotations

import time
from typing import Callable

from ..core import knobs, layout, metrics, runindex
from ..core.errors import ErrorKind, TpuctlError
from ..core.lease import Lease
from ..core.models import ClusterState
from ..providers.base import Provider, Reporter
from ..core import runs
from ..core.runs import RunState, RunStatus, stale_seconds
from . import armed

CHECK_SECONDS = 10.0   # how often the cluster is asked while the host is quiet


def revive_seconds() -> float:
    """How often a follower makes sure the host's agent runs where only tpuctl restarts it (Provider.revive: for the
    local agent, a read of /proc), TPUCTL_REVIVE_SECONDS (3 s): a dead agent is back within seconds."""
    return knobs.number("TPUCTL_REVIVE_SECONDS", 3)


class HostWatch:
    def __init__(self, provider: Provider, st: ClusterState, run_id: str, give_up_after: float,
                 warn: Callable[[str], None], reporter: Reporter, clock: Callable[[], float] = time.monotonic) -> None:
        self.p, self.st, self.run_id, self.limit, self.warn, self.clock = provider, st, run_id, give_up_after, warn, clock
        self.reporter = reporter
        self.quiet_since: float | None = None
        self.queued_since: float | None = None
        self.checked = 0.0
        self.revive_at = 0.0                  # the next look at the agent: at once on the first poll
        self.revived_at: float | None = None  # when this follower restarted it
        self.behind: tuple[float, str] | None = None   # (when looked, the run this one waits behind or "")

    def _resume(self) -> str:
        return (f"bring the host back with `tpuctl up -c {self.st.name} ...` (the run resumes where it stopped), "
                f"then `tpuctl logs {self.run_id} -c {self.st.name} -f`")

    def __call__(self, status: RunStatus) -> None:
        """Called on each idle poll of a run that is not final; raises TpuctlError(HOST_LOST) to give up."""
        now = self.clock()
        if now >= self.revive_at:
            self.revive_at = now + revive_seconds()
            self._revive(now)
        beat = status.heartbeat
        if status.state is RunState.QUEUED:
            if self._queued_behind(now):   # a live agent busy with another run: waiting is the plan, not a fault
                self.queued_since = self.quiet_since = None
                return
            self.queued_since = self.queued_since if self.queued_since is not None else now
        quiet = (status.state in (RunState.RUNNING, RunState.STARTING, RunState.INTERRUPTED) and beat is not None
                 and time.time() - beat > stale_seconds()) \
            or (status.state is RunState.QUEUED and now - (self.queued_since or now) > stale_seconds())
        if quiet and self.revived_at is not None and now - self.revived_at < stale_seconds():
            quiet = False   # the agent restarted here takes the run over: the time any agent has to, before a word
        if not quiet:
            self.quiet_since = None
            return
        if now - self.checked < CHECK_SECONDS and self.quiet_since is not None:
            if now - self.quiet_since > self.limit:
                raise TpuctlError(ErrorKind.HOST_LOST, f"run {self.run_id}: no word from its host for "
                                  f"{(now - self.quiet_since) / 60:.0f} minutes", self._resume())
            return
        self.checked = now
        alive, detail = self.p.host_state(self.st)
        if self.quiet_since is None:
            self.quiet_since = now
            what = ("is still queued, no agent has taken it" if status.state is RunState.QUEUED
                    else "was interrupted by its host stopping, and no agent has resumed it"
                    if status.state is RunState.INTERRUPTED else f"has had no heartbeat for {stale_seconds():.0f}s")
            self.warn(f"run {self.run_id} {what}: {detail}")
        if not alive:
            watcher = self._watcher()
            if not watcher:
                raise TpuctlError(ErrorKind.HOST_LOST, f"run {self.run_id}: its host is gone ({detail})",
                                  self._resume())
            if self.quiet_since == now:
                self.warn(f"the recovery watcher on {watcher} is bringing it back; following on")

    def _queued_behind(self, now: float) -> bool:
        """Whether a live agent of this cluster heartbeats on another run (a cluster runs one run at a time: the
        agent takes the next queued run when its run ends, host/agent.py). Said once per run waited behind; the
        heartbeats are read at most as often as an agent writes them."""
        if self.behind is not None and now - self.behind[0] < runs.heartbeat_seconds():
            return bool(self.behind[1])
        said = self.behind[1] if self.behind else ""
        other, words = self._busy_with()
        self.behind = (now, other)
        if other and other != said:
            self.warn(f"run {self.run_id} is queued behind run {other} ({words}) on cluster {self.st.name}; it "
                      f"starts when that one ends (a cluster runs one run at a time; to run both at once, submit "
                      f"to another cluster)")
        return bool(other)

    def _busy_with(self) -> tuple[str, str]:
        """(a run of this cluster's queue that its agent heartbeats on now, its state and step in words), or ("", "").
        The run's own status, which the agent rewrites every few seconds while it runs it (runs.heartbeat_seconds),
        not the agent's heartbeat, which names its run only every half minute (host/agent.py beat_if_quiet)."""
        try:
            store = self.p.store(self.st)
            for other in runindex.queued(store, ensured=True, report=lambda m: None):
                if other == self.run_id:
                    continue
                st = runs.status(store, other)
                if st.state not in (RunState.RUNNING, RunState.STARTING) or st.heartbeat is None \
                        or time.time() - st.heartbeat > stale_seconds():
                    continue
                m = metrics.parse(store.read(layout.run_metrics(other)))
                return other, st.state.value + (f", step {m.step}" if m is not None and m.step is not None else "")
        except (TpuctlError, OSError, ValueError):
            pass   # a store that cannot be read now: the usual silence rules apply
        return "", ""

    def _revive(self, now: float) -> None:
        before = self.st.host.pid
        self.st = self.p.revive(self.st, self.reporter)   # says what it found and what it started
        if self.st.host.pid != before:
            self.revived_at, self.quiet_since = now, None
            self.warn(f"run {self.run_id}: the new agent ends what the dead one left of it and runs it again at once "
                      "(a new attempt, same run id and output directory: a job that checkpoints continues from "
                      "its last checkpoint); following on")

    def _watcher(self) -> str:
        """Where the watcher of a cluster armed for recovery runs, when one holds the lease; else ""."""
        try:
            store = self.p.store(self.st)
            if not armed.live(armed.read(store)):
                return ""
            holder = Lease(store, layout.WATCH_LEASE, "").holder()
        except TpuctlError:
            return ""
        return str(holder.get("where", "?")) if holder else ""
