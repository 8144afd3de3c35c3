"""`down`: delete what `up` made (compute, then the grants it added), keep the store unless asked, and remember a
kept cluster as down so its runs' logs and outputs stay reachable by name."""
from __future__ import annotations

import json
import time

from ..core import backends, budget, layout, orphans, runindex, runs, state
from ..core.errors import TpuctlError
from ..core.sizes import human_bytes
from ..core.models import ClusterState, HostFacts, Phase
from ..providers.base import Provider, Reporter, progress_of
from ..core.runs import RunState
from ..core.store import BlobStore
from . import armed

TAKEN_DOWN = "cluster taken down (`tpuctl down`)"


def remove_orphans(st: ClusterState, provider: Provider, reporter: Reporter) -> None:
    """The data of runs never submitted (core/orphans.py): a kept store keeps runs, not what was never one. A store
    that cannot be looked at is said, not fatal: `down` is about what bills."""
    try:
        runs_, files, size = orphans.remove_all(provider.store(st))
    except TpuctlError as e:
        reporter.warn(f"could not look for data of runs never submitted: {e.message} (`tpuctl status` shows any)")
        return
    if runs_:
        reporter.resource("data", f"of {runs_} run{'s' * (runs_ > 1)} never submitted",
                          f"deleted ({files} files, {human_bytes(size)})", final=True)


def _disarm(st: ClusterState, provider: Provider) -> tuple[list[str], str]:
    """End a recovery watch (its watchers exit; the caller holds the lease) and take the state its watcher left.
    Returns the zones where compute may be, the one it was last in first (a watcher killed mid-re-create may have
    begun one in any of the cluster's zones, so all are looked at), and the zone of its watcher VM ("" if none)."""
    try:
        store = provider.store(st)
        doc = armed.read(store)
        if doc is None:
            return [st.zone], ""
        armed.end(store, "`tpuctl down`", teardown=True)
        armed.sync(st, store)
    except TpuctlError:
        return [st.zone], ""
    vm_zone = str(doc.get("watcher_zone") or "") if doc.get("watcher") == armed.ON_VM else ""
    return ([st.zone] + [z for z in st.spec.zones if z != st.zone] if st.zone else [st.zone]), vm_zone


def end_runs(store: BlobStore, why: str, failure: str = "") -> list[str]:
    """Every unfinished run (queued, running, interrupted) ends, with `why` in its status note: its compute is gone
    for good, so its duration and cost stop and nothing resumes it on a later `up`. Each worker that runs it gets
    the final status its agent can no longer write (with `failure`, its cause, when given). Returns the runs
    ended."""
    ended = runindex.unfinished(store)
    record = runs.read_object(store, layout.CLUSTER_RECORD)
    hosts = int(record.get("hosts") or 1)
    for run_id in ended:
        job = runs.job(store, run_id)
        one = job is None or \
            backends.program_framework(job.framework, job.env, job.keras_backend, record) == "tensorflow"
        for w in range(1 if one else hosts):
            st = runs.status(store, run_id, w)
            if st.state.final:
                continue
            st.state, st.ended, st.note, st.worker = RunState.ENDED, time.time(), why, w
            st.failure = failure or st.failure
            store.write(layout.run_status(run_id, w), json.dumps(st.to_json()).encode())
        runindex.settle(store, run_id, hosts)
    return ended


def _end_runs(st: ClusterState, provider: Provider, reporter: Reporter) -> None:
    if provider.remote_runs is not None:
        return   # a service's runs are its sessions': settled by the provider (providers/kaggle)
    try:
        ended = end_runs(provider.store(st), TAKEN_DOWN)
    except (TpuctlError, OSError) as e:
        reporter.warn(f"could not mark the cluster's unfinished runs ended: {getattr(e, 'message', e)}")
        return
    for run_id in ended:
        reporter.resource("run", run_id, f"ended: {TAKEN_DOWN}", final=True)


def down(st: ClusterState, provider: Provider, reporter: Reporter, delete_store: bool) -> None:
    errors = []
    zones, watcher_zone = _disarm(st, provider)
    last = st.zone
    try:
        for zone in zones:
            st.zone = zone
            provider.delete_compute(st, reporter)
        st.zone = last
        st.compute_ended(time.time())
        if not delete_store:
            _end_runs(st, provider, reporter)
    except TpuctlError as e:
        st.zone = last
        errors.append(e)
    if watcher_zone and provider.watcher_host is not None:
        try:
            provider.watcher_host.delete(st, watcher_zone, reporter)
            budget.close_extras(provider.store(st))
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
        remove_orphans(st, provider, reporter)
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
