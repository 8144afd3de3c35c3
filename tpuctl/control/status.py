"""`status`: a cluster as recorded plus the provider's live view, what it has cost, whether autostop and the
deadline are enforced, and whether its host ended the compute itself. Also what `ls` shows of each cluster."""
from __future__ import annotations

import time

from ..core import budget, layout, runindex, runs, state
from ..core.errors import ErrorKind, TpuctlError
from ..core.lifecycle import show_duration
from ..core.sizes import human_bytes
from ..core.models import ClusterState, Phase
from ..core.store import BlobStore, LocalStore, floor_bytes, make_room
from ..providers.base import Provider


def load(name: str) -> ClusterState:
    st = state.load(name)
    if st is None:
        names, live = state.cluster_names(), state.live_cluster_names()
        shown = [n if n in live else f"{n} (down)" for n in names]
        raise TpuctlError(ErrorKind.NOT_FOUND, f"no cluster named {name!r} " + (
            f"(clusters here: {', '.join(shown)})" if names else "(none made yet on this machine)"),
            (f"-c {live[0]} to use it; " if len(live) == 1 else "") + state.how_to_make(name))
    return st


def status(st: ClusterState, provider: Provider, repair: bool = True) -> dict[str, object]:
    """The cluster as recorded plus the provider's live view; keys in display order. `problem` and `fix` say what
    is wrong with a cluster that should be running (a dead agent, a preempted TPU) and the command that mends it.
    `repair=False` (`tpuctl ui`, which only reads): what a watcher or the host recorded is shown, not saved into
    the local state."""
    watch = _watch(st, provider, repair)   # first: a watcher may have moved the compute, and `status` shows where it is
    price = provider.price(st.spec)
    info: dict[str, object] = {"cluster": st.name, "provider": st.spec.provider.value, "phase": st.phase.value,
                               **provider.summary(st), "store": st.spec.store,
                               "price": "nothing billed" if st.phase is Phase.DOWN else price.text,
                               "grants": [f"{g.role} -> {g.member}" for g in st.grants]}
    record = _stopped_record(st, provider) if st.phase is Phase.READY else {}   # read once: stop and failure
    stopped = _stop_in(st, record, repair)
    hourly, spend = costing(st, provider)
    if hourly is not None and hourly != price.hourly and st.phase is not Phase.DOWN:
        info["price"] = f"${hourly:.2f}/hour (as its budget and costs count it)"   # not the catalog's "free"
    info.update(_cost(st, hourly))
    info.update(spend)
    info.update(watch)
    info["orphan_data"] = orphan_data(st, provider, repair)
    info["notifications"] = undelivered(st, provider)
    info.update(doctor(st, provider) if st.phase is Phase.READY else {})
    armed = _armed(st, provider, record) if (st.spec.autostop or st.deadline) and st.phase is Phase.READY and not stopped \
        else ""
    if st.spec.autostop:
        fires = _autostop_at(provider.store(st)) if st.phase is Phase.READY and not stopped and not armed else 0.0
        info["autostop"] = (f"after {show_duration(st.spec.autostop)} with no run"
                            + (f" (next: {when(fires)} if still idle)" if fires else "") + armed)
    if st.deadline and st.phase is Phase.READY and not stopped:
        info["deadline"] = when(st.deadline) + armed
    if st.phase is Phase.DOWN:
        info["resources"] = {}
        info["problem"] = ""
        info["fix"] = f"tpuctl up -c {st.name} brings it back; logs, jobs and download work while it is down"
        return info
    if stopped:
        info["phase"] = "stopped"
        info["stopped"] = f"{stopped[0]} at {when(stopped[1])}"
        info["resources"] = {}
        info["problem"] = ""
        info["fix"] = f"tpuctl up -c {st.name} brings it back"
        if stopped[0].startswith(budget.REASON) and spend:
            # `up` alone is refused while the cap is spent: name the command that raises it
            used, cap = float(str(spend["spent_usd"])), float(str(spend["budget_usd"]))
            info["problem"] = f"its budget is spent: {budget.dollars(used)} of {budget.dollars(cap)}"
            info["fix"] = f"{budget.raise_command(st.name, used)} raises the cap and brings it back"
        return info
    info["resources"] = provider.describe(st)
    found = provider.problem(st) if st.phase is Phase.READY else None
    found = found or (_store_full(st, provider) if st.phase is Phase.READY else None)
    if found and provider.compute_lost(st) and watch.get("watcher") and "NONE" not in str(watch["watcher"]):
        found = (found[0], f"nothing: the watcher on {str(watch['watcher']).split(',')[0]} re-creates it")
    info["problem"], info["fix"] = found if found else ("", "")
    return info


def _watch(st: ClusterState, provider: Provider, repair: bool = True) -> dict[str, object]:
    """Recovery: whether the cluster is armed, which watcher holds the lease and when it last looked, and each
    recovery so far. Nothing for a cluster never armed."""
    from . import armed
    from ..core.lease import Lease
    try:
        store = provider.store(st)
        doc = armed.read(store)
        if not doc:
            return {}
        armed.sync(st, store, save=repair)
        holder = Lease(store, layout.WATCH_LEASE, "").holder()
        done = armed.recoveries(store)
    except TpuctlError:
        return {}
    used = f"{doc.get('recoveries', 0)} of {doc.get('max_recoveries')} recoveries used"
    if not armed.live(doc):
        out: dict[str, object] = {"recovery": f"ended {when(float(doc.get('ended_at', 0)))}: {doc.get('ended')} "
                                              f"({used})"}
    else:
        out = {"recovery": f"armed ({used}" + (f", until {when(float(doc['until']))}" if doc.get("until") else "")
                           + (f", for run {doc['run']})" if doc.get("run") else ", for the next run submitted)")}
        out["watcher"] = (f"{holder.get('where')}, {holder.get('doing', 'watching')}, last looked "
                          f"{time.time() - float(holder.get('looked') or holder.get('renewed', 0)):.0f}s ago"
                          if holder else f"NONE holds the lease: start one with `tpuctl watch -c {st.name} --detach`")
    host = provider.watcher_host
    if doc.get("watcher") == armed.ON_VM and doc.get("watcher_zone") and host is not None:
        zone = str(doc["watcher_zone"])
        out["watcher_vm"] = f"{host.name(st.spec)} in {zone}: {host.state(st, zone)}"
    out["recoveries"] = [f"{when(float(r.get('detected_at', 0)))}: {armed.recovery_line(r)}"
                         + (f"; {said}" if (said := armed.resumption(store, r)) else "") for r in done]
    return out


def orphan_data(st: ClusterState, provider: Provider, repair: bool = True) -> str:
    """What the store holds of runs never submitted (core/orphans.py), in words with the command that removes it;
    "" when nothing (or when the store cannot be read: `status` says so elsewhere)."""
    from ..core import orphans
    try:
        found = orphans.find(provider.store(st), repair)
    except Exception:  # noqa: BLE001 - a nicety in status and ls: a store that cannot be read shows none
        return ""
    if not found:
        return ""
    size = sum(o.bytes for o in found)
    return (f"{human_bytes(size)} of data ({sum(o.files for o in found)} files) of {len(found)} run"
            f"{'s' * (len(found) > 1)} never submitted ({', '.join(o.run_id for o in found[:3])}"
            f"{', ...' if len(found) > 3 else ''}: {found[0].left_by}); `tpuctl down -c {st.name}` removes it")


def _store_full(st: ClusterState, provider: Provider) -> tuple[str, str] | None:
    """An agent that says its store is full (host/storeguard.py, in its heartbeat): runs end, their output is
    held in memory (up to TPUCTL_LOG_HOLD_BYTES) and lost past TPUCTL_LOG_HOLD_WAIT."""
    try:
        store = provider.store(st)
        free = store.free_bytes()
        beats = runs.heartbeats(store)
    except Exception:  # noqa: BLE001 - a store that cannot be read: status says so elsewhere
        return None
    fix = make_room(st.spec.store).replace("; then run the command again", "; held output ships by itself once "
                                                                          "there is room")
    for b in beats:
        held = int(b.get("held_bytes") or 0)
        if held or str(b.get("problem", "")).startswith("store full"):
            said = f"{held / 1e6:.1f} MB of ended runs' output waiting" if held else str(b["problem"])
            return (f"the store is full: {said} (the agent on {b.get('host')}); output is lost if no room comes",
                    fix)
    if free is not None and free < floor_bytes():
        # read here: at 0 bytes free the agent's own heartbeat, which says it, cannot be written (issue 52.7)
        return (f"the store is full: {free} bytes free at {st.spec.store} (runs cannot save checkpoints or logs; "
                "the next submit is refused)", fix)
    return None


def doctor(st: ClusterState, provider: Provider) -> dict[str, str]:
    """What the run doctor found (host/doctor.py, host/failures.py): the running runs that stalled, since when
    (`stalled`), and hosts marked sick (`sick`); nothing when all is well or the store cannot be read."""
    out: dict[str, str] = {}
    try:
        store = provider.store(st)
        stalled = [(r, s.stalled_since) for r in runindex.queued(store, ensured=True)
                   if (s := runs.status(store, r)).stalled_since and not s.state.final]
        sick = [runs.read_object(store, k) for k, _ in store.list(layout.SICK_PREFIX)]
    except Exception:  # noqa: BLE001 - a nicety in status: a store that cannot be read shows none
        return out
    if stalled:
        out["stalled"] = "; ".join(f"run {r} since {when(float(t or 0))}" for r, t in stalled)
    if sick:
        out["sick"] = "; ".join(f"{d.get('host')} ({d.get('why')})" for d in sick)
    return out


def undelivered(st: ClusterState, provider: Provider) -> str:
    """The notifications the cluster's senders gave up on (core/notify.py records each), in words; "" for none."""
    from ..core import notify
    try:
        left = notify.undelivered(provider.store(st))
    except Exception:  # noqa: BLE001 - a nicety in status: a store that cannot be read shows none
        return ""
    if not left:
        return ""
    last = left[-1]
    return (f"{len(left)} notification{'s' * (len(left) > 1)} not delivered (latest: {last.get('event')} to "
            f"{last.get('to')}: {last.get('error')}); check the receiver: tpuctl notify test -c {st.name}")


def _armed(st: ClusterState, provider: Provider, record: dict[str, object]) -> str:
    """"" when the host said it can end the compute itself and has not failed to (`record`, its stop record);
    else why it is NOT enforced."""
    said = provider.enforcement(st)
    failed = record.get("failed")
    why = ([] if said.able else [said.text]) + ([f"the host's attempt to end it failed: {failed}"] if failed else [])
    return f" - NOT ENFORCED: {'; '.join(why)}" if why else ""


def _cost(st: ClusterState, hourly: float | None) -> dict[str, object]:
    """Compute time summed over every period the cluster's compute existed (recreations included) at the
    catalog price of its type (or TPUCTL_PRICE_PER_HOUR: budget.hourly); region differences are ignored."""
    seconds = st.compute_seconds(time.time())
    h, m = divmod(int(seconds) // 60, 60)
    return {"uptime": f"{h}h{m:02d}m", "cost_so_far_usd": None if hourly is None else round(seconds / 3600 * hourly, 2)}


def costing(st: ClusterState, provider: Provider) -> tuple[float | None, dict[str, object]]:
    """(the $/hour the cluster's cost is counted at: budget.hourly, with the price saved with its budget; spent and
    left of that budget with a line at 80% and at 100%, {} without one). `status`, `ls` and `jobs` show them."""
    try:
        doc = budget.read(provider.store(st))
    except TpuctlError:
        doc = {}
    return budget.hourly(provider.price(st.spec).hourly, float(doc.get("hourly") or 0)), budget.shown(doc, st.periods)


def _autostop_at(store: BlobStore) -> float:
    """When worker 0's agent will end the compute if no run starts (its last heartbeat says), or 0."""
    return max([float(b.get("autostop_at") or 0.0) for b in runs.heartbeats(store) if b.get("worker") == 0],
               default=0.0)


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _stopped_record(st: ClusterState, provider: Provider) -> dict[str, object]:
    """The host's own record of ending the compute (lifecycle.py) when it is about the compute `up` made last."""
    if not st.periods:
        return {}
    try:
        rec = runs.read_object(provider.store(st), layout.STOPPED)
    except TpuctlError:
        return {}
    if float(str(rec.get("time", 0))) < st.periods[-1][0]:
        return {}   # about an earlier compute: `up` has made a new one since (or none at all)
    return rec


def _stop_in(st: ClusterState, rec: dict[str, object], save: bool = True) -> tuple[str, float] | None:
    """(why, when) of a stop record; the period of compute (and cost) it ended is closed in the state (saved unless
    `save` is False). A record of a deletion Google refused is not a stop (status shows it as a failure)."""
    if not rec or rec.get("failed"):
        return None
    if st.compute_since:
        st.compute_ended(float(str(rec["time"])))
        if save:
            state.save(st)
    return str(rec.get("reason", "")), float(str(rec["time"]))


def stopped_by_host(st: ClusterState, provider: Provider, save: bool = True) -> tuple[str, float] | None:
    """(why, when) the host ended the compute `up` made last, if it did (the state saved so unless `save` is
    False)."""
    return _stop_in(st, _stopped_record(st, provider), save)


def store_bytes(st: ClusterState, provider: Provider) -> int | None:
    """What a kept store holds, in bytes (None when it cannot be listed): on disk, a file linked into several runs
    once; in a bucket, every object (a server-side copy is an object of its own, billed as one)."""
    try:
        store = provider.store(st)
        if isinstance(store, LocalStore):
            return store.disk_bytes()
        return sum(size for _, size in store.list(""))
    except Exception:  # noqa: BLE001 - a size is a nicety in `ls`: a store that cannot be listed shows none
        return None
