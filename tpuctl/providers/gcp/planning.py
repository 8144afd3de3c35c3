"""Planning half of the Google Cloud provider: `up`'s flags validated into a ClusterSpec, the plan and its price.
The catalog's tables decide offline (see catalog.py for their sources); the one API call made here is read-only:
list_accelerator_types for a zone the table does not list, when there are credentials to ask with."""
from __future__ import annotations

from ...core.catalog import (COMPUTE_ONLY, DEFAULT_VM_TYPE, VM_PRICES, TpuType, check_runtime, check_vm_type,
                             check_zones, compute_shape, not_offered, region_of, tpu_type, unlisted)
from ...core import multislice
from ...core.config import setting
from ...core.errors import bad_input
from ...core.lifecycle import parse_duration, show_duration
from ...core.models import (Arch, ClusterSpec, Framework, ProviderName, check_bucket_name, check_project,
                            check_gce_name, check_service_account, default_bucket)
from ..base import PlanRow, Price, UpFlags
from ..google import clients, project
from .compute import gce_requests


def make_spec(name: str, flags: UpFlags) -> ClusterSpec:
    if not flags.tpu_type:   # the next step on Google Cloud, not another provider (issue 52)
        raise bad_input(f"--type is required for a Google Cloud TPU (cluster {name})",
                        f"name a type and a zone: `tpuctl up --type v5litepod-8 --zone us-west4-a -c {name}` "
                        "(add --dry-run to see the plan and its price first)")
    t = tpu_type(flags.tpu_type)
    api = _api(flags, t)
    gke_only = [f for f, v in (("--gke-cluster", flags.gke_cluster), ("--image", flags.image),
                               ("--reservation", flags.reservation if not api else None),
                               ("--kube-context", flags.kube_context), ("--kueue", flags.kueue),
                               ("--namespace", flags.namespace)) if v]
    if gke_only == ["--reservation"]:   # the Compute Engine path takes one too (issue 63.5: the hint names it)
        raise bad_input("--reservation applies to --api compute and --provider gke: the Cloud TPU API path takes "
                        "none", "add --api compute (its VMs consume the reservation), or drop --reservation")
    if gke_only:
        one = len(gke_only) == 1
        raise bad_input(f"{', '.join(gke_only)} appl{'ies' if one else 'y'} to --provider gke only"
                        + (" (--reservation also to --api compute)" if flags.reservation else ""),
                        f"a TPU VM runs the job on its own host: drop {'it' if one else 'them'}, or add --provider gke")
    try:
        arch = Arch(flags.arch or Arch.VM.value)
    except ValueError:
        raise bad_input(f"unknown --arch {flags.arch!r}", "use --arch vm (TPU VM, default) or --arch node (legacy)")
    if arch is Arch.NODE and not t.node_arch:
        raise bad_input(f"TPU Nodes (--arch node) were never offered for {t.family}", "use --arch vm")
    if api and arch is Arch.NODE:
        raise bad_input("--api compute makes TPU VMs: a TPU Node (--arch node) is the Cloud TPU API's only",
                        "leave --arch node out")
    try:
        framework = Framework(flags.framework or (Framework.JAX if t.family in gce_requests.NO_TENSORFLOW
                                                  else Framework.TENSORFLOW).value)
        if framework is Framework.KERAS:
            raise ValueError(framework)
    except ValueError:
        raise bad_input(f"unknown --framework {flags.framework!r}", "use tensorflow (default), jax or pytorch "
                        "(a Keras 3 job runs on either image: its backend follows the runtime)")
    if framework is Framework.TENSORFLOW and t.family in gce_requests.NO_TENSORFLOW:
        raise bad_input(f"Google offers no TensorFlow for {t.family} TPUs", "use --framework jax (Keras 3 jobs run "
                        "on JAX) or --framework pytorch")
    if arch is Arch.NODE and framework is not Framework.TENSORFLOW:
        raise bad_input("a TPU Node (--arch node) runs TensorFlow only", "use --arch vm for jax or pytorch")
    zones = [z.strip() for item in flags.zones for z in item.split(",") if z.strip()]
    if not zones and setting("zone", None):
        zones = [str(setting("zone", None))]
    zones = check_zones(t, zones)
    proj = check_project(project.resolve(flags.project))
    for zone in unlisted(t, zones):
        _ask_whether_offered(t, zone, proj, arch, api)
    if api and flags.runtime:
        raise bad_input("--runtime names a Cloud TPU API software version; a Compute Engine TPU VM boots Google's "
                        "TPU Ubuntu image and the agent installs the job's stack", "leave --runtime out")
    bucket = check_bucket_name(flags.bucket or default_bucket(proj, name))
    queued, valid_until = _queueing(flags, arch, api)
    compute_only = gce_requests.compute_flags(flags, t.family, api)
    if flags.slices is not None:
        multislice.check(flags.slices, t.family, arch is Arch.NODE, t.name)
        queued = not api   # through the TPU API a Multislice is had only through a queued resource
    return ClusterSpec(
        name=name, provider=ProviderName.GCP, store=f"gs://{bucket}", project=proj, tpu_type=t.name,
        zones=zones, arch=arch, runtime=check_runtime(flags.runtime, arch is Arch.NODE) if flags.runtime else "",
        spot=flags.spot,
        service_account=check_service_account(flags.service_account) if flags.service_account else "",
        framework=framework, queued=queued, valid_until=valid_until, slices=flags.slices or 1,
        vm_type=check_vm_type(flags.vm_type or DEFAULT_VM_TYPE) if arch is Arch.NODE else "",
        network=check_gce_name(flags.network, "--network") if flags.network else "",
        subnetwork=_subnetwork(flags, zones), create_firewall=flags.create_firewall, api=api,
        flex_start=flags.flex_start, **compute_only,
        reservation=gce_requests.check_reservation(flags.reservation) if flags.reservation else "")


def _api(flags: UpFlags, t: TpuType) -> str:
    """"compute" when the TPU is made as Compute Engine resources (--api compute, config key `api`, and always for
    the families only Compute Engine serves), else "" (the Cloud TPU API, still the default where it serves)."""
    asked = str(setting("api", flags.api) or "")
    if asked not in ("", "tpu", "compute"):
        raise bad_input(f"unknown --api {asked!r}", "use --api tpu (the Cloud TPU API) or --api compute "
                        "(Compute Engine VMs and MIGs)")
    if t.family in COMPUTE_ONLY:
        if asked == "tpu":
            raise bad_input(f"the Cloud TPU API does not serve {t.family} (tpu/docs/tpus-in-compute-engine)",
                            "leave --api out: tpuctl makes it through Compute Engine")
        asked = "compute"
    if asked == "compute":
        compute_shape(t)   # refuses the families Compute Engine does not serve
        return "compute"
    return ""


def _subnetwork(flags: UpFlags, zones: list[str]) -> str:
    """A subnetwork is regional (cloud.google.com/vpc/docs/subnets): every zone tried must be in one region."""
    if not flags.subnetwork:
        return ""
    regions = sorted({region_of(z) for z in zones})
    if len(regions) > 1:
        raise bad_input(f"--subnetwork {flags.subnetwork} lies in one region, and --zone spans {', '.join(regions)}",
                        "give zones of the subnetwork's region only")
    return check_gce_name(flags.subnetwork, "--subnetwork")


def _queueing(flags: UpFlags, arch: Arch, api: str) -> tuple[bool, int]:
    """--queued [--valid-until D]; --flex-start is refused: google-cloud-tpu (v2 and v2alpha1, 1.28) has no
    provisioning model or maximum run duration field, only `gcloud alpha compute tpus queued-resources create
    --provisioning-model=flex-start --max-run-duration` does (cloud.google.com/tpu/docs/request-using-flex-start),
    and a request tpuctl cannot express would be a deadline shown that Google does not enforce. Through Compute
    Engine (--api compute) flex-start is a provisioning model of the VMs themselves (gce.py), and --queued has no
    meaning there: a flex-start VM or bulk MIG waits for capacity itself."""
    if api:
        if flags.queued or flags.valid_until:
            raise bad_input("--queued and --valid-until ask the Cloud TPU API's queued resources",
                            "with --api compute, use --flex-start --max-duration D: the VMs wait for capacity")
        if flags.flex_start and flags.spot:
            raise bad_input("--flex-start and --spot are two provisioning models: pick one", "drop one of them")
        if flags.reservation and (flags.flex_start or flags.spot):
            raise bad_input("--reservation consumes a reservation's capacity: not with --flex-start or --spot",
                            "drop --reservation, or the other flag")
        return False, 0
    if flags.flex_start:
        raise bad_input("--flex-start needs --api compute: the installed google-cloud-tpu client exposes no "
                        "Flex-start provisioning model or maximum run duration",
                        "add --api compute (v6e, v5p, tpu7x), or use --queued with --max-duration")
    valid_until = parse_duration(flags.valid_until, "--valid-until") if flags.valid_until else 0
    if valid_until and not flags.queued:
        raise bad_input("--valid-until applies to queued requests only", "add --queued, or leave --valid-until out")
    if flags.queued and arch is Arch.NODE:
        raise bad_input("a TPU Node (--arch node) cannot be queued", "use --arch vm with --queued")
    return flags.queued, valid_until


def _ask_whether_offered(t: TpuType, zone: str, proj: str, arch: Arch, api: str) -> None:
    """A zone missing from the table may be newer than it: the TPU API knows (Compute Engine's machineTypes.get
    for --api compute: "the live catalog is the truth", GCE_TPU_FACTS §1), if we can ask it."""
    if not clients.has_credentials():
        raise not_offered(t, zone)
    if api:
        from ..google.operations import get_or_none
        if get_or_none(clients.compute("MachineTypesClient").get, project=proj, zone=zone,
                       machine_type=compute_shape(t).machine_type, what=f"get machine type in {zone}") is None:
            raise not_offered(t, zone)
        return
    from .tpuapi.tpu import TpuApi
    if t.name not in TpuApi(proj, arch).accelerator_types(zone):
        raise not_offered(t, zone)


def price(spec: ClusterSpec) -> Price:
    t = tpu_type(spec.tpu_type)
    p = t.spot_price_hour if spec.spot else t.price_hour
    if p is None:
        # the words GKE's plan uses (providers/gke/planning.py): one TPU7x, one line, on either path (issue 63.6)
        return Price(None, f"unknown: {spec.tpu_type} has no {'spot ' if spec.spot else ''}price in tpuctl's catalog "
                     "(cloud.google.com/tpu/pricing)")
    if spec.flex_start:   # "discounts (up to 53%)" (GCE_TPU_FACTS §8): the on-demand rate is the most it costs
        return Price(p * spec.slices, f"at most ${p * spec.slices:.2f}/hour (flex-start: up to 53% less)")
    total = p * spec.slices + (VM_PRICES.get(spec.vm_type, 0.0) if spec.arch is Arch.NODE else 0.0)
    return Price(total, f"${total:.2f}/hour" + (f" ({spec.slices} slices at ${p:.2f})" if spec.slices > 1 else "")
                 + (" (spot)" if spec.spot else ""))


def plan(spec: ClusterSpec) -> list[PlanRow]:
    if spec.api:
        return _compute_plan(spec) + _store_rows(spec)
    where = " or ".join(spec.zones)
    t = tpu_type(spec.tpu_type)
    shape = (f"{spec.tpu_type} ({t.chips} chips, {t.hosts} host{'s' * (t.hosts > 1)}, "
             f"{'TPU VM' if spec.arch is Arch.VM else 'TPU Node'}{', spot' if spec.spot else ''})")
    rows = [PlanRow("tpu", name, f"{shape} in {where}" + (f", slice {k} of {spec.slices}" if spec.slices > 1 else ""))
            for k, name in enumerate(spec.node_names)]
    if spec.queued:
        until = f", waiting at most {show_duration(spec.valid_until)}" if spec.valid_until else ""
        what = f"one Multislice request for all {spec.slices}" if spec.slices > 1 else "a queued request for it"
        rows.insert(0, PlanRow("queued", spec.qr_name, f"{what}{until}"))
    if spec.arch is Arch.NODE:
        rows.append(PlanRow("vm", spec.vm_name, f"{spec.vm_type} beside the TPU Node"))
    return rows + _store_rows(spec)


def _compute_plan(spec: ClusterSpec) -> list[PlanRow]:
    """Through Compute Engine (gce.py): one VM, or per slice an instance template and a MIG, and one workload
    policy; the provisioning model and what it means."""
    t, shape = tpu_type(spec.tpu_type), gce_requests.shape_of(spec)
    where = " or ".join(spec.zones)
    model = ("spot: preempted VMs are deleted and made again" if spec.spot else
             f"flex-start: waits for capacity{_flex_wait(spec)}, deleted after {show_duration(spec.max_duration)}"
             if spec.flex_start
             else f"reservation {spec.reservation} ({gce_requests.RESERVATION_CHECK})" if spec.reservation
             else "on demand")
    head = f"{spec.tpu_type} ({t.chips} chips) through Compute Engine, {model}, in {where}"
    disk = (f", boot disk {spec.disk_size or gce_requests.DISK_GB} GB {gce_requests.disk_type(spec)}"
            + (", no external IP" if spec.internal_ips else ""))
    if not gce_requests.is_mig(spec):
        return [PlanRow("vm", spec.tpu_name, f"{head}: one {shape.machine_type} VM, image "
                        f"{gce_requests.IMAGE_FAMILIES[t.family]}{disk}")]
    rows = []
    for k, name in enumerate(spec.node_names):
        if gce_requests.multi_host(spec):
            rows.append(PlanRow("policy", gce_requests.policy_name(name),
                                f"workload policy HIGH_THROUGHPUT, topology {shape.topology}"))
        rows.append(PlanRow("template", gce_requests.template_name(name), f"{shape.machine_type}, image "
                            f"{gce_requests.IMAGE_FAMILIES[t.family]}{disk}"))
        rows.append(PlanRow("mig", name, f"{head}: {shape.vms} VMs"
                            + (" made all at once (bulk)" if gce_requests.bulk(spec) else
                               " (bulk if the reservation is calendar-mode or dense)" if spec.reservation else "")
                            + (f", slice {k} of {spec.slices}" if spec.slices > 1 else "")))
    return rows


def _flex_wait(spec: ClusterSpec) -> str:
    """A single flex-start VM's wait (--flex-wait), after which Google deletes it; a MIG's bulk request waits on."""
    wait = spec.flex_wait or gce_requests.FLEX_WAIT_DEFAULT
    return "" if gce_requests.is_mig(spec) else f" up to {show_duration(wait)}"


def _store_rows(spec: ClusterSpec) -> list[PlanRow]:
    rows = []
    regions = sorted({region_of(z) for z in spec.zones})
    rows.append(PlanRow("bucket", spec.store,
                        f"in {regions[0] if len(regions) == 1 else 'the region the TPU lands in'}"))
    who = spec.service_account or ("the Compute Engine default service account" if spec.arch is Arch.VM
                                   else "the TPU service agent and the VM's account")
    rows.append(PlanRow("grant", "storage.objectAdmin + storage.legacyBucketReader", f"on the bucket only, to {who}"))
    return rows
