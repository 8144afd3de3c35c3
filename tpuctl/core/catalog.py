"""TPU facts (types, chips, hosts, zones, prices) and the offline validation done before any mutating API call.

Zones: Google's "TPU regions and zones" page (cloud.google.com/tpu/docs/regions-zones, read 2026-11), pods
included: v2 and v3 slices of more than one host live in fewer zones than their 8-core types. AI zones
(`us-central1-ai1a`, ...) belong to their region (docs: "About AI zones"); one in a region where the family is
offered passes offline. Prices: ../shared/GCP_FACTS.md §2 (us-central1 on-demand per chip-hour, SkyPilot's catalog).
A zone the table does not list is not refused offline when credentials exist: the TPU API's
list_accelerator_types decides (providers/gcp/planning.py), so a new zone never needs a tpuctl release.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .backends import is_tpu_type as is_tpu_type   # defined where the host (its wheel has no catalog) reads it
from .errors import TpuctlError, bad_input

# family -> (named by cores?, valid sizes, single-host zones, multi-host zones, on-demand $/chip-hour or None,
#            spot $/chip-hour or None, TPU Node arch?)
_FAMILIES: dict[str, tuple[bool, tuple[int, ...], tuple[str, ...], tuple[str, ...], float | None, float | None,
                           bool]] = {
    "v2": (True, (8, 32, 128, 256, 512), ("us-central1-b", "us-central1-c", "europe-west4-a", "asia-east1-c"),
           ("us-central1-a", "europe-west4-a"), 1.125, None, True),
    "v3": (True, (8, 32, 64, 128, 256, 512, 1024, 2048), ("us-central1-a", "us-central1-b", "europe-west4-a"),
           ("europe-west4-a",), 2.00, 0.51, True),
    "v4": (True, tuple(2 ** i for i in range(3, 13)), ("us-central2-b",), ("us-central2-b",), 3.22, None, False),
    "v5p": (True, tuple(2 ** i for i in range(3, 14)), ("us-central1-a", "us-east5-a", "europe-west4-b"),
            ("us-central1-a", "us-east5-a", "europe-west4-b"), 4.20, None, False),
    "v5litepod": (False, (1, 4, 8, 16, 32, 64, 128, 256),
                  ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a", "europe-west4-b"),
                  ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a", "europe-west4-b"), 1.20, 0.245, False),
    "v6e": (False, (1, 4, 8, 16, 32, 64, 128, 256),
            ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a", "asia-northeast1-b",
             "us-central1-ai1a", "us-south1-ai1b"),
            ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a", "asia-northeast1-b",
             "us-central1-ai1a", "us-south1-ai1b"), 2.70, 0.544, False),
    # TPU7x (Ironwood): Compute Engine or GKE only ("New hardware generations starting with TPU7x (Ironwood) are
    # supported only through Compute Engine or GKE", tpu/docs/tpus-in-compute-engine). Named by TensorCores, two a
    # chip, as v5p (tpu7x-16 is 2x2x2, 8 chips, two 4-chip VMs: vllm-project/ci-infra `accelerator_type = "tpu7x-16"`
    # with `instance_count = 2`); zones from tpu/docs/regions-zones (../shared/GCE_TPU_FACTS.md §1). No price was
    # found in a Google source: the plan says so rather than guess.
    "tpu7x": (True, tuple(2 ** i for i in range(3, 14)), ("us-central1-c", "us-central1-ai1a"),
              ("us-central1-c", "us-central1-ai1a"), None, None, False),
}
_AI_ZONE_RE = re.compile(r"-ai\d+[a-z]?$")

_TYPE_RE = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e|tpu7x)-(\d+)$")
# TPU software versions as cloud.google.com/tpu/docs/runtimes names them: TPU VM images `tpu-vm-tf-x.y.z[-pod]
# [-{device_api}][-...]`, `tpu-vm-base`, `tpu-vm-pt-x.y`, `tpu-vm-v4-base`, `tpu-ubuntu2204-base`, `v2-alpha-tpuv5`,
# `v2-alpha-tpuv5-lite`, `v2-alpha-tpuv6e`; TPU Node TensorFlow versions `x.y[.z]`, `nightly`, `pytorch-x.y`.
_VM_RUNTIME_RE = re.compile(r"^(tpu-vm-[a-z0-9][a-z0-9.-]*|tpu-ubuntu\d{4}-base|v2-(alpha|nightly)[a-z0-9.-]*)$")
_NODE_RUNTIME_RE = re.compile(r"^(\d+\.\d+(\.\d+)?|nightly|pytorch-\d+\.\d+(\.\d+)?)$")
_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z0-9]+$")


@dataclass(frozen=True)
class TpuType:
    name: str
    family: str
    chips: int
    hosts: int
    zones: tuple
    price_hour: float | None
    spot_price_hour: float | None
    node_arch: bool

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1


# One TPU, two names (issue 52): Google Cloud's TPU API and GKE call a v5e slice `v5litepod-N` (its accelerator type:
# cloud.google.com/tpu/docs/v5e, "Configurations"; GKE's plan-tpus table), Kaggle calls its 8-chip v5e `v5e-8`
# (kaggle.com/docs/tpu; its client's machine shape "TpuV5E8"). Each provider takes the other's spelling.
_V5E_RE = re.compile(r"^v5e-(\d+)$")


def google_name(name: str) -> str:
    """`name` as Google Cloud spells it: v5e-N is v5litepod-N; anything else as given."""
    m = _V5E_RE.match(name or "")
    return f"v5litepod-{m.group(1)}" if m else name


def v5e_name(name: str) -> str:
    """`name` as Kaggle spells it: v5litepod-N is v5e-N; anything else as given."""
    return f"v5e-{name[len('v5litepod-'):]}" if (name or "").startswith("v5litepod-") else name


def tpu_type(name: str) -> TpuType:
    m = _TYPE_RE.match(google_name(name))
    if not m:
        raise bad_input(f"unknown TPU type {name!r}",
                        "use FAMILY-SIZE, for example v3-8, v5litepod-8, v6e-4; families: " + ", ".join(_FAMILIES))
    family, size = m.group(1), int(m.group(2))
    if m.group(2) != str(size):
        raise bad_input(f"TPU type {name!r}: write the size without leading zeros", f"--type {family}-{size}")
    by_cores, sizes, one_host_zones, pod_zones, price, spot, node_arch = _FAMILIES[family]
    if size not in sizes:
        raise bad_input(f"{family} has no size {size}",
                        "valid: " + ", ".join(f"{family}-{s}" for s in sizes))
    chips = size // 2 if by_cores else size
    hosts = max(1, chips // 4) if by_cores else (1 if size <= 8 else size // 4)
    zones = pod_zones if hosts > 1 else one_host_zones
    return TpuType(f"{family}-{size}", family, chips, hosts, zones, round(price * chips, 3) if price is not None else None,
                   round(spot * chips, 3) if spot is not None else None, node_arch)



# -- TPUs through Compute Engine (providers/gcp/compute/gce.py) ------------------------------------------------------
# "Compute Engine supports the following TPU versions: TPU7x, TPU v6e, TPU v5p" (compute/docs/tpus/tpu-machines);
# v5e is refused there ("This user agent is not allowed to use the machine type [ct5lp-hightpu-1t]", a live probe
# quoted in ../shared/GCE_TPU_FACTS.md §1). family -> {chips per VM: machine type}: the documented names (same
# facts file, §1: tpu-machines as quoted, gcloud's TPU_MACHINE_TYPES, xpk, cluster-toolkit hardware.go).
COMPUTE_MACHINES = {"v5p": {4: "ct5p-hightpu-4t"},
                    "v6e": {1: "ct6e-standard-1t", 4: "ct6e-standard-4t", 8: "ct6e-standard-8t"},
                    "tpu7x": {4: "tpu7x-standard-4t"}}
# Families only Compute Engine (or GKE) serves: the Cloud TPU API does not (tpu/docs/tpus-in-compute-engine).
COMPUTE_ONLY = frozenset({"tpu7x"})
# chips -> the slice's topology, the workload policy's acceleratorTopology (xpk system_characteristics.py's default
# topologies, as providers/gke/tputypes.py reads them; tpu7x-16 is "2x2x2" in the vLLM TPU7x MIG guide).
_CUBE_BY_CHIPS = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
                  512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}
_PLANE_BY_CHIPS = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}


@dataclass(frozen=True)
class ComputeShape:
    """A TPU type as Compute Engine makes it: `vms` VMs of `machine_type`, one bare VM when vms == 1, else a MIG
    with a workload policy of `topology` (the facts file §3: every multi-host slice is a MIG plus a workload
    policy; targetSize = chips / chips per VM)."""
    machine_type: str
    chips_per_vm: int
    vms: int
    topology: str


def compute_shape(t: TpuType) -> ComputeShape:
    machines = COMPUTE_MACHINES.get(t.family)
    if machines is None:
        raise bad_input(f"Compute Engine does not serve {t.family} TPUs ({t.name}): it serves "
                        + ", ".join(f"{f}-N" for f in COMPUTE_MACHINES),
                        "leave --api compute out: the Cloud TPU API makes " + t.name)
    per_vm = t.chips if t.chips in machines else 4   # a multi-host slice: 4-chip VMs, as its TPU API hosts
    topology = (_PLANE_BY_CHIPS if t.family == "v6e" else _CUBE_BY_CHIPS).get(t.chips, "")
    if t.chips % per_vm or not topology:
        raise bad_input(f"Compute Engine has no shape for {t.name}",
                        "valid: " + ", ".join(f"{t.family}-{c * (2 if t.family != 'v6e' else 1)}"
                                              for c in sorted(_PLANE_BY_CHIPS if t.family == "v6e" else _CUBE_BY_CHIPS)))
    return ComputeShape(machines[per_vm], per_vm, t.chips // per_vm, topology)


def check_runtime(runtime: str, node: bool) -> str:
    """--runtime, checked offline against Google's naming before anything is made (a zone's own list is asked
    later, before its bucket: GcpProvider.choose_runtime)."""
    if (_NODE_RUNTIME_RE if node else _VM_RUNTIME_RE).match(runtime) and len(runtime) <= 63:
        return runtime
    if node:
        raise bad_input(f"--runtime {runtime!r} is not a TPU Node TensorFlow version",
                        "a version such as 2.12.0 (or nightly); leave --runtime out to take the newest offered")
    raise bad_input(f"--runtime {runtime!r} is not a TPU VM software version",
                    "for example tpu-vm-tf-2.18.0-pjrt, v2-alpha-tpuv5-lite or tpu-ubuntu2204-base "
                    "(cloud.google.com/tpu/docs/runtimes); leave --runtime out to have one chosen")


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def check_zones(t: TpuType, zones: list[str]) -> list[str]:
    """The zones, well-formed and without repeats (whether each offers the type: `unlisted`)."""
    if not zones:
        raise bad_input("no zone given", f"add --zone; {t.name} is offered in " + ", ".join(t.zones))
    seen: list[str] = []
    for z in zones:
        if not _ZONE_RE.match(z):
            raise bad_input(f"malformed zone {z!r}", "zones look like us-central1-b")
        if z not in seen:
            seen.append(z)
    return seen


def unlisted(t: TpuType, zones: list[str]) -> list[str]:
    """The zones the offline table does not list for the type (an AI zone of a listed region counts as listed)."""
    regions = {region_of(z) for z in t.zones}
    return [z for z in zones if z not in t.zones and not (_AI_ZONE_RE.search(z) and region_of(z) in regions)]


def not_offered(t: TpuType, zone: str) -> TpuctlError:
    return bad_input(f"{t.name} is not offered in {zone}", "it is offered in " + ", ".join(t.zones))


# The legacy companion VM: a small general-purpose machine (ctpu's old default), $/hour in us-central1.
VM_PRICES = {"n1-standard-1": 0.0475, "n1-standard-2": 0.095, "n1-standard-4": 0.19, "n1-standard-8": 0.38,
             "e2-standard-2": 0.067, "e2-standard-4": 0.134, "e2-standard-8": 0.268}
DEFAULT_VM_TYPE = "n1-standard-2"
_VM_TYPE_RE = re.compile(r"^[a-z][a-z0-9]*-[a-z0-9-]+$")


def check_vm_type(name: str) -> str:
    if not _VM_TYPE_RE.match(name or ""):
        raise bad_input(f"malformed machine type {name!r}", "for example n1-standard-2 or e2-standard-4")
    return name
