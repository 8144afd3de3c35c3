"""Compute Engine VMs tpuctl makes (the legacy node's companion VM, the recovery watcher's VM), and the project's
default service account (Compute API projects.get).

Operations are polled through our own ZoneOperationsClient: ExtendedOperation.result() polls through an internal
client built without our client_options, so against an emulator it would call compute.googleapis.com (GCP_FACTS §3).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from ...core.catalog import region_of
from ...core.errors import ErrorKind, TpuctlError
from ...core.models import LABEL, NONCE_LABEL, ClusterSpec, require_owned
from ..base import Progress
from . import clients
from .errors import classify_text
from .operations import call, get_or_none, wait

IMAGE = "projects/debian-cloud/global/images/family/debian-12"
ROLE_LABEL = "tpuctl-role"   # what a VM tpuctl made is for: "tpu" (gce_requests.py), "watcher" (watcher_vm.py)
DEADLINE = 600.0


def default_service_account(project: str) -> str:
    p = call(clients.compute("ProjectsClient").get, project=project, what="read project")
    if not p.default_service_account:
        raise TpuctlError(ErrorKind.PERMISSION, f"project {project} has no Compute Engine default service account",
                          "pass --service-account EMAIL")
    return p.default_service_account


def find(project: str, name: str, zone: str) -> Any:
    return get_or_none(clients.compute("InstancesClient").get, project=project, zone=zone, instance=name,
                what=f"get VM {name}")


def list_labelled(project: str) -> list[tuple[str, Any]]:
    """(zone, VM) of every VM in the project carrying the tpuctl label, across zones (instances.aggregatedList)."""
    client = clients.compute("InstancesClient")
    pages = call(lambda: list(client.aggregated_list(project=project)), what="list VMs")
    return [(zone.removeprefix("zones/"), vm) for zone, scoped in pages for vm in scoped.instances
            if LABEL in vm.labels]


class VmShape(NamedTuple):
    """What differs between the VMs tpuctl makes."""
    name: str
    machine_type: str
    disk_gb: int
    description: str
    labels: dict[str, str]


def node_vm(spec: ClusterSpec) -> VmShape:
    return VmShape(spec.vm_name, spec.vm_type, 50, f"tpuctl cluster {spec.name}: runs the job against the TPU Node",
                   spec.labels)


def network_of(spec: ClusterSpec, zone: str) -> dict[str, str]:
    """NetworkInterface.network / .subnetwork as partial URLs, which the API accepts ("global/networks/NETWORK",
    "regions/REGION/subnetworks/SUBNETWORK": the NetworkInterface reference, cloud.google.com/compute/docs/reference/
    rest/v1/instances); the subnetwork is the one of that name in the VM's own region."""
    out = {"network": f"global/networks/{spec.network or 'default'}"}
    if spec.subnetwork:
        out["subnetwork"] = f"regions/{region_of(zone)}/subnetworks/{spec.subnetwork}"
    return out


def build_instance(spec: ClusterSpec, zone: str, script: str, labels: dict[str, str],
                   shape: VmShape | None = None) -> Any:
    from google.cloud import compute_v1 as c
    shape = shape or node_vm(spec)
    return c.Instance(
        name=shape.name, machine_type=f"zones/{zone}/machineTypes/{shape.machine_type}", labels=labels,
        description=shape.description,
        disks=[c.AttachedDisk(boot=True, auto_delete=True, initialize_params=c.AttachedDiskInitializeParams(
            source_image=IMAGE, disk_size_gb=shape.disk_gb))],
        network_interfaces=[c.NetworkInterface(**network_of(spec, zone), access_configs=[
            c.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")])],
        service_accounts=[c.ServiceAccount(email=spec.service_account or "default",
                                           scopes=["https://www.googleapis.com/auth/cloud-platform"])],
        metadata=c.Metadata(items=[c.Items(key="startup-script", value=script)]))


def wait_operation(project: str, op: Any, what: str, zone: str = "", region: str = "",
                   deadline: float = DEADLINE, progress: Progress | None = None,
                   describe: Callable[[], str] | None = None) -> None:
    """Poll a zonal, regional or global operation (the client the resource's scope names) to DONE, then read its
    `error` ourselves: the client raises only when httpErrorStatusCode and httpErrorMessage are both set
    (../shared/GCE_TPU_FACTS.md §9), so an operation that failed without them would otherwise pass as success."""
    where: dict[str, Any]
    if zone:
        ops, where = clients.compute("ZoneOperationsClient"), {"zone": zone}
    elif region:
        ops, where = clients.compute("RegionOperationsClient"), {"region": region}
    else:
        ops, where = clients.compute("GlobalOperationsClient"), {}

    def poll() -> tuple[bool, str]:
        cur = call(ops.get, project=project, operation=op.name, **where, what=what)
        return cur.status == type(cur).Status.DONE, describe() if describe else "working"
    wait(poll, what, deadline, progress)
    done = call(ops.get, project=project, operation=op.name, **where, what=what)
    if done.error and done.error.errors:
        e = done.error.errors[0]
        raise classify_text(e.code, e.message, what)


def create(project: str, spec: ClusterSpec, zone: str, script: str, nonce: str, progress: Progress,
           shape: VmShape | None = None) -> bool:
    """Create the VM (the node's companion unless `shape` says otherwise); True when THIS run made it. As for TPUs
    (tpu.TpuApi.create): a 409 is adopted (ours when it carries our nonce: an insert applied whose answer was
    lost), and only a VM with our nonce is ever removed."""
    shape = shape or node_vm(spec)
    progress("creating")
    what = f"create VM {shape.name} in {zone}"
    try:
        try:
            op = call(clients.compute("InstancesClient").insert_unary, project=project, zone=zone,
                      instance_resource=build_instance(spec, zone, script, {**shape.labels, NONCE_LABEL: nonce},
                                                       shape),
                      what=what)
            wait_operation(project, op, what, zone=zone)
            ours = True
        except TpuctlError as e:
            from google.api_core.exceptions import Conflict
            vm = find(project, shape.name, zone) if isinstance(e.__cause__, Conflict) else None
            if vm is None:
                raise
            require_owned(vm.labels, spec.name, f"VM {shape.name} in {zone}")
            ours = vm.labels.get(NONCE_LABEL) == nonce
            progress("created by this run, answer lost: adopting" if ours else "made by another `up`: adopting")
    except TpuctlError:
        left = find(project, shape.name, zone)
        if left is not None and left.labels.get(NONCE_LABEL) == nonce:
            delete(project, shape.name, zone, spec.name, progress)
        raise
    progress("RUNNING")
    return ours


def delete(project: str, name: str, zone: str, cluster: str, progress: Progress) -> None:
    vm = find(project, name, zone)
    if vm is None:
        return
    require_owned(vm.labels, cluster, f"VM {name} in {zone}")
    progress("deleting")
    what = f"delete VM {name}"
    try:
        op = call(clients.compute("InstancesClient").delete_unary, project=project, zone=zone, instance=name,
                  what=what)
        wait_operation(project, op, what, zone=zone)
    except TpuctlError as e:
        if e.kind is not ErrorKind.NOT_FOUND:
            raise
