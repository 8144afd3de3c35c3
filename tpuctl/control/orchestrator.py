"""Provider-agnostic flows: up, status, ls, down. No google or rich imports, and no branch on a provider or an
architecture: a Provider (providers/base.py) owns its topology, a Reporter does the showing.

`up` saves the cluster's state before each resource is created, so an interrupted `up` is finished by another
`up` (resources are adopted by name and label) or undone by `down`. A failed `up` removes what it created.

Boot order: a host runs its start-up script while it is being created, before the API reports it ready
(GCP_FACTS §6), and reads the store at once. So before each placement is tried, its region's store exists, the
workload's identities hold their grants on it, and the cluster record and agent package are in it; when the
placements span regions and a store this run made is in a region it moves away from, that store is removed first.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable

from ..core import layout, runs, state
from ..core.background import Background
from ..core.lifecycle import show_duration
from ..core.store import BlobStore
from ..core.errors import ErrorKind, Scope, TpuctlError
from ..core.models import ClusterSpec, ClusterState, Grant, HostFacts, Phase
from ..providers.base import BucketGrants, Created, Placement, Provider, Reporter, progress_of


class _Up:
    """One `up`: the state it saves as it goes, and the undo list of what this run created."""

    def __init__(self, provider: Provider, reporter: Reporter, st: ClusterState) -> None:
        self.p, self.r, self.st = provider, reporter, st
        self.lock = threading.Lock()
        self.undo: list[Created] = []
        self.store_region: str | None = None
        self.accounts: Background[list[str]] | None = None
        if provider.grants is not None:
            grants = provider.grants
            self.accounts = Background(lambda: grants.workload_accounts(st.spec))   # a lookup: start it early

    def save(self) -> None:
        with self.lock:
            state.save(self.st)

    # -- what the host reads at boot: store, grants, record -----------------------------------------------
    def prepare(self, region: str) -> None:
        if self.store_region != region:
            self._move_store(region)
        self.p.write_cluster_record(self.st, confirmed=False)

    def _move_store(self, region: str) -> None:
        spec, noun = self.st.spec, self.p.store_noun
        made_here = [c for c in self.undo if c.kind == noun]
        if made_here:
            # This run made the store in a region the compute did not land in; the store's name is global, so it
            # is removed (its grants go with it) before it is made in the next region.
            made_here[0].undo()
            with self.lock:
                self.undo = [c for c in self.undo if c.kind not in (noun, "grants")]
                self.st.grants = []
            self.save()
        if self.p.ensure_store(spec, region, progress_of(self.r, noun, spec.store)):
            self.undo.append(Created(noun, spec.store, lambda: self.p.delete_store(self.st, lambda s: None)))
        self.store_region = region
        if self.p.grants is not None and self.accounts is not None:
            self.grant(self.p.grants, self.accounts.result())

    def grant(self, grants: BucketGrants, accounts: list[str]) -> None:
        if not accounts:
            return

        def intend(about_to_add: list[Grant]) -> None:
            # Recorded and saved before the IAM write: `down` and this run's undo revoke it whether or not the
            # write's answer ever arrives; a re-run finds it applied (or applies it) and records nothing twice.
            with self.lock:
                new = [g for g in about_to_add if g not in self.st.grants]
                self.st.grants = self.st.grants + new
            self.save()
            if new:
                self.undo.append(Created("grants", ", ".join(accounts), lambda: grants.revoke(self.st.spec, new)))
        if grants.grant(self.st.spec, accounts, intend):
            for a in accounts:
                self.r.resource("grant", a, "granted")

    # -- placement with failover ---------------------------------------------------------------------------
    def _one(self, placement: Placement) -> None:
        runtime = self.p.choose_runtime(self.st.spec, placement)
        with self.lock:
            self.st.zone, self.st.runtime = placement.zone, runtime
        self.save()   # before creating: an interrupted `up` knows where to adopt or delete
        self.prepare(placement.region)
        compute = self.p.ensure_compute(self.st, self.r)
        self.undo.extend(compute.created)
        with self.lock:
            self.st.host = compute.facts
            if compute.created or not self.st.compute_since:
                self.st.compute_started(time.time())   # a new period of compute (and of cost)
        self.save()

    def place(self, placements: list[Placement]) -> None:
        """Try each placement in order. A ZONE-scoped failure moves to the next; a REGION-scoped one also skips
        the rest of that region; anything else stops."""
        skip_regions: set[str] = set()
        last: TpuctlError | None = None
        for i, pl in enumerate(placements):
            if pl.region in skip_regions:
                continue
            try:
                return self._one(pl)
            except TpuctlError as e:
                if e.scope is Scope.GLOBAL:
                    raise
                last = e
                if e.scope is Scope.REGION:
                    skip_regions.add(pl.region)
                rest = [p for p in placements[i + 1:] if p.region not in skip_regions]
                self.r.warn(f"{pl.zone}: {e.message}" + (f"; trying {rest[0].zone}" if rest else ""))
        assert last is not None, "place() needs at least one placement"
        tried = ", ".join(p.zone for p in placements)
        raise TpuctlError(last.kind, f"could not place {self.st.spec.tpu_type} in any zone tried ({tried}): "
                          f"{last.message}", last.hint or "add more --zone values or try later")

    def rollback(self) -> list[str]:
        failed = []
        for c in reversed(self.undo):
            try:
                c.undo()
            except Exception as e:  # noqa: BLE001 - keep undoing the rest; report what is left
                failed.append(f"{c.kind} {c.name}: {e}")
        self.undo = []
        return failed


def _ordered(placements: list[Placement], prior_zone: str) -> list[Placement]:
    """A previous `up` got as far as prior_zone: adopt what it made there rather than create elsewhere."""
    return sorted(placements, key=lambda p: p.zone != prior_zone) if prior_zone else placements


def check_compatible(spec: ClusterSpec, st: ClusterState) -> None:
    """An existing cluster keeps what it IS (ClusterSpec.IDENTITY): `up` refuses to change it."""
    for field in ClusterSpec.IDENTITY:
        have, want = getattr(st.spec, field), getattr(spec, field)
        if have and want and have != want:
            raise TpuctlError(ErrorKind.INPUT, f"cluster {spec.name} already exists with {field} "
                              f"{getattr(have, 'value', have)}, not {getattr(want, 'value', want)}",
                              f"use another -c NAME, or `tpuctl down -c {spec.name}` first")


def up(spec: ClusterSpec, provider: Provider, reporter: Reporter) -> ClusterState:
    prior = state.load(spec.name)
    if prior:
        check_compatible(spec, prior)
        if prior.phase is Phase.READY:
            reporter.info(f"cluster {spec.name} exists; checking its resources")
    for warning in provider.preflight(spec):
        reporter.warn(warning)
    st = prior or ClusterState(spec=spec, created_at=time.time())
    st.spec = spec
    was_down = st.phase is Phase.DOWN
    if was_down:
        st.phase = Phase.CREATING   # from here on `down` must look for compute again
    run = _Up(provider, reporter, st)
    run.save()
    placements = _ordered(provider.placements(spec), st.zone)
    grants = provider.grants
    try:
        run.place(placements)
        if grants:
            run.grant(grants, grants.host_accounts(st))
        provider.write_cluster_record(st, confirmed=True)   # again: with what creation taught (the node's address)
        st.phase = Phase.READY
        run.save()
        return st
    except KeyboardInterrupt:
        raise TpuctlError(ErrorKind.INTERRUPTED, f"up interrupted; cluster {spec.name} may be half made",
                          f"run the same `tpuctl up` again to finish it, or `tpuctl down -c {spec.name}` to remove it")
    except TpuctlError as e:
        if run.undo:
            reporter.warn(f"up failed: {e.message}; removing what this run created")
        left = run.rollback()
        if left:
            reporter.warn("could not remove: " + "; ".join(left) + f" (run `tpuctl down -c {spec.name}`)")
        elif not prior:
            state.remove(spec.name)
        elif was_down:
            st.phase = Phase.DOWN   # nothing of this run is left: the cluster is as down as it was
            run.save()
        raise


def arm(st: ClusterState, provider: Provider, progress: Callable[[str], None]) -> str:
    """After `up` with autostop or a deadline, or before `submit --down`: wait for the host's word that it can end
    the compute itself (TPUCTL_TEARDOWN_WAIT seconds, default 900: a TPU VM boots and installs the agent first).
    Returns who enforces it; raises PERMISSION (the grant that would mend it) or TIMEOUT, never calling a
    setting armed that nothing would enforce."""
    deadline = time.monotonic() + float(os.environ.get("TPUCTL_TEARDOWN_WAIT", "900"))
    poll = min(float(os.environ.get("TPUCTL_POLL_INTERVAL", "2")), 2.0)
    shown = False
    while True:
        said = provider.enforcement(st)
        if said.able:
            return said.text
        if said.able is False:
            raise TpuctlError(ErrorKind.PERMISSION, f"the host cannot end the compute itself: {said.text}; the "
                              "compute is up and billing, with nothing enforcing autostop, deadline or --down",
                              said.hint)
        if time.monotonic() >= deadline:
            raise TpuctlError(ErrorKind.TIMEOUT, f"{said.text}: autostop, deadline and --down are NOT armed",
                              f"look at the host: tpuctl status -c {st.name}; run `tpuctl up -c {st.name}` again "
                              "to wait for it, or `tpuctl down` when done")
        if not shown:
            progress("waiting for the host to confirm it may delete its own compute")
            shown = True
        time.sleep(poll)


def load(name: str) -> ClusterState:
    st = state.load(name)
    if st is None:
        raise TpuctlError(ErrorKind.NOT_FOUND, f"no cluster named {name!r}",
                          "`tpuctl ls` lists clusters; `tpuctl up -c NAME ...` makes one")
    return st


def status(st: ClusterState, provider: Provider) -> dict[str, object]:
    """The cluster as recorded plus the provider's live view; keys in display order. `problem` and `fix` say what
    is wrong with a cluster that should be running (a dead agent, a preempted TPU) and the command that mends it."""
    price = provider.price(st.spec)
    info: dict[str, object] = {"cluster": st.name, "provider": st.spec.provider.value, "phase": st.phase.value,
                               **provider.summary(st), "store": st.spec.store,
                               "price": "nothing billed" if st.phase is Phase.DOWN else price.text,
                               "grants": [f"{g.role} -> {g.member}" for g in st.grants]}
    record = _stopped_record(st, provider) if st.phase is Phase.READY else {}   # read once: stop and failure
    stopped = _stop_in(st, record)
    info.update(_cost(st, price.hourly))
    armed = _armed(st, provider, record) if (st.spec.autostop or st.deadline) and st.phase is Phase.READY and not stopped \
        else ""
    if st.spec.autostop:
        fires = _autostop_at(provider.store(st)) if st.phase is Phase.READY and not stopped and not armed else 0.0
        info["autostop"] = (f"after {show_duration(st.spec.autostop)} with no run"
                            + (f" (next: {_when(fires)} if still idle)" if fires else "") + armed)
    if st.deadline and st.phase is Phase.READY and not stopped:
        info["deadline"] = _when(st.deadline) + armed
    if st.phase is Phase.DOWN:
        info["resources"] = {}
        info["problem"] = ""
        info["fix"] = f"tpuctl up -c {st.name} brings it back; logs, jobs and download work while it is down"
        return info
    if stopped:
        info["phase"] = "stopped"
        info["stopped"] = f"{stopped[0]} at {_when(stopped[1])}"
        info["resources"] = {}
        info["problem"] = ""
        info["fix"] = f"tpuctl up -c {st.name} brings it back"
        return info
    info["resources"] = provider.describe(st)
    found = provider.problem(st) if st.phase is Phase.READY else None
    info["problem"], info["fix"] = found if found else ("", "")
    return info


def _armed(st: ClusterState, provider: Provider, record: dict[str, object]) -> str:
    """"" when the host said it can end the compute itself and has not failed to (`record`, its stop record);
    else why it is NOT enforced."""
    said = provider.enforcement(st)
    failed = record.get("failed")
    why = ([] if said.able else [said.text]) + ([f"the host's attempt to end it failed: {failed}"] if failed else [])
    return f" - NOT ENFORCED: {'; '.join(why)}" if why else ""


def _cost(st: ClusterState, hourly: float | None) -> dict[str, object]:
    """Compute time summed over every period the cluster's compute existed (recreations included) at the
    catalog price of its type; region differences are ignored."""
    seconds = st.compute_seconds(time.time())
    h, m = divmod(int(seconds) // 60, 60)
    return {"uptime": f"{h}h{m:02d}m", "cost_so_far_usd": None if hourly is None else round(seconds / 3600 * hourly, 2)}


def _autostop_at(store: BlobStore) -> float:
    """When worker 0's agent will end the compute if no run starts (its last heartbeat says), or 0."""
    return max([float(b.get("autostop_at") or 0.0) for b in runs.heartbeats(store) if b.get("worker") == 0],
               default=0.0)


def _when(t: float) -> str:
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


def _stop_in(st: ClusterState, rec: dict[str, object]) -> tuple[str, float] | None:
    """(why, when) of a stop record; the period of compute (and cost) it ended is closed in the state. A record of
    a deletion Google refused is not a stop (status shows it as a failure)."""
    if not rec or rec.get("failed"):
        return None
    if st.compute_since:
        st.compute_ended(float(str(rec["time"])))
        state.save(st)
    return str(rec.get("reason", "")), float(str(rec["time"]))


def stopped_by_host(st: ClusterState, provider: Provider) -> tuple[str, float] | None:
    """(why, when) the host ended the compute `up` made last, if it did."""
    return _stop_in(st, _stopped_record(st, provider))


def store_bytes(st: ClusterState, provider: Provider) -> int | None:
    """What a kept store holds, in bytes (None when it cannot be listed)."""
    try:
        return sum(size for _, size in provider.store(st).list(""))
    except Exception:  # noqa: BLE001 - a size is a nicety in `ls`: a store that cannot be listed shows none
        return None


def ls(providers: list[Provider], extra_project: str, warn: Callable[[str], None]) -> list[dict[str, object]]:
    """Clusters in local state, plus every tpuctl-labelled resource each provider's inventory knows of, in each
    project a cluster uses (and extra_project); those without state are orphans."""
    rows: list[dict[str, object]] = []
    local = state.all_clusters(lambda e: warn(f"{e.message}; {e.hint}"))
    known = {(s.name, name, s.zone) for s in local for name in (s.spec.tpu_name, s.spec.vm_name, s.spec.qr_name)}
    known_stores = {s.spec.store for s in local}
    by_name = {p.name: p for p in providers}
    for s in local:
        prov = by_name[s.spec.provider]
        kept = store_bytes(s, prov) if s.phase is Phase.DOWN else None
        stopped = stopped_by_host(s, prov) if s.phase is Phase.READY else None
        phase = f"stopped {_when(stopped[1])}" if stopped else s.phase.value
        overdue = bool(s.deadline) and time.time() > s.deadline and s.phase is Phase.READY and not stopped
        rows.append({"cluster": s.name, "provider": s.spec.provider.value, "type": s.spec.tpu_type, "zone": s.zone,
                     "phase": phase, "store": s.spec.store, "store_bytes": kept, "orphan": False, "kind": "cluster",
                     "name": s.name, "remove": f"tpuctl down -c {s.name}",
                     "past_deadline": _when(s.deadline) if overdue else ""})
    for p in providers:
        if p.inventory is None:
            continue
        for project in sorted(({s.spec.project for s in local if s.spec.provider is p.name} | {extra_project}) - {""}):
            try:
                found = p.inventory.list_labelled(project)
            except TpuctlError as e:   # local clusters still list; say what could not be seen
                warn(f"could not list {p.name.value} resources in project {project}: {e.message} ({e.hint})")
                continue
            for n in found:
                store = f"gs://{n['name']}" if n["kind"] == "bucket" else ""
                if store in known_stores or (not store and (n["cluster"], n["name"], n["zone"]) in known):
                    continue
                rows.append({"cluster": n["cluster"], "provider": p.name.value, "type": n["type"] or n["kind"],
                             "zone": n["zone"], "phase": n["state"], "store": store, "store_bytes": None,
                             "orphan": True, "kind": n["kind"], "name": n["name"],
                             "remove": f"tpuctl down -c {n['cluster']} --project {project}"
                                       + (" --delete-bucket" if store else "")})
    return rows


def from_labels(name: str, project: str, provider: Provider) -> ClusterState | None:
    """A cluster with no local state, rebuilt from what carries its label in the project (so `down` works from
    another machine, or after the state file was lost); None when nothing does. Its grants are not known: they
    live on its bucket and go with it (`--delete-bucket`)."""
    if provider.inventory is None or not project:
        return None
    found = [n for n in provider.inventory.list_labelled(project) if n["cluster"] == name]
    return provider.inventory.state_from(name, project, found) if found else None


def down(st: ClusterState, provider: Provider, reporter: Reporter, delete_store: bool) -> None:
    errors = []
    try:
        provider.delete_compute(st, reporter)
        st.compute_ended(time.time())
    except TpuctlError as e:
        errors.append(e)
    if st.grants and provider.grants is not None:
        try:
            provider.grants.revoke(st.spec, st.grants)
            for m in sorted({g.member for g in st.grants}):
                reporter.resource("grant", m, "revoked")
            st.grants = []
            state.save(st)
        except TpuctlError as e:
            errors.append(e)
    if delete_store:
        try:
            provider.delete_store(st, progress_of(reporter, provider.store_noun, st.spec.store))
            reporter.resource(provider.store_noun, st.spec.store, "deleted")
        except TpuctlError as e:
            errors.append(e)
    else:
        reporter.info(f"kept {provider.store_noun} {st.spec.store}: `tpuctl logs/jobs/download -c {st.name}` still "
                      f"read it; `tpuctl down -c {st.name} --delete-bucket` removes it and its contents")
    if errors:
        state.save(st)
        first = errors[0]
        raise TpuctlError(first.kind, f"down incomplete: {first.message}", first.hint or
                          f"run `tpuctl down -c {st.name}` again")
    if delete_store:
        state.remove(st.name)
        return
    # Remembered as down with its store kept, so the runs' logs and outputs stay reachable by the cluster's name.
    st.phase, st.host = Phase.DOWN, HostFacts()
    state.save(st)

