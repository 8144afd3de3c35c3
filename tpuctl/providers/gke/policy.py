"""The workload policy a TPU7x multi-host node pool is placed by: a Compute Engine resource policy of type
HIGH_THROUGHPUT with the slice's accelerator topology, in the cluster's region, named by the node pool's
`placement_policy.policy_name` (GKE's tpu-ironwood page; xpk 1.16 core/nodepool.py `ensure_resource_policy_exists`:
`gcloud beta compute resource-policies create workload-policy NAME --region=R --type=HIGH_THROUGHPUT
--accelerator-topology=T`; google-cloud-compute `ResourcePolicy.workload_policy` /
`ResourcePolicyWorkloadPolicy{type_, accelerator_topology}`).

A resource policy has no labels (google-cloud-compute `ResourcePolicy` has `description`, no `labels`), so the
owner is written in its description as `tpuctl-cluster=NAME`, which adoption and deletion require. Regional
operations are polled through our own RegionOperationsClient, as providers/google/vms.py polls zonal ones.
"""
from __future__ import annotations

from typing import Any

from ...core.catalog import region_of
from ...core.errors import ErrorKind, TpuctlError
from ...core.models import LABEL
from ..base import Progress
from ..google import clients
from ..google.errors import classify_text
from ..google.operations import call, get_or_none, wait
from .container import deadline


def owner_text(cluster: str) -> str:
    return f"{LABEL}={cluster}"


def find(project: str, zone: str, name: str) -> Any:
    return get_or_none(clients.compute("ResourcePoliciesClient").get, project=project, region=region_of(zone),
                       resource_policy=name, what=f"get workload policy {name}")


def _owned(policy: Any, cluster: str) -> None:
    if owner_text(cluster) not in (policy.description or ""):
        raise TpuctlError(ErrorKind.INPUT, f"workload policy {policy.name} does not say {owner_text(cluster)}; "
                          "not touching it", "delete or rename it yourself if it is yours, or pick another -c")


def _wait(project: str, region: str, op: Any, what: str) -> None:
    ops = clients.compute("RegionOperationsClient")

    def poll() -> tuple[bool, str]:
        cur = call(ops.get, project=project, region=region, operation=op.name, what=what)
        return cur.status == type(cur).Status.DONE, "working"
    wait(poll, what, deadline())
    done = call(ops.get, project=project, region=region, operation=op.name, what=what)
    if done.error and done.error.errors:
        e = done.error.errors[0]
        raise classify_text(e.code, e.message, what)


def ensure(project: str, zone: str, name: str, topology: str, cluster: str, progress: Progress) -> bool:
    """Create the policy, or adopt ours; True when this call made it."""
    from google.cloud import compute_v1 as c
    have = find(project, zone, name)
    if have is not None:
        _owned(have, cluster)
        if have.workload_policy.accelerator_topology != topology:
            raise TpuctlError(ErrorKind.INPUT, f"workload policy {name} has topology "
                              f"{have.workload_policy.accelerator_topology}, not {topology}",
                              f"`tpuctl down -c {cluster}` first, then up again")
        progress("adopted")
        return False
    region = region_of(zone)
    what = f"create workload policy {name} in {region}"
    progress("creating")
    body = c.ResourcePolicy(name=name, description=f"tpuctl: TPU7x placement of cluster {cluster} "
                            f"({owner_text(cluster)})", workload_policy=c.ResourcePolicyWorkloadPolicy(
                                type_="HIGH_THROUGHPUT", accelerator_topology=topology))
    op = call(clients.compute("ResourcePoliciesClient").insert_unary, project=project, region=region,
              resource_policy_resource=body, what=what)
    _wait(project, region, op, what)
    progress("READY")
    return True


def delete(project: str, zone: str, name: str, cluster: str, progress: Progress) -> None:
    have = find(project, zone, name)
    if have is None:
        return
    _owned(have, cluster)
    region = region_of(zone)
    what = f"delete workload policy {name}"
    progress("deleting")
    try:
        op = call(clients.compute("ResourcePoliciesClient").delete_unary, project=project, region=region,
                  resource_policy=name, what=what)
        _wait(project, region, op, what)
    except TpuctlError as e:
        if e.kind is not ErrorKind.NOT_FOUND:
            raise
    progress("deleted")
