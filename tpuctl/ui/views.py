"""What the pages show, as plain data, read through control/ and core/ (the same functions `status`, `ls` and `jobs`
call; nothing here computes a figure of its own): the clusters, a page of runs, the leftovers. Cloud calls go
through Figures (figures.py), so a slow cloud never holds a page; what only reads the store is read at once."""
from __future__ import annotations

import functools
import time
from typing import Any

from ..control import inventory, status as status_flow, submission
from ..core import knobs, runindex, state
from ..core.models import ClusterState
from ..providers import registry
from ..providers.base import Provider
from .figures import Figures, store_wait

def page_size() -> int:
    """Runs a page of runs shows (TPUCTL_UI_PAGE, 50)."""
    return knobs.count("TPUCTL_UI_PAGE", 50)


def cluster(name: str) -> tuple[ClusterState, Provider]:
    st = status_flow.load(name)
    return st, registry.get(st.spec.provider)


def clusters(figures: Figures) -> list[dict[str, Any]]:
    """Each cluster in local state as recorded, with `status`'s view of it (asked in the background) and its age."""
    now = time.time()
    out = []
    for st in state.all_clusters(lambda e: None):
        prov = registry.get(st.spec.provider)
        fig = figures.get(f"status:{st.name}", functools.partial(status_flow.status, st, prov, repair=False))
        out.append({"name": st.name, "provider": st.spec.provider.value, "type": st.spec.tpu_type, "zone": st.zone,
                    "phase": st.phase.value, "status": fig.value or {}, "age": fig.age(now), "error": fig.error})
    return out


def costed(st: ClusterState, prov: Provider, rows: list[dict[str, Any]]) -> None:
    """Each row's cost as `jobs` counts it, and its cluster (the page of every cluster's runs links by it)."""
    submission.costed(rows, status_flow.costing(st, prov)[0])
    for r in rows:
        r["cluster"] = st.name


def _rows(name: str, first: int, last: int) -> tuple[bool, list[dict[str, Any]]]:
    """(whether runs older than `last` exist, rows of the runs first..last-1 of cluster `name`, newest first)."""
    st, prov = cluster(name)
    store = prov.store(st)
    ids = runindex.newest(store, last + 1, repair=False)
    rows = submission.table(store, ids=ids[first:last], repair=False)
    costed(st, prov, rows)
    return len(ids) > last, rows


def runs(figures: Figures, name: str | None, page: int) -> dict[str, Any]:
    """A page of runs, newest first: one cluster's, or every cluster's merged by id (ids sort by submission time).
    Only the index entries up to this page are listed, and only this page's runs are read (runindex.newest), so a
    store with 20,000 runs opens its first page as fast as one with 20. Each cluster's store (a bucket) is read in
    the background: one that does not answer in time shows its last rows, and says so."""
    names = [name] if name else state.cluster_names()
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    more = False
    size = page_size()
    first, last = (page * size if name else 0), (page + 1) * size
    now = time.time()
    for n in names:
        fig = figures.get(f"runs:{n}:{first}:{last}", functools.partial(_rows, n, first, last), max_age=0,
                          wait=store_wait())
        if fig.error:
            problems.append(f"{n}: {fig.error}")
        if fig.value is None:
            if not fig.error:
                problems.append(f"{n}: its store has not answered ({fig.age(now)})")
            continue
        if fig.asked and now - fig.asked >= store_wait():
            problems.append(f"{n}: its store is slow to answer: rows {fig.age(now)}")
        more = more or fig.value[0]
        rows += fig.value[1]
    rows.sort(key=lambda r: str(r["id"]), reverse=True)
    if not name:   # every cluster: this page of the merged order
        more = more or len(rows) > (page + 1) * size
        rows = rows[page * size:(page + 1) * size]
    return {"cluster": name or "", "page": page, "more": more, "rows": rows, "problems": problems}


def leftovers(figures: Figures) -> dict[str, Any]:
    """What `ls` finds that no cluster in local state accounts for (resources and data no cluster holds), each with
    the command that removes it; the providers' inventories are asked in the background, as `ls` asks them."""
    from ..core import config
    from ..core.models import ProviderName
    fig = figures.get("ls", lambda: inventory.ls([registry.get(p) for p in ProviderName], config.project(None),
                                                 lambda m: None, repair=False))
    rows = [r for r in (fig.value or []) if r.get("orphan") or r.get("orphan_data")]
    return {"rows": rows, "age": fig.age(time.time()), "error": fig.error}
