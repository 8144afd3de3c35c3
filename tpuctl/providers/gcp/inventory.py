"""Every tpuctl-labelled resource in a project (TPUs of both APIs, queued requests, companion and watcher VMs,
buckets), and a cluster rebuilt from its labels when no local state describes it (`ls`, `down -c NAME --project
P`)."""
from __future__ import annotations

import time
from typing import Callable

from ...core import layout, runs
from ...core.models import LABEL, Arch, ClusterSpec, ClusterState, Grant, Phase, ProviderName, default_bucket
from ..google import storage, vms
from ..google.gcs_store import GcsStore
from ..google.vms import ROLE_LABEL
from .compute import gce_inventory, gce_requests
from .tpuapi.queued import QueuedApi
from .tpuapi.tpu import TpuApi


class GcpInventory:
    def __init__(self, store_of: Callable[[ClusterState], GcsStore]) -> None:
        self.store_of = store_of

    def state_from(self, name: str, project: str, found: list[dict[str, str]]) -> ClusterState:
        tpus = [n for n in found if n["kind"] == "tpu"]
        tpu = next(iter(tpus), None) or next(
            (n for n in found if n["kind"] == "queued"), None)
        vm = next((n for n in found if n["kind"] == "vm"), None)
        bucket = next((n for n in found if n["kind"] == "bucket"), None)
        arch = Arch.NODE if (tpu and tpu["arch"] == "node") or vm else Arch.VM
        zone = (tpu or vm or {"zone": ""})["zone"]
        made = next((n for n in found if n.get("api") == "compute" and n["kind"] in ("tpu", "mig")), None)
        if made is not None or any(n.get("api") == "compute" for n in found):   # Compute Engine (gce.py)
            return self._compute_state(name, project, found, made, bucket)
        spec = ClusterSpec(name=name, provider=ProviderName.GCP, project=project,
                           store=f"gs://{bucket['name'] if bucket else default_bucket(project, name)}",
                           tpu_type=tpu["type"] if tpu else "", zones=[zone] if zone else [], arch=arch,
                           queued=any(n["kind"] == "queued" for n in found),
                           slices=len(tpus) if len(tpus) > 1 else 1)   # a Multislice's nodes, each labelled
        st = ClusterState(spec=spec, zone=zone, phase=Phase.READY, created_at=time.time())
        record = runs.read_object(self.store_of(st), layout.CLUSTER_RECORD) if bucket else {}
        st.grants = [Grant(str(g["member"]), str(g["role"])) for g in record.get("grants") or []]
        return st

    def _compute_state(self, name: str, project: str, found: list[dict[str, str]], made: dict[str, str] | None,
                       bucket: dict[str, str] | None) -> ClusterState:
        """A Compute Engine cluster from its VM or MIGs; with only a template or policy left, a spec naming them
        (type "" : `down` removes what its names find)."""
        zone = made["zone"] if made else ""
        policy = next((n for n in found if n["kind"] == "workload policy"), None)
        spec = ClusterSpec(name=name, provider=ProviderName.GCP, project=project, api="compute",
                           store=f"gs://{bucket['name'] if bucket else default_bucket(project, name)}",
                           tpu_type=made["type"] if made else "", zones=[zone] if zone else [],
                           slices=int(made.get("slices") or 1) if made else 1)
        st = ClusterState(spec=spec, zone=zone or (f"{policy['zone']}-a" if policy else ""), phase=Phase.READY,
                          created_at=time.time())
        record = runs.read_object(self.store_of(st), layout.CLUSTER_RECORD) if bucket else {}
        st.grants = [Grant(str(g["member"]), str(g["role"])) for g in record.get("grants") or []]
        return st

    def list_labelled(self, project: str) -> list[dict[str, str]]:
        out, seen = [], set()
        for arch in Arch:
            for n in TpuApi(project, arch).list_labelled():
                parts = n.name.split("/")
                if (parts[3], parts[-1]) in seen:   # both API versions may list the same node
                    continue
                seen.add((parts[3], parts[-1]))
                out.append({"cluster": n.labels[LABEL], "kind": "tpu", "name": parts[-1], "zone": parts[3],
                            "arch": arch.value, "type": n.accelerator_type, "state": type(n).State(n.state).name})
        for q in QueuedApi(project).list_labelled():
            parts = q.name.split("/")
            ms = q.tpu.node_spec[0].multislice_params
            out.append({"cluster": QueuedApi.labels(q)[LABEL], "kind": "queued", "name": parts[-1], "zone": parts[3],
                        "arch": "vm", "type": q.tpu.node_spec[0].node.accelerator_type
                        + (f" x {ms.node_count}" if ms.node_count > 1 else ""), "state": QueuedApi.state(q)})
        compute_tpus = gce_inventory.list_labelled(project)
        migs = [r["name"] for r in compute_tpus if r["kind"] == "mig"]
        for zone, vm in vms.list_labelled(project):
            if vm.labels.get(ROLE_LABEL) == "tpu":   # a Compute Engine TPU VM (gce.py): one of a MIG is the MIG's
                if not any(vm.name.startswith(f"{m}-") for m in migs):
                    tpu, slices = gce_requests.shape_in(vm.description)
                    out.append({"cluster": vm.labels[LABEL], "kind": "tpu", "name": vm.name, "zone": zone,
                                "arch": "vm", "type": tpu, "slices": str(slices), "state": vm.status,
                                "api": "compute"})
                continue
            watcher = vm.labels.get(ROLE_LABEL) == "watcher"   # the recovery watcher's VM (watcher_vm.py)
            out.append({"cluster": vm.labels[LABEL], "kind": "watcher" if watcher else "vm", "name": vm.name,
                        "zone": zone, "arch": "" if watcher else "node", "type": vm.machine_type.rsplit("/", 1)[-1],
                        "state": vm.status})
        out += compute_tpus
        for b in storage.list_labelled(project):
            out.append({"cluster": b.labels[LABEL], "kind": "bucket", "name": b.name,
                        "zone": (b.location or "").lower(), "arch": "", "type": "", "state": "READY"})
        return out
