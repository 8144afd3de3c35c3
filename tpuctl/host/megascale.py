"""A Multislice job's MEGASCALE_* environment, from Google where Google provides it (issue 39 item 4).

JAX reads each of MEGASCALE_COORDINATOR_ADDRESS, MEGASCALE_NUM_SLICES and MEGASCALE_SLICE_ID from the process's
environment first and from the host's `tpu-env` metadata only where the environment lacks it
(jax/_src/clusters/cloud_tpu_cluster.py `get_tpu_env_value`: `value = os.environ.get(key, None)`, then
`get_tpu_env_value_from_metadata`); on "GCE via QueuedResources" Google's tpu-env carries the coordinator, "the host
with process id = 0" (same file, `get_coordinator_address`). A value the agent sets therefore overrides Google's: the
coordinator `up` wrote in cluster.json goes stale once Google re-makes slice 0 elsewhere, and every round would hang
at start-up (ray-project/ray#62893 fixed the same hang). So tpu-env is read again at each round's start (a repair
restarts every slice, and each host's tpu-env then names the new slice 0); Google's values go to the job as they are
(so a job that reads os.environ sees them too) and the cluster record fills in only what tpu-env lacks (a host
without a metadata server: the local provider; a tpu-env without them).

tpu-env is `KEY: 'value'` lines (JAX: "Typical line is MEGASCALE_NUM_SLICES: '2'"; MaxText multihost_job.py cuts the
value out between single quotes)."""
from __future__ import annotations

import re
from typing import Any

from ..core import multislice
from . import google_api

KEYS = ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_PORT")


def parse(text: str) -> dict[str, str]:
    """`KEY: 'value'` lines as JAX's get_tpu_env_value splits them: at the first ':', the value stripped of blanks and
    single quotes."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            out[key.strip()] = value.strip().strip("'")
    return out


def read(record: dict[str, Any]) -> dict[str, str]:
    """This host's tpu-env now: on a TPU VM (the record's arch "vm"), {} elsewhere or when it cannot be read (the
    record's values then stand, as before)."""
    if record.get("arch") != "vm" or int(record.get("slices") or 1) <= 1:
        return {}
    try:
        return parse(google_api.attribute("tpu-env"))
    except (OSError, ValueError):
        return {}


def environment(record: dict[str, Any], slice_id: int, tpu_env: dict[str, str]) -> dict[str, str]:
    """MEGASCALE_* for a host of slice `slice_id`: Google's where its tpu-env has them, the record's otherwise. Where
    Google names the coordinator, its port is Google's too ("the MXLA coordinator, which is set to 8080 in multislice
    GCE", JAX cloud_tpu_cluster.py), so tpuctl's own MEGASCALE_PORT (core/multislice.py) is not added beside it."""
    ours = multislice.environment(record, slice_id)
    if not ours:
        return {}
    if tpu_env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        ours.pop("MEGASCALE_PORT", None)
        ours["MEGASCALE_COORDINATOR_ADDRESS"] = tpu_env["MEGASCALE_COORDINATOR_ADDRESS"]   # even where ours has none
    return {k: tpu_env.get(k) or v for k, v in ours.items()}


def check(tpu_env: dict[str, str], slice_id: int) -> None:
    """The slice Google says this host is in agrees with the node's name (`prefix-K`, core/multislice.node_names)
    and with the slice the agent was started for; else a ValueError that says which says what (the run's store keys
    and the job's process ids would be another host's)."""
    said = {"the agent's --slice": str(slice_id)}
    if tpu_env.get("MEGASCALE_SLICE_ID"):
        said["tpu-env's MEGASCALE_SLICE_ID"] = tpu_env["MEGASCALE_SLICE_ID"]
    m = re.search(r"-(\d+)$", tpu_env.get("NODE_ID", ""))
    if m and tpu_env.get("MEGASCALE_SLICE_ID"):
        said[f"the node name {tpu_env['NODE_ID']}"] = m.group(1)
    if len(set(said.values())) > 1:
        raise ValueError("this host's slice is unclear: " + ", ".join(f"{k} says {v}" for k, v in said.items()))
