"""The budget between periods (core/budget.py): the recovery watcher, finding the compute lost, asks whether the
periods so far have spent the cap before it re-creates anything; if so it deletes what is left of the compute (a
preempted TPU still exists as a record; a queued request still holds its place), writes the stop record the host
would have written, ends the watch, and says so (cluster.stopped, reason budget)."""
from __future__ import annotations

import json
import time

from ..core import budget, layout, notify, state
from ..core.models import ClusterState
from ..core.store import BlobStore
from ..providers.base import Provider, Reporter
from . import armed


def spent(store: BlobStore, st: ClusterState) -> str:
    """Why the cluster may not get another period, or ""."""
    return budget.over(budget.read(store), st.periods)[1]


def stop(st: ClusterState, provider: Provider, reporter: Reporter, store: BlobStore, why: str, where: str,
         lost: str) -> str:
    """`lost`: how the compute was found (preempted, ...): the stop's message says it."""
    reporter.warn(f"cluster {st.name}: {lost}, and {why}; deleting what is left of its compute, not re-creating it")
    provider.delete_compute(st, reporter)
    now = time.time()
    st.compute_ended(now)
    state.save(st)
    store.write(layout.STOPPED, json.dumps({"reason": why, "time": now, "host": where, "by": "watcher"}).encode())
    ended = f"the budget is spent ({why}): not brought back"
    armed.end(store, ended)
    notify.emit(store, "cluster.stopped", f"cluster.stopped-budget-{st.periods[-1][0] if st.periods else 0}",
                st.name, reason=budget.REASON, why=why, lost=lost)
    return ended
