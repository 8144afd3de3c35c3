"""What a TPU cluster asks of Compute Engine (gce.py makes and reads it): the names of its VMs, templates, MIGs and
workload policy, the descriptions that mark them as the cluster's, the request bodies (pure: google-cloud-compute
types, so every field is one the API has), the permissions they need and the flags they constrain. Facts and
sources: ../shared/GCE_TPU_FACTS.md (§ numbers below).
"""
from __future__ import annotations

from typing import Any

from ....core.catalog import ComputeShape, compute_shape, region_of, tpu_type
from ....core.models import ClusterSpec
from ...google.vms import ROLE_LABEL, network_of

# Google's TPU-optimised Ubuntu images (§2 "Boot image": project ubuntu-os-accelerator-images, the families in use
# in Google's and vLLM's guides; the family list page itself could not be read).
IMAGE_PROJECT = "ubuntu-os-accelerator-images"
IMAGE_FAMILIES = {"tpu7x": "ubuntu-accel-2404-amd64-tpu-tpu7x", "v6e": "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
                  "v5p": "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"}
# Families Google offers no TPU TensorFlow for (TPU7x: its guides are JAX and PyTorch only, §5).
NO_TENSORFLOW = frozenset({"tpu7x"})
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]   # set explicitly: gcloud's default is narrower (§2)
# Boot disk types each family takes, the default first: Google's "TPU storage options" table (tpu/docs/storage-
# options-compute): TPU7x and v6e take Hyperdisk Balanced or Hyperdisk ML, v5p Balanced Persistent Disk or
# Hyperdisk ML. compute_v1's AttachedDiskInitializeParams.disk_type names no TPU series for its default (which
# "depends on the machine series"), so the type is always sent. Whether Hyperdisk ML can be a TPU VM's *boot* disk
# is not said there (UNVERIFIED): it is accepted as listed, and Google's answer is shown if it refuses.
DISK_TYPES = {"tpu7x": ("hyperdisk-balanced", "hyperdisk-ml"), "v6e": ("hyperdisk-balanced", "hyperdisk-ml"),
              "v5p": ("pd-balanced", "hyperdisk-ml")}
DISK_GB = 100
DISK_GB_RANGE = (10, 65536)   # a boot disk at least the image's 10 GB; 64 TiB is Hyperdisk Balanced's largest
# A flex-start VM's wait (params.requestValidForDuration, §4): PENDING exists only for a wait of 90 s or more
# (compute/docs/instances/instance-lifecycle); the largest accepted wait is 2 hours by several third-party flex-start
# tools (the Google page that states it could not be read: UNVERIFIED). tpuctl waits 1 hour unless told.
FLEX_WAIT_DEFAULT, FLEX_WAIT_MIN, FLEX_WAIT_MAX = 3600, 90, 7200


def image(family: str) -> str:
    return f"projects/{IMAGE_PROJECT}/global/images/family/{IMAGE_FAMILIES[family]}"


def template_name(node: str) -> str:
    """One template per slice (MIG): each carries its slice's number (`tpuctl-slice` metadata), which the host's
    start-up script reads where Google's tpu-env has no MEGASCALE_SLICE_ID (a Multislice of MIGs is tpuctl's own)."""
    return f"{node}-template"


def policy_name(node: str) -> str:
    """One workload policy per multi-host slice (MIG), none for a single-host one, as xpk (a policy only for a slice
    of more than one VM) and vllm-project/ci-infra's TPU7x modules (one per multi-host slice) do: GCE_TPU_FACTS
    "Corrections". A single host is a VM with no ICI to another (about-workload-policies asks for one for multi-host
    MIGs only)."""
    return f"{node}-wp"


def policy_names(spec: ClusterSpec) -> list[str]:
    """The workload policies the cluster makes: one per slice of several hosts."""
    return [policy_name(n) for n in spec.node_names] if multi_host(spec) else []


def policies_to_delete(spec: ClusterSpec) -> list[str]:
    """What `down` looks for: each slice's, and the one policy a cluster made before issue 59 (named for the cluster,
    `tpuctl-NAME-wp`: the same name as a single slice's)."""
    return list(dict.fromkeys([policy_name(n) for n in spec.node_names] + [policy_name(spec.tpu_name)]))


def multi_host(spec: ClusterSpec) -> bool:
    return bool(spec.tpu_type) and shape_of(spec).vms > 1


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


# What `up` reads to tell the two kinds of reservation apart (gce.ComputeTpus.reservation_bound), as the dry run says it
RESERVATION_CHECK = ("read at up: a calendar-mode or dense one is RESERVATION_BOUND, any other STANDARD with a "
                     "SPECIFIC affinity")


def check_reservation(value: str) -> str:
    """--reservation: a reservation of the project (its name) or one shared with it from another
    (`projects/P/reservations/R`, the value gcloud's --reservation takes for a shared reservation, §2
    reservationAffinity)."""
    from ....core.models import check_gce_name, check_project
    parts = value.split("/")
    if len(parts) == 4 and parts[0] == "projects" and parts[2] == "reservations":
        check_project(parts[1])
        check_gce_name(parts[3], "--reservation")
        return value
    return check_gce_name(value, "--reservation")


def reservation_parts(spec: ClusterSpec) -> tuple[str, str]:
    """(project, name) of --reservation: a shared one's own project, else the cluster's."""
    parts = spec.reservation.split("/")
    return (parts[1], parts[3]) if len(parts) == 4 else (spec.project, spec.reservation)


# A flex-start MIG's VMs end at maxRunDuration, and a MIG whose VMs are gone makes them again to reach its target
# size (issue 59): the host's own deadline (--max-duration: it deletes the MIG, teardown.py) must come first, so
# Google's run duration is set this much later, within the 7-day maximum. At --max-duration 7d there is no room left:
# the two coincide (docs/compute-engine.md says so).
FLEX_MIG_GRACE = 900


def build_scheduling(spec: ClusterSpec, mig: bool = False) -> Any:
    """TERMINATE on host maintenance (TPU VMs cannot live-migrate, §2); SPOT with the STOP action Google's TPU Spot
    template uses (tpu/docs/spot-compute); FLEX_START with maxRunDuration and DELETE; RESERVATION_BOUND with DELETE
    ("DELETE is a required parameter for RESERVATION_BOUND + MIG", §3), only for a reservation in calendar mode or
    of the dense deployment type ("a specific reservation with either a calendar reservation mode or a dense
    deployment type", gcloud command_lib/compute/instances/flags.py); any other reservation is consumed by a
    STANDARD VM with the SPECIFIC affinity alone."""
    from google.cloud import compute_v1 as c
    s = c.Scheduling(on_host_maintenance="TERMINATE")
    if spec.spot:
        s.provisioning_model, s.instance_termination_action, s.automatic_restart = "SPOT", "STOP", False
    elif spec.flex_start:
        s.provisioning_model, s.instance_termination_action = "FLEX_START", "DELETE"
        s.max_run_duration = c.Duration(seconds=min(spec.max_duration + FLEX_MIG_GRACE, FLEX_MAX_SECONDS) if mig
                                        else spec.max_duration)
    elif spec.reservation and spec.reservation_bound:
        s.provisioning_model, s.instance_termination_action = "RESERVATION_BOUND", "DELETE"
    return s


def _common(spec: ClusterSpec, zone: str, script: str, service_account: str, labels: dict[str, str],
            slice_id: int = 0, template: bool = False) -> dict:
    """What a TPU VM and a template's properties share. The boot disk's type is a URL on an instance and the bare
    name in a template (compute_v1 AttachedDiskInitializeParams.disk_type: "When creating a single instance, you
    must provide either the full or partial URL ... When creating an instance template ... without a URL")."""
    from google.cloud import compute_v1 as c
    t = tpu_type(spec.tpu_type)
    kind = disk_type(spec)
    nic: dict[str, Any] = dict(network_of(spec, zone))
    if not spec.internal_ips:   # --internal-ips: no access config is no external address (Cloud NAT for egress)
        nic["access_configs"] = [c.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    if t.family == "tpu7x":   # gVNIC, as the live TPU7x configurations set it (vllm-project/ci-infra; §"Corrections")
        nic["nic_type"] = "GVNIC"
    out: dict[str, Any] = dict(
        labels={**labels, ROLE_LABEL: "tpu"}, description=description(spec),
        disks=[c.AttachedDisk(boot=True, auto_delete=True, initialize_params=c.AttachedDiskInitializeParams(
            source_image=image(t.family), disk_size_gb=spec.disk_size or DISK_GB,
            disk_type=kind if template else
            f"https://www.googleapis.com/compute/v1/projects/{spec.project}/zones/{zone}/diskTypes/{kind}"))],
        network_interfaces=[c.NetworkInterface(**nic)],
        service_accounts=[c.ServiceAccount(email=service_account or "default", scopes=SCOPES)],
        metadata=c.Metadata(items=[c.Items(key="startup-script", value=script),
                                   c.Items(key="tpuctl-slice", value=str(slice_id))]),
        scheduling=build_scheduling(spec, mig=template))
    if shape_of(spec).machine_type == "ct6e-standard-8t":   # "CT6e 8-chip VMs require single-threaded cores" (§2)
        out["advanced_machine_features"] = c.AdvancedMachineFeatures(threads_per_core=1)
    if spec.reservation:   # gcloud's key for --reservation (§2 reservationAffinity)
        out["reservation_affinity"] = c.ReservationAffinity(
            consume_reservation_type="SPECIFIC_RESERVATION", key="compute.googleapis.com/reservation-name",
            values=[spec.reservation])
    elif spec.flex_start:   # Google's flex-start REST example sends it beside FLEX_START (ai-hypercomputer/docs/
        # create/create-vm; §4): flex-start capacity is never a reservation's
        out["reservation_affinity"] = c.ReservationAffinity(consume_reservation_type="NO_RESERVATION")
    return out


def build_instance(spec: ClusterSpec, zone: str, script: str, service_account: str, labels: dict[str, str]) -> Any:
    """Instance.machineType is a zonal partial URL (§2)."""
    from google.cloud import compute_v1 as c
    vm = c.Instance(name=spec.tpu_name, machine_type=f"zones/{zone}/machineTypes/{shape_of(spec).machine_type}",
                    **_common(spec, zone, script, service_account, labels))
    if spec.flex_start:   # the wait for capacity: InstanceParams.request_valid_for_duration, "Relevant only for
        # Instances.Insert API" (compute_v1); PENDING only for a wait of 90 s or more (instance-lifecycle, §4)
        vm.params = c.InstanceParams(request_valid_for_duration=c.Duration(
            seconds=spec.flex_wait or FLEX_WAIT_DEFAULT))
    return vm


def build_template(spec: ClusterSpec, node: str, zone: str, script: str, service_account: str,
                   labels: dict[str, str]) -> Any:
    """InstanceProperties.machineType takes the bare name only: a URL there is an INTERNAL_ERROR (§2)."""
    from google.cloud import compute_v1 as c
    common = _common(spec, zone, script, service_account, labels, spec.node_names.index(node), template=True)
    return c.InstanceTemplate(name=template_name(node), description=description(spec),
                              properties=c.InstanceProperties(machine_type=shape_of(spec).machine_type, **common))


def build_policy(spec: ClusterSpec, node: str) -> Any:
    from google.cloud import compute_v1 as c
    return c.ResourcePolicy(name=policy_name(node), description=description(spec),
                            workload_policy=c.ResourcePolicyWorkloadPolicy(
                                type_="HIGH_THROUGHPUT", accelerator_topology=shape_of(spec).topology))


def is_mig(spec: ClusterSpec) -> bool:
    """Whether the cluster is MIGs (a multi-host slice, or a Multislice) rather than one bare VM; a cluster rebuilt
    from a template or policy alone (no type known) counts as MIGs."""
    return not spec.tpu_type or shape_of(spec).vms > 1 or spec.slices > 1


def bulk(spec: ClusterSpec) -> bool:
    """Bulk mode ("creates VMs all at once") "supports the reservation-bound and flex-start provisioning models" only;
    with flex-start, repairs must be off (about-bulk-mode, §3)."""
    return spec.flex_start or (bool(spec.reservation) and spec.reservation_bound)


def build_mig(spec: ClusterSpec, name: str, zone: str) -> Any:
    from google.cloud import compute_v1 as c
    mig = c.InstanceGroupManager(
        name=name, description=description(spec), base_instance_name=name, target_size=shape_of(spec).vms,
        instance_template=f"projects/{spec.project}/global/instanceTemplates/{template_name(name)}")
    if multi_host(spec):
        mig.resource_policies = c.InstanceGroupManagerResourcePolicies(
            workload_policy=f"projects/{spec.project}/regions/{region_of(zone)}/resourcePolicies/{policy_name(name)}")
    if bulk(spec):
        mig.target_size_policy = c.InstanceGroupManagerTargetSizePolicy(mode="BULK")
        mig.instance_lifecycle_policy = c.InstanceGroupManagerInstanceLifecyclePolicy(
            default_action_on_failure="DO_NOTHING")
    return mig


def teardown_list(spec: ClusterSpec) -> list[str]:
    if spec.tpu_type and not is_mig(spec):
        return [f"VM {spec.tpu_name}"]
    return [f"MIG {n} and its VMs" for n in spec.node_names] + [f"instance template {template_name(n)}"
                                                                for n in spec.node_names] \
        + [f"workload policy {p}" for p in (policy_names(spec) if spec.tpu_type else policies_to_delete(spec))]


FLEX_MAX_SECONDS = 7 * 86400   # "The run duration must be between 10 minutes and 7 days" (about-resize-requests, §4)
FLEX_MIN_SECONDS = 600


def compute_flags(flags: Any, family: str, api: str) -> dict[str, Any]:
    """--flex-wait, --disk-size, --disk-type, --internal-ips (UpFlags) checked: the ClusterSpec fields they set.
    Each is Compute Engine's own; without --api compute it is refused, not ignored."""
    from ....core.errors import bad_input
    from ....core.lifecycle import parse_duration
    given = [f for f, v in (("--flex-wait", flags.flex_wait), ("--disk-size", flags.disk_size),
                            ("--disk-type", flags.disk_type), ("--internal-ips", flags.internal_ips)) if v]
    if not api:
        if given:
            raise bad_input(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --api compute only",
                            "add --api compute, or leave them out")
        return {}
    out: dict[str, Any] = {"internal_ips": bool(flags.internal_ips)}
    if flags.disk_type:
        if flags.disk_type not in DISK_TYPES[family]:
            raise bad_input(f"--disk-type {flags.disk_type}: a {family} VM's boot disk is one of "
                            f"{', '.join(DISK_TYPES[family])} (tpu/docs/storage-options-compute)",
                            f"use --disk-type {DISK_TYPES[family][0]}, or leave it out")
        out["disk_type"] = flags.disk_type
    if flags.disk_size is not None:
        low, high = DISK_GB_RANGE
        if not low <= flags.disk_size <= high:
            raise bad_input(f"--disk-size {flags.disk_size}: a boot disk is {low} to {high} GB",
                            f"for example --disk-size {DISK_GB * 2}")
        out["disk_size"] = flags.disk_size
    if flags.flex_wait:
        if not flags.flex_start:
            raise bad_input("--flex-wait is how long a --flex-start VM waits for capacity", "add --flex-start")
        wait = parse_duration(flags.flex_wait, "--flex-wait")
        if not FLEX_WAIT_MIN <= wait <= FLEX_WAIT_MAX:
            raise bad_input(f"--flex-wait is from {FLEX_WAIT_MIN}s (a shorter wait is no wait: compute/docs/"
                            f"instances/instance-lifecycle) to {FLEX_WAIT_MAX // 3600}h",
                            "for example --flex-wait 1h")
        out["flex_wait"] = wait
    elif flags.flex_start:
        out["flex_wait"] = FLEX_WAIT_DEFAULT
    return out


def disk_type(spec: ClusterSpec) -> str:
    return spec.disk_type or DISK_TYPES[tpu_type(spec.tpu_type).family][0]


def check_capacity_flags(spec: ClusterSpec) -> None:
    """--flex-start needs --max-duration: a flex-start VM's maxRunDuration, which Google enforces (§4)."""
    from ....core.errors import bad_input
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
    # iam.serviceAccounts.actAs (the VMs run as a service account: Service Account User, which the multi-host
    # quickstart asks for beside Compute Instance Admin) is asked on every path by permissions.check, as a warning
    # only, since a grant on the service account itself would do
    if spec.reservation:   # reservations.get and futureReservations.list (gce.ComputeTpus.reservation_bound)
        names = ["compute.reservations.get"]
    else:
        names = []
    if not is_mig(spec):
        names += ["compute.instances.create", "compute.instances.delete"]
    else:
        names += [f"compute.{r}.{v}" for r in ("instanceTemplates", "instanceGroupManagers", "resourcePolicies")
                  for v in ("create", "delete")]
        names.append("compute.instanceTemplates.useReadOnly")   # a MIG made from a template (compute/docs/access/iam)
    return {n: role for n in names}
