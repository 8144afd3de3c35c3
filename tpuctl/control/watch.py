"""The recovery watcher (`tpuctl watch`): a process that is not the TPU looks at an armed cluster's compute and,
when it is lost (provider.compute_lost: preempted, terminated, missing, a suspended or failed queued request),
re-creates it through `up`'s own code path (the same zone first, then the cluster's other zones; backoff while
none has capacity). The new host's agent runs the interrupted run again (host/claims.py), from its checkpoint if the
job wrote one; the watcher says from which step once the job's metrics show it (armed.resumption).

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

from ..core import knobs, layout, notify, runs, state
from ..core.errors import ErrorKind, TpuctlError
from ..core.lease import Lease
from ..core.models import ClusterState, Phase
from ..core.store import BlobStore
from ..providers.base import Provider, Reporter, WatcherHost
from . import armed, budgetstop, recovering, replacing, up as up_flow
from .status import stopped_by_host


DOWN = "`tpuctl down`"   # why `down` ended a watch (armed.py), as `status` and a watcher report it


def poll_seconds() -> float:
    return knobs.number("TPUCTL_WATCH_POLL", 30)


def backoff_seconds(tries: int) -> float:
    """While every zone is out of capacity: 30 s, 60 s, ... up to 10 minutes (TPUCTL_RECOVER_BACKOFF scales it)."""
    base = knobs.number("TPUCTL_RECOVER_BACKOFF", 30)
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
        self.resuming: list[dict[str, Any]] = []   # recoveries whose runs have not yet said where they resumed
        self.doing = "watching"   # what `status` shows of this watcher (the lease's `doing`)
        self.gave_up = ""         # why a sick host's replacement was given up (replacing.py): the watch is over

    # -- the loop --------------------------------------------------------------------------------------
    def run(self) -> str:
        """Watch until the watch ends; returns why it ended."""
        try:
            while True:
                try:
                    why = self.look()
                except TpuctlError as e:   # a store or API hiccup: the next preemption must still be seen
                    self.r.warn(f"watch: {e.message}; looking again")
                    why = None
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
        if recovering.in_flight(doc, self.lease.id):
            return None   # another watcher is inside a re-create (the lease may have been damaged): not twice
        if pending:   # a watcher died while re-creating: finish its recovery (`up` adopts what it began)
            self.recover(str(pending.get("lost", "")), pending)
            return None
        self._say_resumptions()
        lost = self.p.compute_lost(self.st) if self.st.phase is Phase.READY else "a re-create was interrupted"
        sick = None if lost else self._sick()
        lost = lost or (sick[0] if sick else None)
        if not lost:
            self._tell_if_held()
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
        if sick:
            self._replace(lost, sick[1], sick[2])
        self.recover(lost)
        return self.gave_up or None

    def _sick(self) -> tuple[str, list[str], float] | None:
        """A host its agent marked sick (host/failures.py: it failed to get its TPU twice) is replaced by the lost
        host's path: its compute deleted here, then re-created as any lost compute is (`recover`); the run resumes
        on the new host. A TPU slice goes whole: a host event on one VM of a slice interrupts all of it
        (cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu). (why, the sick records), or
        None when no host is sick; and when the first was marked."""
        if self.p.watcher_host is None:
            # compute no watcher VM can watch from outside is this machine (or a service's): not replaced, `status`
            # says the host is sick
            return None
        found = [(k, runs.read_object(self.store, k)) for k, _ in self.store.list(layout.SICK_PREFIX)]
        if not found:
            return None
        said = "; ".join(f"{d.get('host') or k}: {d.get('why', '')}" for k, d in found)
        marked = min((float(d.get("time") or time.time()) for _, d in found), default=time.time())
        return f"{replacing.SICK} ({said})", [k for k, _ in found], marked

    def _replace(self, why: str, records: list[str], marked: float) -> None:
        """The sick host's compute deleted, so that `recover` re-creates it; its records go once it is. A delete
        refused past the replacement's bound (replacing.py) ends the runs and the watch."""
        self.r.warn(f"cluster {self.st.name}: {why}; deleting its compute to re-create it")
        try:
            self.p.delete_compute(self.st, self.r)
        except TpuctlError as e:
            if not replacing.overdue(marked):
                raise
            self.gave_up = replacing.give_up(self.store, self.st.name, why, e.message)
            raise TpuctlError(ErrorKind.INTERRUPTED, self.gave_up) from e
        for k in records:
            self.store.delete(k)

    def _hold(self) -> bool:
        """Hold the lease (renewing it), or stand by while another watcher does."""
        if self.holding and self.lease.renew(looked=time.time(), doing=self.doing):
            return True
        if self.holding:
            self.r.info("handed the lease over (a command asked for it, or it lapsed): standing by")
        self.holding = self.lease.acquire()
        if self.holding:
            self.r.info(f"watching cluster {self.st.name}: holding its lease")
            self.lease.renew(looked=time.time(), doing=self.doing)
        else:
            rec = self.lease.holder()
            self.r.info(f"standing by: the watcher on {rec.get('where') if rec else '?'} holds the lease")
        return self.holding

    def _tell_if_held(self) -> None:
        """Compute that is neither up, coming up, nor lost (a stopped TPU, one in a state Google does not explain)
        is not re-created, and waiting will not bring it back: said in the watcher's log when it changes, and in
        what `status` shows of the watcher (the lease's `doing`), while the watch goes on."""
        alive, what = self.p.host_state(self.st)
        doing = "watching" if alive else f"watching; needs you: {what}"
        if doing != self.doing:
            self.doing = doing
            self.lease.renew(looked=time.time(), doing=doing)   # first: once said, `status` shows it too
            if not alive:
                self.r.warn(f"cluster {self.st.name}: {what}; not lost, so not re-created: watching on")

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
        """Re-create the compute; `pending`: the recovery a dead watcher began (recorded before it re-created). The
        mark (recovering.py) says, lease or no lease, that this watcher is inside it, and counts it once."""
        at_risk = armed.runs_at_risk(self.store)   # first: the re-create's new attempts must not be counted in it
        if pending:
            mark = recovering.Mark.adopt(self.store, self.lease.id, pending)
            if mark:
                self.r.warn(f"cluster {self.st.name}: finishing the re-create another watcher began ({lost})")
        else:
            self.r.warn(f"cluster {self.st.name}: {lost}; re-creating it")
            self.st.compute_ended(time.time())   # lost compute bills no more: the next period begins when it is back
            state.save(self.st)
            mark = recovering.Mark.begin(self.store, self.lease.id, lost, self.st.zone, self.st.to_json())
        if mark is None:
            return   # another watcher began or took it first
        start, zone_before = float(mark.rec["detected_at"]), str(mark.rec.get("zone_before", ""))
        beats = [float(b.get("time", 0)) for b in runs.heartbeats(self.store) if b.get("worker") == 0]
        if not pending:
            notify.emit(self.store, "cluster.preempted", f"cluster.preempted-{start}", self.st.name, lost=lost,
                        zone=zone_before)
        tries = self._recreate(lost, mark)
        if tries is None or not mark.finish(self.st.to_json()):
            return
        back = time.time()
        rec = {"lost": lost, "detected_at": start, "last_heartbeat": max(beats, default=0.0), "back_at": back,
               "gone_seconds": round(back - (max(beats, default=0.0) or start), 1), "zone_before": zone_before,
               "zone": self.st.zone, "where": self.p.location(self.st), "runs": at_risk, "tries": tries,
               "watcher": self.where}
        n = armed.record_recovery(self.store, rec)
        notify.emit(self.store, "cluster.recovered", f"cluster.recovered-{start}", self.st.name, recovery=n,
                    took_s=round(back - start, 1), gone_s=rec["gone_seconds"], zone=self.st.zone)
        self.r.info(f"recovery {n}: cluster {self.st.name}: {armed.recovery_line(rec)}"
                    + (f"; its agent runs {', '.join(at_risk)} again (a job that checkpoints resumes from its last "
                       "checkpoint: the step is said here once it has started)" if at_risk else ""))
        if at_risk:
            self.resuming.append({**rec, "n": n})

    def _say_resumptions(self) -> None:
        """Once a run a recovery interrupted has started training again: from which step (armed.resumption)."""
        for rec in list(self.resuming):
            said = armed.resumption(self.store, rec)
            if said:
                self.r.info(f"recovery {rec['n']}: {said}")
                self.resuming.remove(rec)

    def _recreate(self, lost: str, mark: recovering.Mark) -> int | None:
        """`up` until it succeeds (backoff between tries); how many tries it took, or None when the watch ended
        meanwhile: checked before each create, and after one, which `down` wants undone."""
        def wanted() -> None:
            if not armed.live(armed.read(self.store)):
                raise TpuctlError(ErrorKind.INTERRUPTED, "the watch was ended (`tpuctl down`, or a limit)")
        tries = 0
        with self.lease.keep(also=mark.renew):
            self.lease.renew(doing=f"re-creating ({lost})")
            while True:
                tries += 1
                try:
                    wanted()
                    self.st = up_flow.up(self.st.spec, self.p, self.r, regrant=False, before_create=wanted)
                except TpuctlError as e:
                    if not armed.live(armed.read(self.store)):
                        mark.drop()
                        return None
                    if replacing.is_replacement(lost) and replacing.overdue(float(mark.rec["detected_at"])):
                        self.gave_up = replacing.give_up(self.store, self.st.name, lost, e.message)
                        self.r.warn(f"cluster {self.st.name}: {self.gave_up}")
                        mark.drop()
                        return None
                    wait = backoff_seconds(tries - 1)
                    self.r.warn(f"re-create failed: {e.message}; trying again in {wait:.0f}s")
                    self.sleep(wait)
                    continue
                doc = armed.read(self.store)
                if armed.live(doc):
                    return tries
                try:
                    if doc and doc.get("teardown"):   # `down` came while the create ran: what it made goes too
                        self.r.warn(f"cluster {self.st.name}: `tpuctl down` ended the watch during the re-create; "
                                    "deleting what it made")
                        self.p.delete_compute(self.st, self.r)
                finally:
                    mark.drop()
                return None


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
        wait = knobs.number("TPUCTL_LEASE_WAIT", 1800)
        if self.command == "down":
            # the record a watcher reads before each create, written before the lease is asked for: a watcher stops
            # at once, whatever state the lease is in (a damaged one would be taken at once, mid-re-create)
            armed.end(self.store, DOWN, teardown=True)
        self.lease = lease_of(self.store, f"`tpuctl {self.command}` on {socket.gethostname()} (pid {os.getpid()})")
        self.lease.take(wait, self.waiting)
        self.keeper = self.lease.keep().__enter__()
        if self.command == "down":
            recovering.wait_settled(self.store, wait, self.waiting)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.lease is not None:
            self.keeper.__exit__()
            self.lease.release()


def start_watcher_vm(st: ClusterState, provider: Provider, host: WatcherHost, reporter: Reporter) -> str:
    """`up --recover --watcher vm`: the VM in the zone the host picks for the cluster's, and the wait
    (TPUCTL_WATCHER_WAIT seconds, 600: it boots and installs the watcher first) until its watcher holds the lease.
    Returns where it runs."""
    store = provider.store(st)
    zone, vm = host.zone(st.spec, st.zone), host.name(st.spec)
    armed.update(store, lambda d: {**d, "watcher": armed.ON_VM, "watcher_zone": zone} if d else None)
    host.ensure(st, zone, reporter)
    lease = lease_of(store, "")
    deadline = time.monotonic() + knobs.number("TPUCTL_WATCHER_WAIT", 600)
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
