"""What a JAX job on a Compute Engine TPU slice (`up --api compute`) needs to find its peers, should JAX's own
detection not find them.

JAX's GceTpuCluster takes a TPU VM for one only when the metadata server answers `agent-worker-number`
(jax/_src/clusters/cloud_tpu_cluster.py `is_env_present`), which the Cloud TPU API's VMs carry and Compute Engine
TPU VMs are not known to (../shared/GCE_TPU_FACTS.md §5: their metadata shows tpu-env's TPU_WORKER_ID and
`worker-network-endpoints` as hostnames). Without a cluster, `jax.distributed.initialize()` raises ValueError
("coordinator_address should be defined", jax/_src/distributed.py); tpuctl.runtime then passes what this module
exports: the coordinator (worker 0: the first of worker-network-endpoints, as JAX itself takes it, on JAX's
coordinator port; on a Multislice, slice 0's worker 0 from the cluster record, as MEGASCALE_COORDINATOR_ADDRESS),
the process count and this process's id (slice x hosts + worker, as JAX numbers them)."""
from __future__ import annotations

from typing import Any

from . import google_api

PORT = 8482   # JAX's coordinator_port for Cloud TPU clusters (cloud_tpu_cluster.py; firewall.py opens it)


def first_endpoint(text: str) -> str:
    """The first of worker-network-endpoints: a hostname, or the ip of a TPU API `name:id:ip` entry (JAX splits them
    so, commit 7a97854)."""
    first = text.split(",")[0].strip()
    parts = first.split(":")
    return parts[2] if len(parts) == 3 else first


def environment(record: dict[str, Any], worker: int, workers: int) -> dict[str, str]:
    """TPUCTL_JAX_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID on a Compute Engine slice of several hosts, else {}."""
    if record.get("api") != "compute" or workers <= 1:
        return {}
    host = str(record.get("coordinator") or "")
    if int(record.get("slices") or 1) <= 1:
        try:
            host = first_endpoint(google_api.attribute("worker-network-endpoints")) or host
        except (OSError, ValueError):
            pass   # no metadata server answers (it always does on a VM): the record's address stands
    if not host:
        return {}
    return {"TPUCTL_JAX_COORDINATOR": f"{host}:{PORT}", "TPUCTL_JAX_NUM_PROCESSES": str(workers),
            "TPUCTL_JAX_PROCESS_ID": str(worker)}
