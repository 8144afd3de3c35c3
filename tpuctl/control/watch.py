"""The recovery watcher (`tpuctl watch`): a process that is not the TPU looks at an armed cluster's compute and,
when it is lost (provider.compute_lost: preempted, terminated, missing, a suspended or failed queued request),
re-creates it through `up`'s own code path (the same zone first, then the cluster's other zones; backoff while
none has capacity). The new host's agent resumes the interrupted run from its checkpoint (host/claims.py).

Only the lease holder acts (core/lease.py); another watcher stands by. Each look renews the lease, and during a
re-create a keeper renews it, so a watcher killed mid-re-create lets its lease lapse and the next one finds the
half-made compute and adopts it (`up` adopts by name and label). The watch ends, and every watcher exits, when
the armed record says so (`down`, limits) or when the host ended its own compute (autostop, --max-duration,
`submit --down`: final, never undone), or when the run the cluster was armed for has ended.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable

from ..core import layout, notify, runs, state
from ..core.errors import ErrorKind, TpuctlError
from ..core.lease import Lease
from ..core.models import ClusterState, Phase
from ..core.store import BlobStore
from ..providers.base import Provider, Reporter, WatcherHost
from . import armed, budgetstop, up as up_flow
from .status import stopped_by_host


def poll_seconds() -> float:
    return float(os.environ.get("TPUCTL_WATCH_POLL", "30"))


def backoff_seconds(tries: int) -> float:
    """While every zone is out of capacity: 30 s, 60 s, ... up to 10 minutes (TPUCTL_RECOVER_BACKOFF scales it)."""
    base = float(os.environ.get("TPUCTL_RECOVER_BACKOFF", "30"))
    return min(base * 2 ** min(tries, 10), base * 20)


def lease_of(store: BlobStore, where: str) -> Lease:
    return Lease(store, layout.WATCH_LEASE, where)


class Watcher:
    def __init__(self, st: ClusterState, provider: Provider, reporter: Reporter, where: str = "",
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.st, self.p, self.r, self.sleep = st, provider, reporter, sleep
        self.store = provider.store(st)
        self.where = where or f"{socket.gethostname()} (pid {os.getpid()})"
        self.lease = lease_of(self.store, self.where)
        self.holding = False

    # -- the loop --------------------------------------------------------------------------------------
    def run(self) -> str:
        """Watch until the watch ends; returns why it ended."""
        try:
            while True:
                why = self.look()
                if why:
                    return why
                self.sleep(poll_seconds())
        finally:
            if self.holding:
                self.lease.release()
            notify.flush()   # what it has to tell leaves before the process ends (bounded)

    def look(self) -> str | None:
        """One look: why the watch is over, or None to look again."""
        doc = armed.read(self.store)
        if not armed.live(doc):
            return str(doc.get("ended") if doc else "") or "the cluster is not armed for recovery"
        assert doc is not None
        if not self._hold():
            return None
        self.st = armed.sync(self.st, self.store)
        ended = self._ended(doc)
        if ended:
            armed.end(self.store, ended)
            return ended
        pending = doc.get("recovering") or {}
        if pending:   # a watcher died while re-creating: finish its recovery (`up` adopts what it began)
            self.recover(str(pending.get("lost", "")), pending)
            return None
        lost = self.p.compute_lost(self.st) if self.st.phase is Phase.READY else "a re-create was interrupted"
        if not lost:
            return None
        if int(doc.get("recoveries", 0)) >= int(doc.get("max_recoveries", armed.DEFAULT_MAX_RECOVERIES)):
            why = f"gave up: {lost}, and all {doc.get('max_recoveries')} recoveries (--max-recoveries) are used"
            armed.end(self.store, why)
            notify.emit(self.store, "cluster.recovery_given_up", f"cluster.recovery_given_up-{doc.get('armed_at')}",
                        self.st.name, why=why)
            return why
        over = budgetstop.spent(self.store, self.st)
        if over:
            return budgetstop.stop(self.st, self.p, self.r, self.store, over, self.where, lost)
        self.recover(lost)
        return None

    def _hold(self) -> bool:
        """Hold the lease (renewing it), or stand by while another watcher does."""
        if self.holding and self.lease.renew(looked=time.time(), doing="watching"):
            return True
        if self.holding:
            self.r.info("handed the lease over (a command asked for it, or it lapsed): standing by")
        self.holding = self.lease.acquire()
        if self.holding:
            self.r.info(f"watching cluster {self.st.name}: holding its lease")
            self.lease.renew(looked=time.time(), doing="watching")
        else:
            rec = self.lease.holder()
            self.r.info(f"standing by: the watcher on {rec.get('where') if rec else '?'} holds the lease")
        return self.holding

    def _ended(self, doc: dict[str, Any]) -> str:
        """Why the watch is over, or ""."""
        stopped = stopped_by_host(self.st, self.p)
        if stopped:
            return f"the host ended its compute itself ({stopped[0]}): not brought back"
        run_id = str(doc.get("run") or "")
        if run_id and runs.status(self.store, run_id).state.final:
            return f"run {run_id} ended ({runs.status(self.store, run_id).state.value})"
        if doc.get("until") and time.time() > float(doc["until"]):
            return "the recovery window (--recover-for) is over"
        return ""

    # -- bringing it back ------------------------------------------------------------------------------
    def recover(self, lost: str, pending: dict[str, Any] | None = None) -> None:
        """Re-create the compute; `pending`: the recovery a dead watcher began (recorded before it re-created)."""
        if pending:
            start, zone_before = float(pending["detected_at"]), str(pending.get("zone_before", ""))
            self.r.warn(f"cluster {self.st.name}: finishing the re-create another watcher began ({lost})")
        else:
            start, zone_before = time.time(), self.st.zone
            self.r.warn(f"cluster {self.st.name}: {lost}; re-creating it")
            self.st.compute_ended(start)   # lost compute bills no more: the next period begins when it is back
            state.save(self.st)
            mark = {"lost": lost, "detected_at": start, "zone_before": zone_before}
            armed.update(self.store, lambda d: {**d, "recovering": mark, "state": self.st.to_json()} if d else None)
        beats = [float(b.get("time", 0)) for b in runs.heartbeats(self.store) if b.get("worker") == 0]
        with self.lease.keep():
            if not self.lease.renew(doing=f"re-creating ({lost})"):
                return   # a command (`down`) asked for the lease before this re-create began: it is theirs now
            if not pending:
                notify.emit(self.store, "cluster.preempted", f"cluster.preempted-{start}", self.st.name, lost=lost,
                            zone=zone_before)
            tries = 0
            while True:
                if not armed.live(armed.read(self.store)):
                    return   # `down` (or a limit) ended the watch while we waited
                try:
                    self.st = up_flow.up(self.st.spec, self.p, self.r, regrant=False)
                    break
                except TpuctlError as e:
                    wait = backoff_seconds(tries)
                    self.r.warn(f"re-create failed: {e.message}; trying again in {wait:.0f}s")
                    tries += 1
                    self.sleep(wait)
        back = time.time()
        rec = {"lost": lost, "detected_at": start, "last_heartbeat": max(beats, default=0.0), "back_at": back,
               "gone_seconds": round(back - (max(beats, default=0.0) or start), 1), "zone_before": zone_before,
               "zone": self.st.zone, "tries": tries + 1, "watcher": self.where}
        armed.update(self.store, lambda d: {**d, "recoveries": int(d.get("recoveries", 0)) + 1, "recovering": {},
                                            "state": self.st.to_json()} if d else None)
        n = armed.record_recovery(self.store, rec)
        notify.emit(self.store, "cluster.recovered", f"cluster.recovered-{start}", self.st.name, recovery=n,
                    took_s=round(back - start, 1), gone_s=rec["gone_seconds"], zone=self.st.zone)
        self.r.info(f"recovery {n}: cluster {self.st.name} is back in {self.st.zone} after "
                    f"{back - start:.0f}s; the agent resumes the interrupted run from its checkpoint")


def load_for_watch(name: str, store: BlobStore | None) -> ClusterState | None:
    """The cluster's state: local, else (a machine that did not make it, such as a watcher VM) from the armed
    record, kept locally from then on."""
    st = state.load(name)
    if st is not None or store is None:
        return st
    doc = armed.read(store)
    if not doc or "state" not in doc:
        return None
    st = ClusterState.from_json(doc["state"])
    state.save(st)
    return st


class CommandLease:
    """`up` and `down` of a cluster that is or was armed hold the lease while they work, so no watcher re-creates
    what `down` deletes or races `up`; a cluster never armed (no record) is left alone: no watcher can be about."""

    def __init__(self, st: ClusterState, provider: Provider, command: str, waiting: Callable[[str], None]) -> None:
        self.store = provider.store(st)
        self.lease: Lease | None = None
        self.keeper: Any = None
        self.command, self.waiting = command, waiting

    def __enter__(self) -> "CommandLease":
        try:
            doc = armed.read(self.store)
        except TpuctlError:
            return self   # no store yet: nothing was ever armed
        if doc is None:
            return self
        self.lease = lease_of(self.store, f"`tpuctl {self.command}` on {socket.gethostname()} (pid {os.getpid()})")
        self.lease.take(float(os.environ.get("TPUCTL_LEASE_WAIT", "1800")), self.waiting)
        self.keeper = self.lease.keep().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.lease is not None:
            self.keeper.__exit__()
            self.lease.release()


def start_watcher_vm(st: ClusterState, provider: Provider, host: WatcherHost, reporter: Reporter) -> str:
    """`up --recover --watcher vm`: the VM in the cluster's zone, and the wait (TPUCTL_WATCHER_WAIT seconds, 600:
    it boots and installs the watcher first) until its watcher holds the lease. Returns where it runs."""
    store = provider.store(st)
    zone, vm = st.zone, host.name(st.spec)
    armed.update(store, lambda d: {**d, "watcher": armed.ON_VM, "watcher_zone": zone} if d else None)
    host.ensure(st, zone, reporter)
    lease = lease_of(store, "")
    deadline = time.monotonic() + float(os.environ.get("TPUCTL_WATCHER_WAIT", "600"))
    reporter.resource("watcher", vm, "booting: installing the watcher")
    while True:
        rec = lease.holder()
        if rec and str(rec.get("where", "")).startswith(f"VM {vm}"):
            reporter.resource("watcher", vm, "watching", final=True)
            return str(rec["where"])
        if time.monotonic() >= deadline:
            raise TpuctlError(ErrorKind.TIMEOUT, f"the watcher VM {vm} has not started watching",
                              f"its boot log: `tpuctl status -c {st.name}`; the cluster is armed: `tpuctl watch -c "
                              f"{st.name} --detach` runs a watcher here meanwhile")
        time.sleep(min(poll_seconds(), 2.0))
