"""`up`: plan, create across placements with failover, undo what this run made, save state; and `arm`, which
waits for the host's word that it can end its compute itself. Provider-agnostic: no google or rich imports, and
no branch on a provider or an architecture: a Provider (providers/base.py) owns its topology and where it may be
placed (for Google Cloud, the zones: providers/gcp/planning.py), a Reporter does the showing.

`up` saves the cluster's state before each resource is created, so an interrupted `up` is finished by another
`up` (resources are adopted by name and label) or undone by `down`. A failed `up` removes what it created.

Boot order: a host runs its start-up script while it is being created, before the API reports it ready
(GCP_FACTS §6), and reads the store at once. So before each placement is tried, its region's store exists, the
workload's identities hold their grants on it, and the cluster record and agent package are in it; when the
placements span regions and a store this run made is in a region it moves away from, that store is removed first.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from ..core import budget, knobs, runindex, state
from ..core.background import Background
from ..core.errors import ErrorKind, Scope, TpuctlError
from ..core.models import ClusterSpec, ClusterState, Grant, Phase
from ..providers.base import BucketGrants, Created, Placement, Provider, Reporter, progress_of
from .status import stopped_by_host, when


class _Up:
    """One `up`: the state it saves as it goes, and the undo list of what this run created."""

    def __init__(self, provider: Provider, reporter: Reporter, st: ClusterState, regrant: bool = True,
                 before_create: Callable[[], None] = lambda: None) -> None:
        self.p, self.r, self.st = provider, reporter, st
        self.regrant, self.before_create = regrant, before_create
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
        runindex.ensure(self.p.store(self.st))   # a new store is indexed from the start; an old one, once

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
        if self.p.grants is not None and self.accounts is not None and self.regrant:
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
        self.before_create()
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
            t0 = time.time()
            try:
                self._one(pl)
                return self.placed(pl.zone, "ok", t0)
            except TpuctlError as e:
                self.placed(pl.zone, e.kind.value, t0)
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

    def placed(self, zone: str, result: str, since: float) -> None:
        """Each placement tried, counted with its time in the state by zone and result (`ok` or the error's kind):
        /metrics' tpuctl_up_provisioning_seconds (ui/metrics.py). A few keys, whatever the number of `up`s."""
        with self.lock:
            tried = self.st.record.setdefault("up_placements", {})
            n, took = tried.get(f"{zone}|{result}", [0, 0.0])
            tried[f"{zone}|{result}"] = [int(n) + 1, round(float(took) + time.time() - since, 3)]
        self.save()

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


def up(spec: ClusterSpec, provider: Provider, reporter: Reporter, regrant: bool = True,
       before_create: Callable[[], None] = lambda: None) -> ClusterState:
    """`regrant` False: a recovery watcher re-creating the compute of a cluster `up` made, whose bucket grants are in
    place (and are not its to change: the watcher VM's identity may not read the bucket's IAM policy).
    `before_create` is called before each placement's compute is created, and may raise to stop (a watcher whose
    watch `down` ended)."""
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
    run = _Up(provider, reporter, st, regrant, before_create)
    run.save()
    placements = _ordered(provider.placements(spec), st.zone)
    grants = provider.grants
    try:
        run.place(placements)
        if grants and run.regrant:
            run.grant(grants, grants.host_accounts(st))
        provider.write_cluster_record(st, confirmed=True)   # again: with what creation taught (the node's address)
        st.phase = Phase.READY
        run.save()
        budget.save_periods(provider.store(st), st.periods)   # a new period counts against the budget at once
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
    Returns who enforces it; raises PERMISSION (the grant that would mend it), NOT_FOUND when the compute is gone
    meanwhile (the host may have ended it before it answered this `up`: a refused deletion retried once the grant
    was fixed, a report lost on its way to the store), or TIMEOUT, never calling a setting armed that nothing would
    enforce."""
    deadline = time.monotonic() + knobs.number("TPUCTL_TEARDOWN_WAIT", 900)
    poll = min(knobs.number("TPUCTL_POLL_INTERVAL", 2), 2.0)
    shown = False
    while True:
        said = provider.enforcement(st)
        if said.able:
            return said.text
        if said.able is False:
            raise TpuctlError(ErrorKind.PERMISSION, f"the host cannot end the compute itself: {said.text}; the "
                              "compute is up and billing, with nothing enforcing autostop, deadline or --down",
                              said.hint)
        gone = _gone(st, provider)
        if gone:
            raise TpuctlError(ErrorKind.NOT_FOUND, f"{gone}; autostop, deadline and --down are not armed",
                              f"`tpuctl up -c {st.name}` makes it again")
        if time.monotonic() >= deadline:
            raise TpuctlError(ErrorKind.TIMEOUT, f"{said.text}: autostop, deadline and --down are NOT armed",
                              f"look at the host: tpuctl status -c {st.name}; run `tpuctl up -c {st.name}` again "
                              "to wait for it, or `tpuctl down` when done")
        if not shown:
            progress("waiting for the host to confirm it may delete its own compute")
            shown = True
        time.sleep(poll)


def _gone(st: ClusterState, provider: Provider) -> str:
    """Why the compute is gone, "" while it is up or coming up: the host's own record of ending it (why, when) when
    it did, else what the provider sees. The record alone is not enough: the host writes it before asking for the
    deletion, which Google may refuse."""
    try:
        lost = provider.compute_lost(st)
    except TpuctlError:
        return ""   # cannot tell now; the wait's deadline still bounds it
    if not lost:
        return ""
    stop = stopped_by_host(st, provider)
    if stop:
        return f"the host ended cluster {st.name}'s compute at {when(stop[1])}: {stop[0]}"
    return f"cluster {st.name}'s compute is gone: {lost}"
