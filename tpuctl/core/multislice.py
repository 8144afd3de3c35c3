"""Multislice: N identical TPU slices as one cluster, one queued resource, one run across them (`up --slices N`).

Facts, with sources:
- A Multislice request is ONE queued resource whose node spec carries `multislice_params {node_count,
  node_id_prefix}` in place of `node_id`; `node_count` "needs to be > 1"; "If node_count = 3 and node_id_prefix =
  "np", node ids of nodes created will be "np-0", "np-1", "np-2"" (google-cloud-tpu 1.28,
  google/cloud/tpu_v2/types/cloud_tpu.py `QueuedResource.Tpu.NodeSpec.MultisliceParams`; gcloud's
  `queued-resources create --node-count N --node-prefix P`, which MaxText's multihost_job.py uses for
  --NUM_SLICES > 1). Each node reports `multislice_node` (`Node.multislice_node`, output only).
- Multislice needs TPU v4 or newer and serves JAX and PyTorch/XLA (Cloud TPU and GKE Multislice pages; GCP_FACTS
  §10); TensorFlow's TPUStrategy drives one slice (GCP_FACTS §6), so a TensorFlow run is refused on such a cluster.
- Each host's `tpu-env` metadata holds `WORKER_ID`, `NODE_ID` and, on a Multislice node, `MEGASCALE_SLICE_ID`
  etc. as `KEY: 'value'` lines (MaxText multihost_job.py `get_env_command_str`: `grep '^MEGASCALE_SLICE_ID'
  /tmp/tpu-env | cut -d "'" -f 2`).
- The job sees MEGASCALE_COORDINATOR_ADDRESS (slice 0's worker 0, `ip:port`), MEGASCALE_NUM_SLICES,
  MEGASCALE_SLICE_ID and MEGASCALE_PORT, as Ray-based TPU launchers set them (levanter's ray_tpu lineage, e.g.
  erfanzar/eformer executor: `MEGASCALE_DEFAULT_PORT = 8081`, address `f"{coordinator_ip}:{port}"`).
"""
from __future__ import annotations

from typing import Any

from .errors import bad_input

FAMILIES = ("v4", "v5p", "v5litepod", "v6e", "tpu7x")   # v4 or newer: the families Multislice serves (tpu7x: --api compute)
PORT = 8081


def check(slices: int, family: str, node_arch: bool, tpu_type: str) -> None:
    """`up --slices N`, refused offline, before anything is made."""
    if slices < 2:
        raise bad_input(f"--slices {slices}: a Multislice cluster has at least 2 slices",
                        "leave --slices out for one slice")
    if node_arch:
        raise bad_input("--slices: a TPU Node (--arch node) cannot be part of a Multislice",
                        "use --arch vm with a v4 or newer type")
    if family not in FAMILIES:
        raise bad_input(f"--slices: Multislice needs TPU v4 or newer; {tpu_type} is {family}",
                        "pick a v4, v5p, v5litepod or v6e type, or one larger slice without --slices")


def node_names(prefix: str, slices: int) -> list[str]:
    """The nodes of the cluster: `prefix` alone for one slice; `prefix-0` ... `prefix-(N-1)` for N slices."""
    return [prefix] if slices <= 1 else [f"{prefix}-{k}" for k in range(slices)]


def environment(record: dict[str, Any], slice_id: int) -> dict[str, str]:
    """MEGASCALE_* for a host of slice `slice_id` of the cluster in `record` (none on one slice): the coordinator is
    slice 0's worker 0 (the record's `coordinator`, its first network endpoint), given only where the record has
    it. Which values Google's own `tpu-env` holds beside MEGASCALE_SLICE_ID is not established; libtpu reads those
    itself where they are."""
    slices = int(record.get("slices") or 1)
    if slices <= 1:
        return {}
    out = {"MEGASCALE_NUM_SLICES": str(slices), "MEGASCALE_SLICE_ID": str(slice_id)}
    if record.get("coordinator"):
        out.update(MEGASCALE_COORDINATOR_ADDRESS=f"{record['coordinator']}:{PORT}", MEGASCALE_PORT=str(PORT))
    # else (a GKE pod: the record has no host ip) no coordinator the agent cannot know, which would override the
    # pod's own (":8081" did): there the manifest gives it from JobSet's coordinator annotation
    # (providers/gke/manifest.py _megascale), in the agent's environment, which the job's starts from.
    return out
