"""A maintenance exclusion on a cluster tpuctl made, while its runs are active (issue 49 item 5).

A release channel makes node auto-upgrade mandatory (GKE docs, node auto-upgrades: "cannot be disabled when using
release channels"), and a node upgrade recreates the nodes, killing a run's TPU pods; JobSet restarts the run from
its checkpoint (runs.DEFAULT_RESTARTS), which costs the time since it. GKE's way to hold upgrades off is a
maintenance exclusion (kubernetes-engine/docs/concepts/maintenance-windows-and-exclusions: "a non-repeating window
of time during which GKE automatic maintenance is forbidden"; no maintenance window is needed beside it), set with
clusters.setMaintenancePolicy. The API (google-cloud-container container_v1 types):
- `Cluster.maintenance_policy` (MaintenancePolicy) `.window.maintenance_exclusions`: a map of name -> TimeWindow
  {start_time, end_time, maintenance_exclusion_options {scope}};
- scope NO_MINOR_OR_NODE_UPGRADES: "excludes all minor upgrades for the cluster, and also exclude all node pool
  upgrades. Only control plane patches are allowed" (MaintenanceExclusionOptions.Scope): the node upgrades that
  kill pods are held, the control plane's patches go on (they do not touch the nodes);
- `MaintenancePolicy.resource_version`: "Make a get() request to the cluster to get the current resource version
  and include it with requests to set the policy", so that an update does not undo another's; what the API answers
  to a stale one is not documented, so tpuctl does not rely on the answer: after any failure it reads the cluster
  again and retries only if the version moved;
- SetMaintenancePolicyRequest.maintenance_policy: the whole policy ("An empty field clears the existing
  maintenance policy"), so the policy read is sent back with only tpuctl's exclusion added or removed.
How long an exclusion may last depends on its scope (the maintenance-windows page: a "No upgrades" one at most 30
days; the scoped ones up to the version's end of support); tpuctl's lasts at most MAX_DAYS, inside every reading.
Never on an adopted cluster: its maintenance policy is its owner's.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from ...core import knobs
from ...core.errors import TpuctlError
from ..google import clients
from ..google.operations import call
from . import container

EXCLUSION = "tpuctl-runs"
MAX_DAYS = 30
_TRIES = 4


def hold_days() -> float:
    """How long an exclusion a run sets lasts (TPUCTL_GKE_HOLD_DAYS, at most MAX_DAYS): its bound if the run, or
    tpuctl, never comes back to lift it."""
    return min(knobs.number("TPUCTL_GKE_HOLD_DAYS", MAX_DAYS), MAX_DAYS)


def _name(rec: dict[str, Any]) -> str:
    return f"projects/{rec['project']}/locations/{rec['location']}/clusters/{rec['cluster']}"


def _set(rec: dict[str, Any], change: Any) -> bool:
    """Reads the cluster's policy, lets `change(window)` edit its exclusions (False: nothing to do), and sets it
    with the version read; on a failure, again if the version moved meanwhile. True when it set one."""
    from google.cloud import container_v1 as c
    client, name = clients.container(), _name(rec)
    what = f"set the maintenance policy of GKE cluster {rec['cluster']}"
    for attempt in range(_TRIES):
        cur = call(client.get_cluster, name=name, what=f"get GKE cluster {rec['cluster']}")
        policy = c.MaintenancePolicy(cur.maintenance_policy)
        if not change(policy.window):
            return False
        try:
            # one attempt: a stale version (409 ABORTED is one plausible answer) is not cured by sending it again
            op = call(client.set_maintenance_policy, name=name, maintenance_policy=policy, what=what, attempts=1)
            container.wait_operation(rec["project"], rec["location"], op, what)
            return True
        except TpuctlError:
            again = call(client.get_cluster, name=name, what=f"get GKE cluster {rec['cluster']}")
            if again.maintenance_policy.resource_version == policy.resource_version or attempt == _TRIES - 1:
                raise
    return False


def hold(rec: dict[str, Any], now: dt.datetime | None = None) -> bool:
    """Node upgrades held off from now for hold_days() on a cluster tpuctl made; an exclusion already there is
    extended, never shortened. False on an adopted cluster (left as its owner set it)."""
    if rec.get("adopted"):
        return False
    from google.cloud import container_v1 as c
    start = now or dt.datetime.now(dt.timezone.utc)
    end = start + dt.timedelta(days=hold_days())

    def change(window: Any) -> bool:
        have = window.maintenance_exclusions.get(EXCLUSION)
        if have is not None and have.end_time and have.end_time >= end - dt.timedelta(hours=1):
            return False   # set by a run started within the hour: nothing gained by setting it again
        window.maintenance_exclusions[EXCLUSION] = c.TimeWindow(
            start_time=start, end_time=end, maintenance_exclusion_options=c.MaintenanceExclusionOptions(
                scope=c.MaintenanceExclusionOptions.Scope.NO_MINOR_OR_NODE_UPGRADES))
        return True
    return _set(rec, change)


def release(rec: dict[str, Any]) -> bool:
    """tpuctl's exclusion removed (no run is active); others' left as they are."""
    if rec.get("adopted"):
        return False

    def change(window: Any) -> bool:
        if EXCLUSION not in window.maintenance_exclusions:
            return False
        del window.maintenance_exclusions[EXCLUSION]
        return True
    return _set(rec, change)
