"""Every tpuctl-labelled GKE resource in a project (`ls`, `down -c NAME --project P` without local state): clusters
tpuctl made (their resource_labels), TPU node pools it made in any cluster, adopted ones included (their nodes'
resource_labels)."""
from __future__ import annotations

import time

from ...core import layout, runs
from ...core.errors import ErrorKind, TpuctlError
from ...core.models import LABEL, ClusterSpec, ClusterState, Grant, Phase, ProviderName, default_bucket
from ..google.gcs_store import GcsStore
from . import container

_POOL_SUFFIX = "-np-"   # tpuctl-NAME-np-K (core/models.py ClusterSpec.node_names)


class GkeInventory:
    def list_labelled(self, project: str) -> list[dict[str, str]]:
        """Clusters and node pools only: buckets are listed once, by the gcp provider's inventory, whose buckets
        these are too. A project whose Kubernetes Engine API is off holds nothing of GKE's: none is listed."""
        try:
            clusters = container.list_clusters(project)
        except TpuctlError as e:
            if e.kind is ErrorKind.PERMISSION and "container.googleapis.com" in e.message + e.hint:
                return []
            raise
        out: list[dict[str, str]] = []
        for c in clusters:
            ours = c.resource_labels.get(LABEL, "")
            if ours:
                out.append({"cluster": ours, "kind": "gke", "name": c.name, "zone": c.location, "arch": "",
                            "type": "GKE cluster", "state": type(c).Status(c.status).name})
            for p in c.node_pools:   # a cluster as listed carries its node pools
                owner = p.config.resource_labels.get(LABEL, "")
                if owner and _POOL_SUFFIX in p.name:
                    out.append({"cluster": owner, "kind": "pool", "name": p.name,
                                "zone": (list(p.locations) or [c.location])[0], "arch": "", "state":
                                type(p).Status(p.status).name, "type": p.config.machine_type,
                                "gke_cluster": "" if ours else c.name})
        return out

    def state_from(self, name: str, project: str, found: list[dict[str, str]]) -> ClusterState:
        """The cluster as its labels describe it: node pools in an unlabelled cluster mean it was adopted. The
        type, grants and GKE record come from the cluster record in its bucket (the default name: a --bucket
        given to `up` is not known without local state)."""
        pools = [n for n in found if n["kind"] == "pool"]
        adopted = next((n["gke_cluster"] for n in pools if n.get("gke_cluster")), "")
        zone = pools[0]["zone"] if pools else next((n["zone"] for n in found if n["kind"] == "gke"), "")
        spec = ClusterSpec(name=name, provider=ProviderName.GKE, project=project,
                           store=f"gs://{default_bucket(project, name)}", zones=[zone] if zone else [],
                           slices=max(1, len(pools)), gke_cluster=adopted)
        st = ClusterState(spec=spec, zone=zone, phase=Phase.READY, created_at=time.time())
        try:
            record = runs.read_object(GcsStore(spec.store, project), layout.CLUSTER_RECORD)
        except TpuctlError:
            record = {}
        spec.tpu_type = str(record.get("tpu_type") or "")
        st.grants = [Grant(str(g["member"]), str(g["role"])) for g in record.get("grants") or []]
        st.record["gke"] = dict(record.get("gke") or {})
        return st
