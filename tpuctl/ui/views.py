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
    more, ids = _ids(name, last)
    return more, _rows_of(name, ids[first:last])


def _ids(name: str, last: int) -> tuple[bool, list[str]]:
    """(whether runs older than `last` exist, the ids of cluster `name`'s `last` newest runs): its index listed,
    no run read."""
    st, prov = cluster(name)
    ids = runindex.newest(prov.store(st), last + 1, repair=False)
    return len(ids) > last, ids[:last]


def _rows_of(name: str, ids: list[str]) -> list[dict[str, Any]]:
    """The rows of these runs of cluster `name`, costed."""
    st, prov = cluster(name)
    rows = submission.table(prov.store(st), ids=ids, repair=False) if ids else []
    costed(st, prov, rows)
    return rows


def _asked(figures: Figures, key: str, ask: Any, name: str, now: float, problems: list[str]) -> Any:
    """A store's answer as a page shows it (None before a first one), and what is wrong with it into `problems`."""
    fig = figures.get(key, ask, max_age=0, wait=store_wait())
    if fig.error:
        problems.append(f"{name}: {fig.error}")
    if fig.value is None:
        if not fig.error:
            problems.append(f"{name}: its store has not answered ({fig.age(now)})")
        return None
    if fig.asked and now - fig.asked >= store_wait():
        problems.append(f"{name}: its store is slow to answer: rows {fig.age(now)}")
    return fig.value


def runs(figures: Figures, name: str | None, page: int) -> dict[str, Any]:
    """A page of runs, newest first: one cluster's, or every cluster's merged by id (ids sort by submission time).
    Only the index entries up to this page are listed, and only this page's runs are read (runindex.newest), so a
    store with 20,000 runs opens its first page as fast as one with 20. Each cluster's store (a bucket) is read in
    the background: one that does not answer in time shows its last rows, and says so. Every cluster's page is
    found from the clusters' indexes alone (listed up to the page's end, merged), and then only the runs on it
    are read: a late page reads no run before it."""
    problems: list[str] = []
    size = page_size()
    first, last = page * size, (page + 1) * size
    now = time.time()
    if name:
        got = _asked(figures, f"runs:{name}:{first}:{last}", functools.partial(_rows, name, first, last), name, now,
                     problems)
        return {"cluster": name, "page": page, "more": bool(got and got[0]), "rows": got[1] if got else [],
                "problems": problems}
    more = False
    merged: list[tuple[str, str]] = []
    for n in state.cluster_names():
        got = _asked(figures, f"ids:{n}:{last}", functools.partial(_ids, n, last), n, now, problems)
        if got is not None:
            more = more or got[0]
            merged += [(rid, n) for rid in got[1]]
    merged.sort(reverse=True)
    more = more or len(merged) > last
    shown = merged[first:last]
    rows: list[dict[str, Any]] = []
    for n in dict.fromkeys(c for _, c in shown):
        ids = [rid for rid, c in shown if c == n]
        got = _asked(figures, f"rows:{n}:{ids[0]}:{len(ids)}", functools.partial(_rows_of, n, ids), n, now, problems)
        rows += got or []
    rows.sort(key=lambda r: str(r["id"]), reverse=True)
    return {"cluster": "", "page": page, "more": more, "rows": rows, "problems": problems}


def leftovers(figures: Figures) -> dict[str, Any]:
    """What `ls` finds that no cluster in local state accounts for (resources and data no cluster holds), each with
    the command that removes it; the providers' inventories are asked in the background, as `ls` asks them."""
    from ..core import config
    from ..core.models import ProviderName
    fig = figures.get("ls", lambda: inventory.ls([registry.get(p) for p in ProviderName], config.project(None),
                                                 lambda m: None, repair=False))
    rows = [r for r in (fig.value or []) if r.get("orphan") or r.get("orphan_data")]
    return {"rows": rows, "age": fig.age(time.time()), "error": fig.error}
