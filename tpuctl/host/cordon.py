"""A sick host in a GKE pod (issue 60 item 4): the pod's node is cordoned and the pod rescheduled.

On a TPU VM or a Compute Engine MIG the recovery watcher deletes a host marked sick (failures.mark_sick) and makes
it again (control/watch.py). A GKE pod's host is a node the cluster owns; what replaces it is the scheduler: the
pod's agent marks its own node unschedulable, as `kubectl cordon` does, then exits with the restart code (42), so
the JobSet restarts the run (providers/gke/manifest.py: RESTART_EXIT_CODES) and the scheduler places the new pods
on other nodes: its NodeUnschedulable filter passes over a node whose spec.unschedulable is set (kubernetes
pkg/scheduler/framework/plugins/nodeunschedulable/node_unschedulable.go, unless the pod tolerates the taint
node.kubernetes.io/unschedulable, which tpuctl's pods do not). The node keeps running what it runs; nothing new
lands on it until someone uncordons it (`kubectl uncordon NODE`) or GKE repairs or deletes its node pool.

The call is kubectl's own: k8s.io/kubectl/pkg/drain/cordon.go `CordonHelper.PatchOrReplaceWithContext` sends a
strategic merge patch of the node whose only change is `spec.unschedulable: true` (CreateTwoWayMergePatch of the
node before and after), PATCH /api/v1/nodes/NODE, Content-Type application/strategic-merge-patch+json; tpuctl's
patch also annotates the node with why (ANNOTATION), which kubectl's does not. The agent
has no Kubernetes client (the pod installs tpuctl without its dependencies): the call is made with the pod's own
service account (its token and CA mounted at /var/run/secrets/kubernetes.io/serviceaccount, the API at
KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT: Kubernetes docs, "Accessing the Kubernetes API from a Pod"), which
`submit` binds to a ClusterRole that may get and patch nodes (providers/gke/cordoning.py). The node's name comes
from the downward API (TPUCTL_NODE = spec.nodeName: manifest.py). A node that cannot be cordoned (no token, the
role refused, the API down) is said, and the run goes on as before: it fails, the host marked sick for `status`.

TPUCTL_KUBE_API (a URL) and TPUCTL_KUBE_SA_DIR point the tests at the fake API server and a token of their own.
"""
from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request

from ..core import layout
from ..core.store import BlobStore

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PATCH_TYPE = "application/strategic-merge-patch+json"   # types.StrategicMergePatchType, as kubectl cordon sends
ANNOTATION = "tpuctl-sick"   # on the cordoned node: why, for whoever looks at it (`kubectl describe node`)
TIMEOUT = 10.0   # seconds for the one call: the run waits on it


def node_name() -> str:
    """This pod's node ("" outside a GKE pod of tpuctl's)."""
    return os.environ.get("TPUCTL_NODE", "")


def _api() -> str:
    url = os.environ.get("TPUCTL_KUBE_API", "")
    if url:
        return url.rstrip("/")
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return ""
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def cordon(node: str, why: str) -> str:
    """Marks `node` unschedulable, with `why` in its annotation; "" when done, else why not."""
    api, sa = _api(), os.environ.get("TPUCTL_KUBE_SA_DIR") or SA_DIR
    if not api:
        return "no Kubernetes API in this pod's environment (KUBERNETES_SERVICE_HOST)"
    try:
        with open(os.path.join(sa, "token")) as f:
            token = f.read().strip()
    except OSError as e:
        return f"no service account token in the pod ({e.strerror}: {sa}/token)"
    body = json.dumps({"metadata": {"annotations": {ANNOTATION: why[:1000]}},
                       "spec": {"unschedulable": True}}).encode()
    req = urllib.request.Request(f"{api}/api/v1/nodes/{node}", data=body, method="PATCH", headers={
        "Content-Type": PATCH_TYPE, "Accept": "application/json", "Authorization": f"Bearer {token}"})
    ca = os.path.join(sa, "ca.crt")
    ctx = ssl.create_default_context(cafile=ca) if api.startswith("https:") and os.path.exists(ca) else None
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT, context=ctx) as resp:
            resp.read()
    except urllib.error.HTTPError as e:
        try:
            said = str(json.loads(e.read() or b"{}").get("message", ""))
        except ValueError:
            said = ""
        return f"the Kubernetes API refused to cordon node {node}: {e.code} {said or e.reason}"
    except (urllib.error.URLError, OSError) as e:
        return f"the Kubernetes API did not answer ({api}: {e})"
    return ""


def sick_here(store: BlobStore, host: str) -> str:
    """Why this host is marked sick (a record failures.mark_sick wrote, here or by another host's run doctor:
    doctor.py), "" when it is not or this is no GKE pod (no node to cordon)."""
    if not node_name():
        return ""
    try:
        raw = store.read(layout.host_sick(host))
        doc = json.loads(raw) if raw else None
    except (ValueError, OSError):
        return ""
    return str(doc.get("why") or "marked sick") if isinstance(doc, dict) else ""


def leave(store: BlobStore, host: str, why: str) -> tuple[bool, str]:
    """This GKE pod's host is sick: its node cordoned, and the host's sick record gone (the host is replaced, as
    the recovery watcher drops a replaced host's records: control/watch.py). (True, what to say) when the pod
    should exit for the JobSet's restart; (False, why not) when no node is known or it could not be cordoned."""
    node = node_name()
    if not node:
        return False, "no node to cordon (TPUCTL_NODE is unset)"
    refused = cordon(node, why)
    if refused:
        return False, f"its node could not be cordoned ({refused}): the run is not moved off it"
    try:
        store.delete(layout.host_sick(host))
    except Exception:  # noqa: BLE001 - the node is cordoned all the same; `status` says it until the record goes
        pass
    return True, (f"node {node} cordoned (`kubectl uncordon {node}` undoes it): the JobSet restarts the run and "
                  "the scheduler places it on another node")
