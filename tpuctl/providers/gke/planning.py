"""Planning half of the GKE provider: `up --provider gke`'s flags validated offline into a ClusterSpec, the names of
what it makes, the plan and its price. Nothing here calls an API except the project lookup every provider makes.

What `up` makes (or adopts) for cluster NAME, in ZONE's region:
  GKE cluster  tpuctl-NAME (zonal, in ZONE), or the cluster named by --gke-cluster, adopted and never deleted
  node pool    tpuctl-NAME-np-K, one per slice, of the type's TPU machine type (tputypes.py)
  policy       tpuctl-NAME-wp, a Compute Engine workload policy, for TPU7x multi-host slices only
  bucket       as for --provider gcp, with grants on the bucket only for the node pools' service account
"""
from __future__ import annotations

import re

from ...core.catalog import VM_PRICES, check_zones, region_of, tpu_type
from ...core.config import setting
from ...core.errors import TpuctlError, bad_input
from ...core.models import (ClusterSpec, ProviderName, check_bucket_name, check_gce_name, check_project,
                            check_service_account, default_bucket)
from ..base import PlanRow, Price, UpFlags, do_not_apply
from ..google import project
from .frameworks import check_cluster
from .kueue import check_namespace
from .tputypes import TPU7X_MIN_GKE_VERSION, SliceShape, shape

# GKE charges a cluster management fee of $0.10 per cluster per hour, whatever its size (the free tier's monthly
# credit covers one zonal or Autopilot cluster per billing account): cloud.google.com/kubernetes-engine/pricing.
MANAGEMENT_FEE = 0.10
# A cluster tpuctl makes has one small CPU node for what is not a TPU workload: kube-system and the JobSet
# controller (its Deployment asks for CPU and memory on a non-TPU node: kubernetes-sigs/jobset config/components/
# manager). e2-standard-4's price is core/catalog.py's VM_PRICES (us-central1).
SYSTEM_MACHINE = "e2-standard-4"
SYSTEM_POOL = "system"
MAX_SLICES = 64   # a bound on what one `up` makes; GKE's own limit is the project's TPU quota
# Names of GKE clusters and node pools: lowercase letters, digits and hyphens, a letter first, at most 40
# characters (gcloud container clusters create: "must be 1-40 characters ... start with a letter").
_GKE_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
# A container image reference: [registry[:port]/]path[:tag][@sha256:digest] (distribution/reference's grammar,
# loosely: no spaces, no upper case in the path).
_IMAGE_RE = re.compile(r"^[a-z0-9]([a-z0-9._:-]*[a-z0-9])?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*(:[\w][\w.-]{0,127})?"
                       r"(@sha256:[0-9a-f]{64})?$")
_NOT_ON_GKE = {"arch": "--arch", "runtime": "--runtime", "vm_type": "--vm-type", "queued": "--queued",
               "valid_until": "--valid-until", "flex_start": "--flex-start"}


def cluster_name(spec: ClusterSpec) -> str:
    return spec.gke_cluster or spec.tpu_name


def pool_names(spec: ClusterSpec) -> list[str]:
    return spec.node_names   # tpuctl-NAME-np-K (core/models.py)


def policy_name(spec: ClusterSpec) -> str:
    """The workload policy (TPU7x multi-host), "" when the type needs none (or is not known: a cluster rebuilt
    from labels whose record is gone)."""
    return f"{spec.tpu_name}-wp" if spec.tpu_type and shape(spec.tpu_type).needs_workload_policy else ""


def permissions_needed(spec: ClusterSpec) -> dict[str, str]:
    """Project-level permissions `up` and `down` need, each with a predefined role that carries it
    (cloud.google.com/iam/docs/understanding-roles: Kubernetes Engine Admin carries container.*, and full access to
    the cluster's Kubernetes API, which installing JobSet's CRD needs; Compute Admin carries compute.*). Making a
    node pool is an update of its cluster (container.clusters.update: kubernetes-engine/docs/how-to/iam)."""
    need = {p: "roles/container.admin" for p in ("container.clusters.create", "container.clusters.delete",
                                                 "container.clusters.get", "container.clusters.update",
                                                 "container.operations.get")}
    if spec.gke_cluster:
        del need["container.clusters.create"], need["container.clusters.delete"]
    if policy_name(spec):
        need.update({"compute.resourcePolicies.create": "roles/compute.admin",
                     "compute.resourcePolicies.delete": "roles/compute.admin"})
    return need


def make_spec(name: str, flags: UpFlags) -> ClusterSpec:
    given = [flag for attr, flag in _NOT_ON_GKE.items() if getattr(flags, attr) not in (None, False, "", [])]
    if given:
        raise bad_input(do_not_apply(given, "--provider gke"),
                        "GKE picks the node image; give --type, --zone, [--slices, --spot, --gke-cluster, --image]")
    if not flags.tpu_type:
        raise bad_input("--type is required", "for example: tpuctl up --provider gke --type v6e-16 --zone us-east5-b")
    s = shape(flags.tpu_type)
    zone = _zone(s, flags.zones)
    slices = _slices(s, flags.slices)
    proj = check_project(project.resolve(flags.project))
    if flags.kube_context:
        from .kube import check_context
        check_context(flags.kube_context)
    if flags.gke_cluster and not _GKE_NAME_RE.match(flags.gke_cluster):
        raise bad_input(f"invalid --gke-cluster {flags.gke_cluster!r}",
                        "a GKE cluster name is 1-40 lowercase letters, digits or hyphens, starting with a letter")
    if flags.reservation:
        check_gce_name(flags.reservation, "--reservation")
        if flags.spot:   # one capacity type per node pool, as xpk's --reservation/--spot/--on-demand (core/capacity.py)
            raise bad_input("--spot and --reservation exclude each other: spot nodes use no reservation",
                            "pick one")
    if flags.gke_cluster and (flags.network or flags.subnetwork):
        raise bad_input("--network and --subnetwork are for a cluster `up` makes; --gke-cluster's has its own",
                        "leave them out with --gke-cluster")
    if flags.image and not _IMAGE_RE.match(flags.image):
        raise bad_input(f"invalid --image {flags.image!r}", "for example us-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG")
    framework = check_cluster(flags.framework)
    return ClusterSpec(
        name=name, provider=ProviderName.GKE, project=proj, tpu_type=s.tpu_type, zones=[zone], spot=flags.spot,
        store="gs://" + check_bucket_name(flags.bucket or default_bucket(proj, name)), slices=slices,
        service_account=check_service_account(flags.service_account) if flags.service_account else "",
        framework=framework, gke_cluster=flags.gke_cluster or "", image=flags.image or "",
        reservation=flags.reservation or "", kube_context=flags.kube_context or "",
        kueue=flags.kueue, namespace="" if flags.namespace in (None, "", "default") else check_namespace(flags.namespace),
        network=check_gce_name(flags.network, "--network") if flags.network else "",
        subnetwork=check_gce_name(flags.subnetwork, "--subnetwork") if flags.subnetwork else "")


def _zone(s: SliceShape, zones: list[str]) -> str:
    """One zone: the node pools live there (a slice's nodes are in one zone; a failover to another zone would
    need another cluster). Checked against the catalog's zones, TPU7x's too, as the Compute Engine path checks them
    (issue 63.6)."""
    given = [z.strip() for item in zones for z in item.split(",") if z.strip()]
    if not given and setting("zone", None):
        given = [str(setting("zone", None))]
    if len(set(given)) > 1:
        raise bad_input(f"--provider gke takes one --zone, not {', '.join(given)}",
                        "the cluster's TPU node pools live in one zone: pick one")
    if s.family == "tpu7x" and not given:
        raise bad_input("no zone given", "add --zone, a zone that offers TPU7x (e.g. us-central1-c)")
    t = tpu_type(s.tpu_type)
    zone = check_zones(t, given)[0]
    if zone not in t.zones:
        raise bad_input(f"{s.tpu_type} is not offered in {zone}", "it is offered in " + ", ".join(t.zones))
    return zone


def _slices(s: SliceShape, slices: int | None) -> int:
    """Multislice on GKE needs multi-host node pools of one type, size and topology
    (kubernetes-engine/docs/how-to/tpu-multislice)."""
    if slices is None or slices == 1:
        return 1
    if not 1 <= slices <= MAX_SLICES:
        raise bad_input(f"--slices {slices} is out of range", f"give 1 to {MAX_SLICES}")
    if not s.multi_host:
        raise bad_input(f"--slices: GKE Multislice needs multi-host slices; {s.tpu_type} is one host",
                        f"pick a larger type (e.g. {s.family}-16), or one slice without --slices")
    return slices


def tpu_hourly(spec: ClusterSpec) -> float | None:
    """$/hour of one slice, from core/catalog.py (GKE bills the TPU nodes as the TPU type: kubernetes-engine/
    pricing, "TPU ... billed at the Compute Engine / Cloud TPU rates"); None where the catalog has no price."""
    try:
        t = tpu_type(spec.tpu_type)
    except TpuctlError:
        return None   # tpu7x: no published price tpuctl carries
    return t.spot_price_hour if spec.spot else t.price_hour


# Each node's boot disk is billed as a persistent disk beside the node (kubernetes-engine/pricing: nodes are billed
# as Compute Engine instances, their disks as persistent disks); its size and type are GKE's defaults, which tpuctl
# does not set, so the price names them rather than guess an amount (issue 49 item 8).
BOOT_DISKS = "; the nodes' boot disks (GKE's default size and type) are billed as persistent disks, not counted"


def price(spec: ClusterSpec) -> Price:
    fixed = 0.0 if spec.gke_cluster else MANAGEMENT_FEE + VM_PRICES[SYSTEM_MACHINE]
    fee = ("" if spec.gke_cluster else (f"; with the GKE management fee (${MANAGEMENT_FEE:.2f}/hour) and the system "
                                        f"node (${VM_PRICES[SYSTEM_MACHINE]:.3f}/hour)")) + BOOT_DISKS
    one = tpu_hourly(spec)
    if one is None:
        what = f"{spec.tpu_type} has no {'spot ' if spec.spot else ''}price in tpuctl's catalog"
        return Price(None, f"unknown: {what} (cloud.google.com/tpu/pricing){fee}")
    total = one * spec.slices + fixed
    pools = f"{spec.slices} node pool{'s' * (spec.slices > 1)} at ${one:.2f}{' (spot)' if spec.spot else ''}"
    return Price(total, f"${total:.2f}/hour: {pools}{fee}")


def plan(spec: ClusterSpec) -> list[PlanRow]:
    s = shape(spec.tpu_type)
    zone = spec.zones[0]
    rows = [PlanRow("gke", spec.gke_cluster, "existing cluster, adopted (down leaves it)") if spec.gke_cluster else
            PlanRow("gke", spec.tpu_name, f"new Standard cluster in {zone}, one {SYSTEM_MACHINE} system node; "
                                          f"${MANAGEMENT_FEE:.2f}/hour management fee"
                                          + (f"; version >= {TPU7X_MIN_GKE_VERSION}" if s.family == "tpu7x" else "")
                                          + (f"; network {spec.network}" if spec.network else "")
                                          + (f", subnetwork {spec.subnetwork}" if spec.subnetwork else ""))]
    wp = policy_name(spec)
    if wp:
        rows.append(PlanRow("policy", wp, f"workload policy HIGH_THROUGHPUT, topology {s.topology}, in "
                                          f"{region_of(zone)}"))
    shape_text = (f"{s.machine_type} x {s.hosts} ({spec.tpu_type}, {s.chips} chips, topology {s.topology}"
                  f"{', spot' if spec.spot else ''}{f', reservation {spec.reservation}' if spec.reservation else ''})")
    for k, pool in enumerate(pool_names(spec)):
        rows.append(PlanRow("pool", pool, f"{shape_text} in {zone}"
                            + (f", slice {k} of {spec.slices}" if spec.slices > 1 else "")))
    rows.append(PlanRow("jobset", "JobSet controller", "installed in the cluster if missing"))
    if spec.namespace:   # namespaces.py: made if missing; `down` deletes it only where tpuctl made it
        rows.append(PlanRow("namespace", spec.namespace, "the runs' Kubernetes namespace"
                            + (" and the LocalQueue's" if spec.kueue else "") + ", made if missing"
                            + ("; `down` removes it if tpuctl made it" if spec.gke_cluster else "")))
    if spec.kueue and spec.gke_cluster:   # issue 49 item 10: "(or adopts, when the user asks)": --kueue is the ask
        rows.append(PlanRow("kueue", "Kueue v0.17.8", "installed in the adopted cluster only if it has no Kueue (one "
                                                     "it has is left as it is: `submit --queue` uses its queues), "
                                                     f"with LocalQueue multislice-queue over {s.chips * spec.slices} "
                                                     "google.com/tpu; `down` leaves it (others may queue on it)"))
    elif spec.kueue:
        rows.append(PlanRow("kueue", "Kueue v0.17.8", "installed, with LocalQueue multislice-queue over "
                                                     f"{s.chips * spec.slices} google.com/tpu and xpk's priority "
                                                     "classes"))
    rows.append(PlanRow("bucket", spec.store, f"in {region_of(zone)}"))
    who = spec.service_account or "the Compute Engine default service account (the node pools' identity)"
    rows.append(PlanRow("grant", "storage.objectAdmin + storage.legacyBucketReader", f"on the bucket only, to {who}"))
    return rows
