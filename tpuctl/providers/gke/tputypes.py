"""TPU types as GKE knows them: the accelerator label, machine type, topology and hosts of one slice.

Source for every row: xpk 1.16.0 `core/system_characteristics.py` (AI-Hypercomputer/xpk; PyPI `xpk`), whose
`get_tpu_system_characteristics_map` builds each `PREFIX-N` entry from a topology: chips = product of the topology,
chips per VM = 1 for a 1x1(x1) topology, else 4 (`compute_chips_per_vm`), hosts = chips / chips per VM, N = chips x
tensor cores per chip (2 for v4, v5p and TPU7x; 1 for v5e and v6e), and `requires_workload_policy` only for TPU7x
and only when hosts > 1. For sizes that several topologies give (v4, v5p, TPU7x), xpk's `default_topologies`
pick one; the tables below are those picks (read by running xpk's map, 2026-11). The accelerator labels and machine
types agree with GKE's "Plan TPUs in GKE" tables (kubernetes-engine/docs/concepts/plan-tpus) and, for TPU7x, with
"About Ironwood (TPU7x) in GKE" (kubernetes-engine/docs/concepts/tpu-ironwood: four chips per VM; multi-host node
pools take a workload policy through --placement-policy, which replaces --tpu-topology).

Exceptions to xpk, each with its source: v5litepod-1 (ct5lp-hightpu-1t, 1x1) and v5litepod-4 (ct5lp-hightpu-4t, 2x2)
are single-host v5e shapes in GKE's plan-tpus table that xpk's map leaves out. xpk (and so tpuctl) makes v5e-8 and
v6e-8 two hosts of four chips (topology 2x4 on -4t machines), not the single -8t host GKE also offers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import reduce
from operator import mul

from ...core.catalog import google_name
from ...core.errors import bad_input

# TPU7x needs a GKE Standard cluster at this version or later (kubernetes-engine/docs/concepts/tpu-ironwood).
TPU7X_MIN_GKE_VERSION = "1.34.0-gke.2201000"

_CUBE = {8: "2x2x1", 16: "2x2x2", 32: "2x2x4", 64: "2x4x4", 128: "4x4x4", 256: "4x4x8", 512: "4x8x8",
         1024: "8x8x8", 2048: "8x8x16", 4096: "8x16x16"}
_PLANE = {8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}


@dataclass(frozen=True)
class _Family:
    accelerator: str                     # the node label cloud.google.com/gke-tpu-accelerator
    machine_type: str                    # the 4-chip host
    one_chip_machine: str                # the 1-chip host ("" when the family has none on GKE)
    cores_per_chip: int                  # N in FAMILY-N counts tensor cores: chips x this
    topologies: dict[int, str]           # N -> topology
    workload_policy: bool = False        # multi-host node pools need a workload policy instead of --tpu-topology


_FAMILIES: dict[str, _Family] = {
    "v4": _Family("tpu-v4-podslice", "ct4p-hightpu-4t", "", 2, dict(_CUBE)),
    "v5p": _Family("tpu-v5p-slice", "ct5p-hightpu-4t", "", 2, {**_CUBE, 8192: "16x16x16"}),
    "v5litepod": _Family("tpu-v5-lite-podslice", "ct5lp-hightpu-4t", "ct5lp-hightpu-1t", 1,
                         {1: "1x1", 4: "2x2", **_PLANE}),
    "v6e": _Family("tpu-v6e-slice", "ct6e-standard-4t", "ct6e-standard-1t", 1, {1: "1x1", 4: "2x2", **_PLANE}),
    "tpu7x": _Family("tpu7x", "tpu7x-standard-4t", "tpu7x-standard-1t", 2,
                     {2: "1x1x1", **_CUBE, 8192: "16x16x16"}, workload_policy=True),
}
_TYPE_RE = re.compile(r"^([a-z0-9]+)-(\d+)\Z")   # \Z: "$" would match before a final newline


@dataclass(frozen=True)
class SliceShape:
    """One slice of a TPU type on GKE: what its node pool is made of and what its pods select."""
    tpu_type: str               # as the user wrote it: v6e-16, tpu7x-16
    accelerator: str            # cloud.google.com/gke-tpu-accelerator
    machine_type: str           # the node pool's machine type
    topology: str               # cloud.google.com/gke-tpu-topology; the node pool's placement_policy.tpu_topology
    chips_per_host: int         # google.com/tpu a pod asks for
    hosts: int                  # nodes in the slice's node pool (pods per slice)
    chips: int
    multi_host: bool
    needs_workload_policy: bool  # TPU7x multi-host: a HIGH_THROUGHPUT workload policy, not a tpu_topology

    @property
    def family(self) -> str:
        return self.tpu_type.rsplit("-", 1)[0]


def families() -> list[str]:
    return list(_FAMILIES)


def shape(tpu_type: str) -> SliceShape:
    """The slice shape of `tpu_type`; TpuctlError(INPUT) with the valid sizes for a type GKE (or tpuctl) lacks."""
    tpu_type = google_name(tpu_type)   # v5e-16 is v5litepod-16 (core/catalog.py)
    m = _TYPE_RE.match(tpu_type or "")
    family = _FAMILIES.get(m.group(1)) if m else None
    if not m or family is None:
        raise bad_input(f"unknown TPU type {tpu_type!r} for GKE",
                        "use FAMILY-SIZE with a family of " + ", ".join(_FAMILIES) + ", e.g. --type v6e-16 or tpu7x-16")
    size = int(m.group(2))
    topology = family.topologies.get(size) if m.group(2) == str(size) else None
    if topology is None:
        raise bad_input(f"{tpu_type} is not a GKE TPU slice tpuctl knows",
                        "valid: " + ", ".join(f"{m.group(1)}-{n}" for n in family.topologies))
    chips = reduce(mul, (int(d) for d in topology.split("x")), 1)
    per_host = 1 if chips == 1 else 4
    hosts = chips // per_host
    return SliceShape(tpu_type=tpu_type, accelerator=family.accelerator,
                      machine_type=family.one_chip_machine if per_host == 1 else family.machine_type,
                      topology=topology, chips_per_host=per_host, hosts=hosts, chips=chips, multi_host=hosts > 1,
                      needs_workload_policy=family.workload_policy and hosts > 1)
