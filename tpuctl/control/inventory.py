"""`ls`: clusters in local state and every tpuctl-labelled resource the providers find (orphans flagged); and a
cluster rebuilt from its labels, for `down -c NAME --project P` with no local state."""
from __future__ import annotations

import time
from typing import Callable

from ..core import budget, state
from ..core.errors import TpuctlError
from ..core.models import ClusterState, Phase
from ..providers.base import Provider
from .status import costing, orphan_data, store_bytes, stopped_by_host, when


def ls(providers: list[Provider], extra_project: str, warn: Callable[[str], None],
       repair: bool = True) -> list[dict[str, object]]:
    """Clusters in local state, plus every tpuctl-labelled resource each provider's inventory knows of, in each
    project a cluster uses (and extra_project); those without state are orphans. `repair=False` (`tpuctl ui`): a
    stop the host recorded is shown, not saved into the local state."""
    rows: list[dict[str, object]] = []
    local = state.all_clusters(lambda e: warn(f"{e.message}; {e.hint}"))
    known = {(s.name, name, s.zone) for s in local
             for name in (*s.spec.node_names, s.spec.tpu_name, s.spec.vm_name, s.spec.qr_name)}
    known_stores = {s.spec.store for s in local}
    live = {s.name for s in local if s.phase is not Phase.DOWN}   # their parts (a MIG's template) are theirs
    by_name = {p.name: p for p in providers}
    for s in local:
        prov = by_name[s.spec.provider]
        kept = store_bytes(s, prov) if s.phase is Phase.DOWN else None
        stopped = stopped_by_host(s, prov, repair) if s.phase is Phase.READY else None
        phase = f"stopped {when(stopped[1])}" if stopped else s.phase.value
        overdue = bool(s.deadline) and time.time() > s.deadline and s.phase is Phase.READY and not stopped
        rows.append({"cluster": s.name, "provider": s.spec.provider.value, "type": s.spec.tpu_type, "zone": s.zone,
                     "phase": phase, "store": s.spec.store, "store_bytes": kept, "orphan": False, "kind": "cluster",
                     "name": s.name, "remove": f"tpuctl down -c {s.name}",
                     "past_deadline": when(s.deadline) if overdue else "", "orphan_data": orphan_data(s, prov, repair),
                     "budget": _budget_cell(s, prov)})
    for p in providers:
        if p.inventory is None:
            continue
        for project in sorted(({s.spec.project for s in local if s.spec.provider is p.name} | {extra_project}) - {""}):
            try:
                found = p.inventory.list_labelled(project)
            except TpuctlError as e:   # local clusters still list; say what could not be seen
                warn(f"could not list {p.name.value} resources in project {project}: {e.message} ({e.hint})")
                continue
            mine = {r["cluster"]: r for r in rows if not r["orphan"] and r["provider"] == p.name.value}
            for n in found:
                if n["kind"] == "watcher" and n["cluster"] in mine:
                    mine[n["cluster"]]["watcher"] = f"watcher VM {n['name']} ({n['zone']}, {n['state']})"
                    continue
                store = f"gs://{n['name']}" if n["kind"] == "bucket" else ""
                if store in known_stores or (not store and (n["cluster"], n["name"], n["zone"]) in known) \
                        or (n.get("part") and n["cluster"] in live):
                    continue
                rows.append({"cluster": n["cluster"], "provider": p.name.value, "type": n["type"] or n["kind"],
                             "zone": n["zone"], "phase": n["state"], "store": store, "store_bytes": None,
                             "orphan": True, "kind": n["kind"], "name": n["name"],
                             "remove": f"tpuctl down -c {n['cluster']} --project {project}"
                                       + (" --delete-bucket" if store else "")})
    return rows


def _budget_cell(st: ClusterState, provider: Provider) -> str:
    b = costing(st, provider)[1] if st.phase is not Phase.CREATING else {}
    return f"{budget.dollars(float(str(b['spent_usd'])))} of {budget.dollars(float(str(b['budget_usd'])))}" if b else ""


def from_labels(name: str, project: str, provider: Provider) -> ClusterState | None:
    """A cluster with no local state, rebuilt from what carries its label in the project (so `down` works from
    another machine, or after the state file was lost); None when nothing does. Its grants are not known: they
    live on its bucket and go with it (`--delete-bucket`)."""
    if provider.inventory is None or not project:
        return None
    found = [n for n in provider.inventory.list_labelled(project) if n["cluster"] == name]
    return provider.inventory.state_from(name, project, found) if found else None
