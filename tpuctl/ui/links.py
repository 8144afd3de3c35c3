"""Cloud Console and Cloud Logging links for a run on Google Cloud, in the shapes xpk prints
(AI-Hypercomputer/xpk src/xpk/commands/workload.py): "Follow your workload here:
https://console.cloud.google.com/kubernetes/service/{region}/{cluster}/default/{workload}/details?project={project}",
and get_pathways_unified_query_link's Logs Explorer link, a filter of one condition a line, quoted whole
(`urllib.parse.quote(log_filter, safe='')`) after `https://console.cloud.google.com/logs/query;query=`.

A TPU VM's page is Compute Engine's TPU details page, compute/tpus/details/{zone}/{name}?project=; its hosts' logs are
the monitored resource `tpu_worker` (labels project_id, zone, node_id, worker_id: Cloud Logging's monitored
resource list). A GKE node pool's page is kubernetes/nodepool/{location}/{cluster}/{pool}. Providers without a
console (local, Kaggle) have none: the table below names the two that do, by what the cluster record holds."""
from __future__ import annotations

import urllib.parse
from typing import Any, Callable

from ..core.models import ClusterState

CONSOLE = "https://console.cloud.google.com"


def _logs(project: str, *conditions: str) -> str:
    query = urllib.parse.quote("\n".join([*conditions, "severity>=DEFAULT"]), safe="")
    return f"{CONSOLE}/logs/query;query={query}?project={project}"


def _tpu_vm(st: ClusterState, run_id: str) -> list[dict[str, str]]:
    p, zone = st.spec.project, st.zone
    out = []
    for node in st.spec.node_names:
        out.append({"title": f"TPU {node} (Cloud Console)",
                    "url": f"{CONSOLE}/compute/tpus/details/{zone}/{node}?project={p}"})
        out.append({"title": f"logs of {node}'s hosts (Cloud Logging)",
                    "url": _logs(p, 'resource.type="tpu_worker"', f'resource.labels.project_id="{p}"',
                                 f'resource.labels.zone="{zone}"', f'resource.labels.node_id="{node}"')})
    return out


def _gke(st: ClusterState, run_id: str) -> list[dict[str, str]]:
    p, where = st.spec.project, st.zone
    name = st.spec.gke_cluster or st.spec.tpu_name   # providers/gke/planning.py cluster_name
    workload = "tpuctl-" + run_id.lower()            # providers/gke/manifest.py jobset_name
    out = [{"title": f"JobSet {workload} (Cloud Console)",
            "url": f"{CONSOLE}/kubernetes/service/{where}/{name}/default/{workload}/details?project={p}"},
           {"title": f"logs of {workload}'s pods (Cloud Logging)",
            "url": _logs(p, 'resource.type="k8s_container"', f'resource.labels.project_id="{p}"',
                         f'resource.labels.location="{where}"', f'resource.labels.cluster_name="{name}"',
                         f'resource.labels.pod_name:"{workload}-"')}]
    for pool in st.spec.node_names:
        out.append({"title": f"node pool {pool} (Cloud Console)",
                    "url": f"{CONSOLE}/kubernetes/nodepool/{where}/{name}/{pool}?project={p}"})
    return out


_BY_PROVIDER: dict[str, Callable[[ClusterState, str], list[dict[str, str]]]] = {"gcp": _tpu_vm, "gke": _gke}


def for_run(st: ClusterState, run_id: str) -> list[dict[str, Any]]:
    make = _BY_PROVIDER.get(st.spec.provider.value)
    return make(st, run_id) if make and st.spec.project else []
