"""TPUs as Compute Engine resources (`up --api compute`, and always for TPU7x, which the Cloud TPU API does not
serve: tpu/docs/tpus-in-compute-engine). Facts and sources: ../shared/GCE_TPU_FACTS.md (§ numbers below).

A single-host slice is one VM instance of the type's TPU machine type (§2); a multi-host slice is an instance
template, a workload policy (a regional resource policy, HIGH_THROUGHPUT with the slice's accelerator topology) and a
zonal MIG of `vms` instances naming it (§3); `--slices N` is N MIGs on one template and policy. The MIG's bulk mode
(all-or-nothing) is used where Google offers it: flex-start and reservation-bound templates (§3, about-bulk-mode).

What Compute Engine says is mapped onto the TPU API's node states (tpu.py), so health, status, `watch` and the
recovery rules read one vocabulary: RUNNING is READY; PROVISIONING, STAGING, PENDING (flex-start waiting) and a MIG
re-creating a VM (its repair: Google's doing, which spends no recovery attempt) are CREATING/REPAIRING; TERMINATED
or STOPPED (a Spot VM preempted with the STOP action: it cannot be restarted, only deleted and made again, tpu/docs/
spot-compute) is PREEMPTED; gone is MISSING.

Operations: a Compute operation fails in the Python client only when it carries httpErrorStatusCode and
httpErrorMessage (§9, google-api-core extended_operation.py), so every operation is polled here and its `error` read
by tpuctl itself (compute.wait_operation).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.catalog import ComputeShape, compute_shape, region_of, tpu_type
from ...core.errors import ErrorKind, TpuctlError
from ...core.models import LABEL, ClusterSpec, require_owned
from ...core.together import together
from ..base import Progress
from . import clients
from .compute import network_of, wait_operation
from .operations import call, get_or_none, wait
from .tpu import NONCE_LABEL

ROLE_LABEL = "tpuctl-role"   # "tpu" on a TPU VM made here (the watcher's VM says "watcher": watcher_vm.py)
# Google's TPU-optimised Ubuntu images (§2 "Boot image": project ubuntu-os-accelerator-images, the families in use
# in Google's and vLLM's guides; the family list page itself could not be read).
IMAGE_PROJECT = "ubuntu-os-accelerator-images"
IMAGE_FAMILIES = {"tpu7x": "ubuntu-accel-2404-amd64-tpu-tpu7x", "v6e": "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
                  "v5p": "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"}
# Families Google offers no TPU TensorFlow for (TPU7x: its guides are JAX and PyTorch only, §5).
NO_TENSORFLOW = frozenset({"tpu7x"})
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]   # set explicitly: gcloud's default is narrower (§2)
CREATE_DEADLINE = 1800.0
DELETE_DEADLINE = 900.0
# Instance.status -> the TPU API node state it means here (module docstring; Instance.status enum, §6).
_STATE = {"RUNNING": "READY", "PROVISIONING": "CREATING", "STAGING": "CREATING", "PENDING": "CREATING",
          "REPAIRING": "REPAIRING", "TERMINATED": "PREEMPTED", "STOPPED": "PREEMPTED", "STOPPING": "STOPPING",
          "PENDING_STOP": "STOPPING", "SUSPENDING": "STOPPING", "SUSPENDED": "STOPPED", "DEPROVISIONING": "DELETING"}
# ManagedInstance.currentAction values that mean the MIG is bringing the VM (back) up (§3 "States").
_MIG_BUSY = {"CREATING", "CREATING_WITHOUT_RETRIES", "RECREATING", "RESTARTING", "STARTING", "REFRESHING",
             "VERIFYING", "RESUMING"}
_STOCKOUT = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "QUOTA_EXCEEDED")


def image(family: str) -> str:
    return f"projects/{IMAGE_PROJECT}/global/images/family/{IMAGE_FAMILIES[family]}"


def template_name(node: str) -> str:
    """One template per slice (MIG): each carries its slice's number (`tpuctl-slice` metadata), which the host's
    start-up script reads where Google's tpu-env has no MEGASCALE_SLICE_ID (a Multislice of MIGs is tpuctl's own)."""
    return f"{node}-template"


def policy_name(spec: ClusterSpec) -> str:
    return f"{spec.tpu_name}-wp"


def shape_of(spec: ClusterSpec) -> ComputeShape:
    return compute_shape(tpu_type(spec.tpu_type))


def description(spec: ClusterSpec) -> str:
    """Templates, policies and MIGs carry no labels (InstanceTemplate, ResourcePolicy, InstanceGroupManager in the
    Compute discovery document): this description is how `ls` and `down` know them as the cluster's, and what a
    cluster rebuilt from them (`down -c NAME --project P`) is: "tpuctl cluster NAME TYPE xSLICES"."""
    return f"tpuctl cluster {spec.name} {spec.tpu_type} x{spec.slices}"


def owner_of(desc: str) -> str:
    words = (desc or "").split()
    return words[2] if len(words) >= 3 and words[:2] == ["tpuctl", "cluster"] else ""


def shape_in(desc: str) -> tuple[str, int]:
    """(TPU type, slices) a description names; ("", 1) when it names none."""
    words = (desc or "").split()
    return (words[3], int(words[4][1:])) if len(words) >= 5 and words[4][1:].isdigit() else ("", 1)


@dataclass
class Endpoint:
    ip_address: str


@dataclass
class Slice:
    """One slice as tpuctl reads it: a bare VM, or a MIG and its instances (what tpu.facts() and health read)."""
    name: str
    state: str
    labels: dict[str, str]
    service_account: str = ""
    network_endpoints: list[Endpoint] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)


# -- request builders (pure) ------------------------------------------------------------------------------------------
def build_scheduling(spec: ClusterSpec) -> Any:
    """TERMINATE on host maintenance (TPU VMs cannot live-migrate, §2); SPOT with the STOP action Google's TPU Spot
    template uses (tpu/docs/spot-compute); FLEX_START with maxRunDuration and DELETE; RESERVATION_BOUND with DELETE
    ("DELETE is a required parameter for RESERVATION_BOUND + MIG", §3)."""
    from google.cloud import compute_v1 as c
    s = c.Scheduling(on_host_maintenance="TERMINATE")
    if spec.spot:
        s.provisioning_model, s.instance_termination_action, s.automatic_restart = "SPOT", "STOP", False
    elif spec.flex_start:
        s.provisioning_model, s.instance_termination_action = "FLEX_START", "DELETE"
        s.max_run_duration = c.Duration(seconds=spec.max_duration)
    elif spec.reservation:
        s.provisioning_model, s.instance_termination_action = "RESERVATION_BOUND", "DELETE"
    return s


def _common(spec: ClusterSpec, zone: str, script: str, service_account: str, labels: dict[str, str],
            slice_id: int = 0) -> dict:
    from google.cloud import compute_v1 as c
    t = tpu_type(spec.tpu_type)
    out: dict[str, Any] = dict(
        labels={**labels, ROLE_LABEL: "tpu"}, description=description(spec),
        disks=[c.AttachedDisk(boot=True, auto_delete=True, initialize_params=c.AttachedDiskInitializeParams(
            source_image=image(t.family), disk_size_gb=100))],
        network_interfaces=[c.NetworkInterface(**network_of(spec, zone), access_configs=[
            c.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")])],
        service_accounts=[c.ServiceAccount(email=service_account or "default", scopes=SCOPES)],
        metadata=c.Metadata(items=[c.Items(key="startup-script", value=script),
                                   c.Items(key="tpuctl-slice", value=str(slice_id))]),
        scheduling=build_scheduling(spec))
    if shape_of(spec).machine_type == "ct6e-standard-8t":   # "CT6e 8-chip VMs require single-threaded cores" (§2)
        out["advanced_machine_features"] = c.AdvancedMachineFeatures(threads_per_core=1)
    if spec.reservation:   # gcloud's key for --reservation (§2 reservationAffinity)
        out["reservation_affinity"] = c.ReservationAffinity(
            consume_reservation_type="SPECIFIC_RESERVATION", key="compute.googleapis.com/reservation-name",
            values=[spec.reservation])
    return out


def build_instance(spec: ClusterSpec, zone: str, script: str, service_account: str, labels: dict[str, str]) -> Any:
    """Instance.machineType is a zonal partial URL (§2)."""
    from google.cloud import compute_v1 as c
    return c.Instance(name=spec.tpu_name, machine_type=f"zones/{zone}/machineTypes/{shape_of(spec).machine_type}",
                      **_common(spec, zone, script, service_account, labels))


def build_template(spec: ClusterSpec, node: str, zone: str, script: str, service_account: str,
                   labels: dict[str, str]) -> Any:
    """InstanceProperties.machineType takes the bare name only: a URL there is an INTERNAL_ERROR (§2)."""
    from google.cloud import compute_v1 as c
    common = _common(spec, zone, script, service_account, labels, spec.node_names.index(node))
    return c.InstanceTemplate(name=template_name(node), description=description(spec),
                              properties=c.InstanceProperties(machine_type=shape_of(spec).machine_type, **common))


def build_policy(spec: ClusterSpec) -> Any:
    from google.cloud import compute_v1 as c
    return c.ResourcePolicy(name=policy_name(spec), description=description(spec),
                            workload_policy=c.ResourcePolicyWorkloadPolicy(
                                type_="HIGH_THROUGHPUT", accelerator_topology=shape_of(spec).topology))


def is_mig(spec: ClusterSpec) -> bool:
    """Whether the cluster is MIGs (a multi-host slice, or a Multislice) rather than one bare VM; a cluster rebuilt
    from a template or policy alone (no type known) counts as MIGs."""
    return not spec.tpu_type or shape_of(spec).vms > 1 or spec.slices > 1


def bulk(spec: ClusterSpec) -> bool:
    """Bulk mode ("creates VMs all at once") "supports the reservation-bound and flex-start provisioning models" only;
    with flex-start, repairs must be off (about-bulk-mode, §3)."""
    return spec.flex_start or bool(spec.reservation)


def build_mig(spec: ClusterSpec, name: str, zone: str) -> Any:
    from google.cloud import compute_v1 as c
    mig = c.InstanceGroupManager(
        name=name, description=description(spec), base_instance_name=name, target_size=shape_of(spec).vms,
        instance_template=f"projects/{spec.project}/global/instanceTemplates/{template_name(name)}",
        resource_policies=c.InstanceGroupManagerResourcePolicies(
            workload_policy=f"projects/{spec.project}/regions/{region_of(zone)}/resourcePolicies/{policy_name(spec)}"))
    if bulk(spec):
        mig.target_size_policy = c.InstanceGroupManagerTargetSizePolicy(mode="BULK")
        mig.instance_lifecycle_policy = c.InstanceGroupManagerInstanceLifecyclePolicy(
            default_action_on_failure="DO_NOTHING")
    return mig


# -- reading ----------------------------------------------------------------------------------------------------------
def _enum(value: Any) -> str:
    return value if isinstance(value, str) else getattr(value, "name", str(value))


class ComputeTpus:
    """The cluster's slices as Compute Engine resources, with the find/state/get/delete surface of tpu.TpuApi."""

    def __init__(self, project: str) -> None:
        self.project = project

    def _c(self, kind: str) -> Any:
        return clients.compute(kind)

    def _instance(self, name: str, zone: str) -> Any:
        return get_or_none(self._c("InstancesClient").get, project=self.project, zone=zone, instance=name,
                           what=f"get VM {name}")

    def _mig(self, name: str, zone: str) -> Any:
        return get_or_none(self._c("InstanceGroupManagersClient").get, project=self.project, zone=zone,
                           instance_group_manager=name, what=f"get MIG {name}")

    def managed(self, name: str, zone: str) -> list[Any]:
        client = self._c("InstanceGroupManagersClient")
        return call(lambda: list(client.list_managed_instances(project=self.project, zone=zone,
                                                               instance_group_manager=name)),
                    what=f"list the VMs of MIG {name}")

    def find(self, name: str, zone: str) -> Slice | None:
        """The slice `name` (a bare VM, else a MIG of that name), or None."""
        vm = self._instance(name, zone)
        if vm is not None:
            return self._slice_of_vm(name, vm)
        mig = self._mig(name, zone)
        if mig is None:
            return None
        return self._slice_of_mig(name, zone, mig)

    def _slice_of_vm(self, name: str, vm: Any) -> Slice:
        eps = [Endpoint(n.network_i_p) for n in vm.network_interfaces]
        sa = vm.service_accounts[0].email if vm.service_accounts else ""
        return Slice(name, _STATE.get(vm.status, "STATE_UNSPECIFIED"), dict(vm.labels), sa, eps[:1], [vm.name])

    def _slice_of_mig(self, name: str, zone: str, mig: Any) -> Slice:
        """A MIG is as good as its worst VM: one lost is the slice's loss; a VM the MIG is (re-)creating is
        coming; fewer VMs than the target with nothing in progress is missing ones (§3 "Preemption or repair")."""
        labels = {LABEL: owner_of(mig.description)} if owner_of(mig.description) else {}
        members = self.managed(name, zone)
        states: list[str] = []
        vms: list[str] = []
        eps: list[Endpoint] = []
        sa = ""
        for m in members:
            action = _enum(m.current_action)
            status = _enum(m.instance_status) if m.instance_status else ""
            vm_name = m.instance.rsplit("/", 1)[-1] if m.instance else m.name
            vms.append(vm_name)
            if action in _MIG_BUSY or (not status and action != "NONE"):
                states.append("REPAIRING" if action in ("RECREATING", "RESTARTING") else "CREATING")
            else:
                states.append(_STATE.get(status, "STATE_UNSPECIFIED") if status else "CREATING")
        if len(members) < mig.target_size:
            states.append("MISSING")
        order = ("PREEMPTED", "MISSING", "STOPPING", "STOPPED", "DELETING", "REPAIRING", "CREATING")
        worst = next((s for s in order if s in states), "READY" if states else "CREATING")
        if worst == "READY":
            for vm_name in sorted(vms):
                vm = self._instance(vm_name, zone)
                if vm is not None:
                    eps.append(Endpoint(vm.network_interfaces[0].network_i_p if vm.network_interfaces else ""))
                    sa = sa or (vm.service_accounts[0].email if vm.service_accounts else "")
                    labels = {**labels, **dict(vm.labels)}
        return Slice(name, worst, labels, sa, eps, vms)

    @staticmethod
    def state(node: Slice) -> str:
        return node.state

    def get(self, name: str, zone: str) -> Slice:
        node = self.find(name, zone)
        if node is None:
            raise TpuctlError(ErrorKind.ERROR, f"TPU {name} disappeared in {zone}", "run the same command again")
        return node

    def stockout(self, name: str, zone: str) -> TpuctlError | None:
        """A MIG's creation errors (listErrors) naming a stockout or quota: the zone cannot give the slice now."""
        client = self._c("InstanceGroupManagersClient")
        errors = call(lambda: list(client.list_errors(project=self.project, zone=zone, instance_group_manager=name)),
                      what=f"list the errors of MIG {name}")
        for e in errors:
            if e.error.code in _STOCKOUT:
                from .errors import classify_text
                return classify_text(e.error.code, e.error.message, f"create {name} in {zone}")
        return None

    # -- making ---------------------------------------------------------------------------------------------------
    def _insert(self, kind: str, what: str, scope: dict[str, Any], **kwargs: Any) -> bool:
        """Insert and wait for the operation; False when the name is taken (409: adopted by the caller)."""
        try:
            op = call(getattr(self._c(kind), "insert_unary"), project=self.project, **scope, **kwargs, what=what)
        except TpuctlError as e:
            from google.api_core.exceptions import Conflict
            if isinstance(e.__cause__, Conflict):
                return False
            raise
        wait_operation(self.project, op, what, **scope)
        return True

    def create(self, spec: ClusterSpec, zone: str, script: str, service_account: str, nonce: str,
               progress: Progress, accepted: Callable[[], None] = lambda: None) -> bool:
        """Make the slices and wait until every VM runs; True when THIS run made them. As tpu.TpuApi.create: what
        carries our nonce is ours (a create whose answer was lost), and on failure only that is removed."""
        labels = {**spec.labels, NONCE_LABEL: nonce}
        try:
            if not is_mig(spec):
                progress("creating VM")
                ours = self._insert("InstancesClient", f"create VM {spec.tpu_name} in {zone}", {"zone": zone},
                                    instance_resource=build_instance(spec, zone, script, service_account, labels))
                if not ours:
                    vm = self.get(spec.tpu_name, zone)
                    require_owned(vm.labels, spec.name, f"VM {spec.tpu_name} in {zone}")
                    ours = vm.labels.get(NONCE_LABEL) == nonce
            else:
                ours = self._create_migs(spec, zone, script, service_account, labels, progress)
            accepted()
            self.wait_ready(spec, zone, progress)
            return ours
        except TpuctlError:
            left = [n for n in spec.node_names if (s := self.find(n, zone)) is not None
                    and s.labels.get(NONCE_LABEL) == nonce]
            if left or any(self._template_is(n, nonce) for n in spec.node_names):
                self.delete(spec, zone, progress)
            raise

    def _template(self, node: str) -> Any:
        return get_or_none(self._c("InstanceTemplatesClient").get, project=self.project,
                           instance_template=template_name(node), what="get instance template")

    def _template_is(self, node: str, nonce: str) -> bool:
        t = self._template(node)
        return t is not None and t.properties.labels.get(NONCE_LABEL) == nonce

    def _create_migs(self, spec: ClusterSpec, zone: str, script: str, service_account: str,
                     labels: dict[str, str], progress: Progress) -> bool:
        """The workload policy and each slice's template at once, then every slice's MIG at once: a MIG names both,
        so `up` takes two operations' time whatever the number of slices (bench/bench_up.py), not 1 + 2N."""
        names = spec.node_names
        progress(f"creating workload policy and instance template{'s' if len(names) > 1 else ''}")
        made = together([functools.partial(
            self._insert, "ResourcePoliciesClient", f"create workload policy {policy_name(spec)}",
            {"region": region_of(zone)}, resource_policy_resource=build_policy(spec))] + [functools.partial(
                self._insert, "InstanceTemplatesClient", f"create instance template {template_name(name)}", {},
                instance_template_resource=build_template(spec, name, zone, script, service_account, labels))
                for name in names])[1:]
        ours = all([m or self._template_is(name, labels[NONCE_LABEL]) for name, m in zip(names, made)])
        progress(f"creating MIG{'s' if len(names) > 1 else ''} {', '.join(names)}")
        together([functools.partial(self._insert, "InstanceGroupManagersClient", f"create MIG {name} in {zone}",
                                     {"zone": zone}, instance_group_manager_resource=build_mig(spec, name, zone))
                   for name in names])
        return ours

    def wait_ready(self, spec: ClusterSpec, zone: str, progress: Progress) -> None:
        """Every slice READY. A MIG that cannot get capacity keeps trying (its listErrors name a stockout); that is
        this zone's failure, so `up` moves on. A flex-start or bulk request waits for capacity instead (§9)."""
        def poll() -> tuple[bool, str]:
            states = {}
            for name in spec.node_names:
                s = self.find(name, zone)
                if s is None:
                    raise TpuctlError(ErrorKind.ERROR, f"TPU {name} disappeared while waiting",
                                      "run the same command again")
                if s.state == "PREEMPTED":
                    raise TpuctlError(ErrorKind.PREEMPTED, f"TPU {name} was preempted while being made",
                                      "run `tpuctl up` again to recreate it")
                if s.state in ("CREATING", "MISSING") and s.instances != [name] and not bulk(spec):
                    err = self.stockout(name, zone)
                    if err is not None:
                        raise err
                states[name] = s.state
            worst = next((v for v in states.values() if v != "READY"), "READY")
            return worst == "READY", worst
        wait(poll, f"TPU {spec.tpu_name}", CREATE_DEADLINE if not spec.flex_start else spec.max_duration + 86400.0,
             progress)

    # -- removing -------------------------------------------------------------------------------------------------
    def _delete(self, kind: str, what: str, scope: dict[str, Any], **kwargs: Any) -> None:
        try:
            op = call(getattr(self._c(kind), "delete_unary"), project=self.project, **scope, **kwargs, what=what)
            wait_operation(self.project, op, what, **scope)
        except TpuctlError as e:
            if e.kind is not ErrorKind.NOT_FOUND:
                raise

    def delete(self, spec: ClusterSpec, zone: str, progress: Progress) -> None:
        """MIGs (their VMs with them), the bare VM, then the template and the workload policy, which cannot go while
        a MIG names them (§3 "Delete"); each checked to be the cluster's first."""
        for name in spec.node_names:
            mig = self._mig(name, zone)
            if mig is not None:
                if owner_of(mig.description) != spec.name:
                    raise TpuctlError(ErrorKind.REFUSED, f"MIG {name} in {zone} is not cluster {spec.name}'s "
                                      f"(its description: {mig.description!r})", "delete it yourself if it is yours")
                progress(f"deleting MIG {name}")
                self._delete("InstanceGroupManagersClient", f"delete MIG {name}", {"zone": zone},
                             instance_group_manager=name)
            vm = self._instance(name, zone)
            if vm is not None:
                require_owned(dict(vm.labels), spec.name, f"VM {name} in {zone}")
                progress(f"deleting VM {name}")
                self._delete("InstancesClient", f"delete VM {name}", {"zone": zone}, instance=name)
        for name in spec.node_names:
            t = self._template(name)
            if t is not None:
                require_owned(dict(t.properties.labels), spec.name, f"instance template {template_name(name)}")
                progress(f"deleting instance template {template_name(name)}")
                self._delete("InstanceTemplatesClient", f"delete instance template {template_name(name)}", {},
                             instance_template=template_name(name))
        region = region_of(zone)
        p = get_or_none(self._c("ResourcePoliciesClient").get, project=self.project, region=region,
                        resource_policy=policy_name(spec), what="get workload policy")
        if p is not None:
            if owner_of(p.description) != spec.name:
                raise TpuctlError(ErrorKind.REFUSED, f"workload policy {policy_name(spec)} is not cluster "
                                  f"{spec.name}'s", "delete it yourself if it is yours")
            progress("deleting workload policy")
            self._delete("ResourcePoliciesClient", f"delete workload policy {policy_name(spec)}", {"region": region},
                         resource_policy=policy_name(spec))


def teardown_list(spec: ClusterSpec) -> list[str]:
    if spec.tpu_type and not is_mig(spec):
        return [f"VM {spec.tpu_name}"]
    return [f"MIG {n} and its VMs" for n in spec.node_names] + [f"instance template {template_name(n)}"
                                                                for n in spec.node_names] \
        + [f"workload policy {policy_name(spec)}"]


FLEX_MAX_SECONDS = 7 * 86400   # "The run duration must be between 10 minutes and 7 days" (about-resize-requests, §4)
FLEX_MIN_SECONDS = 600


def check_capacity_flags(spec: ClusterSpec) -> None:
    """--flex-start needs --max-duration: a flex-start VM's maxRunDuration, which Google enforces (§4)."""
    from ...core.errors import bad_input
    if not spec.flex_start:
        return
    if not spec.max_duration:
        raise bad_input("--flex-start needs --max-duration D: Google deletes flex-start VMs after it",
                        "add --max-duration, from 10m to 7d (for example --max-duration 8h)")
    if not FLEX_MIN_SECONDS <= spec.max_duration <= FLEX_MAX_SECONDS:
        raise bad_input("--max-duration with --flex-start is from 10 minutes to at most 7 days (about-resize-"
                        "requests)", "for example --max-duration 8h")


def permissions_needed(spec: ClusterSpec) -> dict[str, str]:
    """What the caller needs in the project, each -> the role that carries it: Compute Instance Admin (v1), the one
    role the multi-host slice quickstart asks for beside Service Account User (compute/docs/tpus/quickstart-create-
    tpu-multi-host-slice; GCE_TPU_FACTS §7). The names of the template, MIG and policy permissions follow
    compute/docs/access/iam; that MIG resize and bulk need nothing beyond them is not documented."""
    role = "roles/compute.instanceAdmin.v1"
    if not is_mig(spec):
        names = ["compute.instances.create", "compute.instances.delete"]
    else:
        names = [f"compute.{r}.{v}" for r in ("instanceTemplates", "instanceGroupManagers", "resourcePolicies")
                 for v in ("create", "delete")]
    return {n: role for n in names}
