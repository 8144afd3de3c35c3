"""What tpuctl reads of a run on GKE: its JobSet and pods (found by tpuctl's labels, manifest.py), the JobSet's end
(conditions Completed / Failed), each pod's exit code, and the words `submit`, `logs -f`, `status` and `jobs` show:
the JobSet's state and restarts, its pods, and a pod stuck on its image or on a node."""
from __future__ import annotations

import time
from typing import Any

from ...core import knobs
from . import kube, manifest

def pods_of(api: Any, run_id: str, namespace: str = manifest.DEFAULT_NAMESPACE) -> list[dict[str, Any]]:
    found = kube.request(api, "GET", f"/api/v1/namespaces/{namespace}/pods",
                         query=[("labelSelector", f"{manifest.LABEL_RUN}={run_id.lower()}")])
    items: list[dict[str, Any]] = found.get("items", []) if found else []
    return sorted(items, key=lambda p: str(p["metadata"]["name"]))


def jobsets_of(api: Any, cluster: str) -> list[dict[str, Any]]:
    """The cluster's JobSets in every namespace (runs may each have their own: `submit --namespace`)."""
    found = kube.get(api, "/apis/jobset.x-k8s.io/v1alpha2/jobsets",
                     [("labelSelector", f"{manifest.LABEL_CLUSTER}={cluster}")])
    return list(found.get("items", [])) if found else []


def condition(js: dict[str, Any]) -> str:
    """"Completed", "Failed", or "" while it runs."""
    for c in js.get("status", {}).get("conditions", []):
        if c.get("type") in ("Completed", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return ""


def exit_code(pod: dict[str, Any]) -> int | None:
    for cs in pod.get("status", {}).get("containerStatuses", []):
        term = cs.get("state", {}).get("terminated")
        if term is not None:
            return int(term.get("exitCode", 0))
    return None


def words(js: dict[str, Any], pods: list[dict[str, Any]]) -> str:
    """`JobSet tpuctl-ID running, restarts 1 of 3; pods: 4 Running on gke-...-0, ...`: what `submit`, `logs -f`
    and `jobs` show of the run beside its log."""
    st = js.get("status", {})
    state = condition(js).lower() or "running"
    reason = next((c.get("reason", "") for c in st.get("conditions", []) if c.get("type") == condition(js)), "")
    phases: dict[str, int] = {}
    for p in pods:
        phase = p.get("status", {}).get("phase", "Pending")
        phases[phase] = phases.get(phase, 0) + 1
    nodes = sorted({str(p["spec"].get("nodeName")) for p in pods if p.get("spec", {}).get("nodeName")})
    pods_text = (", ".join(f"{n} {ph}" for ph, n in sorted(phases.items())) or "none yet") + \
        (f" on {', '.join(nodes[:4])}" + (f" and {len(nodes) - 4} more nodes" if len(nodes) > 4 else "")
         if nodes else "")
    stuck = stuck_words(pods)
    return (f"JobSet {js['metadata']['name']} {state}" + (f" ({reason})" if reason else "") +
            f", restarts {st.get('restarts', 0)} of {js['spec'].get('failurePolicy', {}).get('maxRestarts', 0)}"
            f"; pods: {pods_text}" + (f"; {stuck}" if stuck else ""))


# A container that cannot start, as the kubelet reports it in containerStatuses[].state.waiting.reason (Kubernetes
# docs, "Images": ErrImagePull, then ImagePullBackOff; InvalidImageName for a reference it cannot parse).
PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")


def stuck_seconds() -> float:
    """How long a pod may wait on its image or on a node before `status`, `jobs` and `submit` say it is stuck
    (TPUCTL_GKE_STUCK_SECONDS, 180 s: a first pull of a large image, or a node pool GKE is still repairing, takes
    a while and ends by itself; 0 says it at once)."""
    return knobs.number("TPUCTL_GKE_STUCK_SECONDS", 180)


def _since(stamp: str | None, now: float) -> float | None:
    """Seconds since a Kubernetes timestamp (RFC 3339, "2026-11-28T17:00:00Z"), None when there is none."""
    if not stamp:
        return None
    import datetime as dt
    try:
        return now - dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def stuck_words(pods: list[dict[str, Any]], now: float | None = None) -> str:
    """What keeps a run's pods Pending past stuck_seconds(), said with how long, where and the fix (issue 49 item
    4): an image the node cannot pull (waiting since the kubelet took the pod: `status.startTime`, "RFC 3339 date
    and time at which the object was acknowledged by the Kubelet"), or no node the scheduler can put the pod on
    (PodScheduled False, reason Unschedulable, since that condition's lastTransitionTime: Kubernetes docs, "Pod
    Lifecycle: Pod conditions"); "" when nothing does, or not for that long yet. A pod without those times is taken
    as stuck from now: said once the threshold is 0."""
    now = time.time() if now is None else now
    limit = stuck_seconds()
    for p in pods:
        name = p.get("metadata", {}).get("name", "?")
        status = p.get("status", {})
        for cs in status.get("containerStatuses", []):
            waiting = cs.get("state", {}).get("waiting") or {}
            took = _since(status.get("startTime"), now) or 0.0
            if waiting.get("reason") in PULL_FAILURES and took >= limit:
                image = next((c.get("image") for c in p.get("spec", {}).get("containers", [])), "?")
                return (f"pod {name} stuck for {took / 60:.0f} min: cannot pull image {image} ({waiting['reason']}: "
                        f"{waiting.get('message', '')}); fix: `tpuctl up --image` with an image the node pools can "
                        "pull (a private cluster needs egress to its registry, or the image in Artifact Registry)")
        for c in status.get("conditions", []):
            took = _since(c.get("lastTransitionTime"), now) or 0.0
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable" \
                    and took >= limit:
                why = c.get("message") or "no node fits"
                return (f"pod {name} stuck for {took / 60:.0f} min: unschedulable ({why}); fix: check the TPU node "
                        "pools are there and RUNNING (`tpuctl status`), or that no other run holds them")
    return ""
