"""`down`: delete what `up` made (compute, then the grants it added), keep the store unless asked, and remember a
kept cluster as down so its runs' logs and outputs stay reachable by name."""
from __future__ import annotations

import time

from ..core import budget, state
from ..core.errors import TpuctlError
from ..core.models import ClusterState, HostFacts, Phase
from ..providers.base import Provider, Reporter, progress_of
from . import armed


def _disarm(st: ClusterState, provider: Provider) -> tuple[list[str], str]:
    """End a recovery watch (its watchers exit; the caller holds the lease) and take the state its watcher left.
    Returns the zones where compute may be, the one it was last in first (a watcher killed mid-re-create may have
    begun one in any of the cluster's zones, so all are looked at), and the zone of its watcher VM ("" if none)."""
    try:
        store = provider.store(st)
        doc = armed.read(store)
        if doc is None:
            return [st.zone], ""
        armed.end(store, "`tpuctl down`")
        armed.sync(st, store)
    except TpuctlError:
        return [st.zone], ""
    vm_zone = str(doc.get("watcher_zone") or "") if doc.get("watcher") == armed.ON_VM else ""
    return ([st.zone] + [z for z in st.spec.zones if z != st.zone] if st.zone else [st.zone]), vm_zone


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
