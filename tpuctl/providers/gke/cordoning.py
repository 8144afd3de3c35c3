"""What a run's pods need to cordon their own node when their host is sick (issue 60 item 4; the agent's side is
host/cordon.py): a ServiceAccount of the cluster's in the run's namespace, which the pods run as, bound to a
ClusterRole that may get and patch nodes (`kubectl cordon` gets the node, then patches spec.unschedulable: kubectl
pkg/drain/cordon.go). Nodes are cluster-scoped, so the role is a ClusterRole and its binding a ClusterRoleBinding
(Kubernetes docs, "Using RBAC Authorization": "to grant permissions across a whole cluster"); RBAC cannot narrow it
to the pod's own node (resourceNames are fixed in the role), so only tpuctl's pods run as this account, not the
namespace's `default` one.

`submit` applies them before the run's JobSet (runs.py); where the user may not grant them (an adopted cluster
whose RBAC refuses: 403) the run is made all the same, its pods on the namespace's default account, and a sick
host is then only marked (`status`), not moved off. `down` deletes them (labelled with the cluster, as the JobSets
are): on a cluster tpuctl made they would go with it; on an adopted one they must not outlive tpuctl's runs."""
from __future__ import annotations

from typing import Any

from . import kube
from .manifest import LABEL_CLUSTER

RBAC = "rbac.authorization.k8s.io/v1"


def account(cluster: str) -> str:
    return f"tpuctl-{cluster}"


def objects(cluster: str, namespace: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, object) for the account, the role and the binding, in the order they are applied."""
    labels = {LABEL_CLUSTER: cluster}
    sa, role, binding = account(cluster), f"tpuctl-cordon-{cluster}", f"tpuctl-cordon-{cluster}-{namespace}"
    return [
        (f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}",
         {"apiVersion": "v1", "kind": "ServiceAccount",
          "metadata": {"name": sa, "namespace": namespace, "labels": labels}}),
        (f"/apis/{RBAC}/clusterroles/{role}",
         {"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": role, "labels": labels},
          "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]}),
        (f"/apis/{RBAC}/clusterrolebindings/{binding}",
         {"apiVersion": RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": binding, "labels": labels},
          "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
          "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]}),
    ]


def ensure(api: Any, cluster: str, namespace: str) -> tuple[str, str]:
    """(the account the run's pods run as, "") once applied; ("", why not) when the cluster refused them."""
    try:
        for path, obj in objects(cluster, namespace):
            kube.apply(api, path, obj)
    except kube.KubeError as e:
        return "", f"{e.status} {e.reason}: {e.message}"
    return account(cluster), ""


def delete(api: Any, cluster: str) -> int:
    """`down`: the cluster's accounts, roles and bindings; how many went. A refusal is left to the caller."""
    sel = [("labelSelector", f"{LABEL_CLUSTER}={cluster}")]
    gone = 0
    for plural, base in (("clusterrolebindings", f"/apis/{RBAC}"), ("clusterroles", f"/apis/{RBAC}"),
                         ("serviceaccounts", "/api/v1")):
        for obj in (kube.get(api, f"{base}/{plural}", sel) or {}).get("items", []):
            meta = obj["metadata"]
            ns = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
            gone += kube.delete(api, f"{base}{ns}/{plural}/{meta['name']}", "Background")
    return gone
