"""`up --namespace NAME` (issue 57 item 3): the Kubernetes namespace a cluster's runs and its `--kueue` LocalQueue
live in. The API server refuses an object in a namespace that does not exist (the NamespaceLifecycle admission
plugin, on by default: Kubernetes docs "Admission Control in Kubernetes", NamespaceLifecycle "ensures that requests
in a non-existent Namespace are rejected"), so `up` makes it when it is missing, labelled `tpuctl-cluster=<name>`
as tpuctl's node pools are, and that label is how `down` knows the namespace is its own: one that was there before
`up` is never deleted. Deleting a namespace deletes everything in it (Kubernetes docs, "Namespaces"), so `down`
keeps even its own while it holds pods that are not tpuctl's."""
from __future__ import annotations

from typing import Any

from . import kube, manifest

# Made by Kubernetes itself in every cluster (Kubernetes docs, "Namespaces: Initial namespaces").
BUILTIN = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})


def path(name: str) -> str:
    return f"/api/v1/namespaces/{name}"


def ensure(api: Any, name: str, cluster: str) -> bool:
    """The namespace, made (labelled as the cluster's) when it is missing; True when this call made it."""
    if name in BUILTIN or kube.get(api, path(name)) is not None:
        return False
    kube.apply(api, path(name), {"apiVersion": "v1", "kind": "Namespace",
                                 "metadata": {"name": name, "labels": {manifest.LABEL_CLUSTER: cluster}}})
    return True


def remove(api: Any, name: str, cluster: str) -> str:
    """`down` in a cluster that outlives it (adopted): the namespace deleted if tpuctl made it for this cluster and
    it holds no pod of anyone else's; what became of it, in words."""
    ns = kube.get(api, path(name))
    if ns is None:
        return "gone"
    if (ns.get("metadata", {}).get("labels") or {}).get(manifest.LABEL_CLUSTER) != cluster:
        return "kept (it was there before tpuctl)"
    pods = (kube.get(api, f"{path(name)}/pods") or {}).get("items") or []
    theirs = [p for p in pods if (p["metadata"].get("labels") or {}).get(manifest.LABEL_CLUSTER) != cluster]
    if theirs:
        return f"kept (it holds {len(theirs)} pod{'s' * (len(theirs) > 1)} not tpuctl's)"
    kube.delete(api, path(name), propagation="Background")
    return "deleted"
