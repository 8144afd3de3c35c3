"""`up --provider gke --kueue` (issue 49 item 10): Kueue in a cluster tpuctl makes, with the queue objects xpk makes,
so that runs share its TPUs through Kueue (kueue.py) rather than tpuctl's own queue.

The shipped `kueue-v0.17.8.yaml` is the release's `manifests.yaml` as its Makefile makes it (`make
release-artifacts IMAGE_REGISTRY=registry.k8s.io/kueue GIT_TAG=v0.17.8`, .github/ISSUE_TEMPLATE/NEW_RELEASE.md:
`kustomize edit set image controller=registry.k8s.io/kueue/kueue:v0.17.8` in config/components/manager, then
`kustomize build config/default`), assembled from kubernetes-sigs/kueue at tag v0.17.8 with `kubectl kustomize
config/default` (kustomize v5.5.0), because the GitHub release asset cannot be fetched here. xpk pins the v0.17
line: its newest source read (AI-Hypercomputer/xpk 367c838, 2026-06-25) has `KUEUE_VERSION = Version("v0.17.1")`
in src/xpk/core/kueue_manager.py (an older copy, 04890e1, had v0.12.2). v0.17.8 is the newest of the v0.17 line
in kubernetes-sigs/kueue's tags. Installed as its README says: `kubectl apply --server-side -f
.../releases/download/v0.17.8/manifests.yaml`.

Edited by tpuctl (issue 57 item 5), so that what is shipped is what is applied: the release enables 17 integrations,
`pod`, `deployment` and `statefulset` among them, and registers a mutating and a validating webhook for each, all
`failurePolicy: Fail` in every namespace but kube-system and kueue-system (an integration not enabled still gets a
no-op webhook: Kueue's cmd/kueue/main.go `noop.SetupWebhook`). With Kueue's one replica down, every pod, Deployment,
StatefulSet and Job create in the cluster would be refused, in someone else's cluster too. The shipped file keeps
the JobSet integration alone (`integrations.frameworks` in the kueue-manager-config ConfigMap) and drops the 34
webhooks of the other integrations (pods, deployments, statefulsets, jobs, and the 14 other job kinds), keeping
Kueue's own (clusterqueue, cohort, resourceflavor, workload) and the JobSet ones (mjobset.kb.io, vjobset.kb.io).

The queue objects, as xpk's src/xpk/templates/kueue_config.yaml.j2 makes them (read at commit 8c43c44: its
ResourceFlavor's nodeLabels, the ClusterQueue's `namespaceSelector: {}`, `reclaimWithinCohort: Never`,
`withinClusterQueue: LowerPriority`, the LocalQueue in `default`, the PriorityClasses' values):
one ResourceFlavor for the node pools' TPU shape (their accelerator and topology labels, and the google.com/tpu
toleration: xpk's flavor has none, its pods carry it, as tpuctl's do; Kueue adds a flavor's tolerations to the pods
it admits, so a pod that lacks it still lands on the TPU nodes' taint; beyond xpk's, the node label and toleration
of tpuctl's own pools, `tpuctl-cluster=<cluster>`: queue_objects), a ClusterQueue whose google.com/tpu
nominalQuota is every node pool's chips (cpu and memory covered too: UNBOUNDED) with
`preemption.withinClusterQueue: LowerPriority`, a LocalQueue in the runs' namespace (`up --namespace`, default
`default`), and xpk's five
PriorityClasses (very-low 100 ... very-high 1000). Kueue's webhooks, like JobSet's, are `failurePolicy: Fail`
until its controller serves: they are applied once its Deployment is Available, retried while a webhook is down."""
from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any, Callable

from ...core.errors import ErrorKind, TpuctlError
from . import jobset_install, kube, kueue, manifest
from .tputypes import SliceShape

KUEUE_VERSION = "v0.17.8"
RELEASE_FILE = Path(__file__).with_name(f"kueue-{KUEUE_VERSION}.yaml")
CONTROLLER_PATH = "/apis/apps/v1/namespaces/kueue-system/deployments/kueue-controller-manager"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/workloads.kueue.x-k8s.io"
# xpk's names (core/kueue_manager.py LOCAL_QUEUE_NAME, CLUSTER_QUEUE_NAME), so xpk's manifests find the queue too
LOCAL_QUEUE = "multislice-queue"
CLUSTER_QUEUE = "cluster-queue"
# xpk's PriorityClasses (templates/kueue_config.yaml.j2: very-low 100, low 250, medium 500, high 750, very-high
# 1000; medium is xpk's default --priority)
PRIORITIES = {"very-low": 100, "low": 250, "medium": 500, "high": 750, "very-high": 1000}
# cpu and memory covered beside google.com/tpu. Kueue refuses a Workload whose pods request a resource no resource
# group of the ClusterQueue covers ("resource cpu unavailable in ClusterQueue": kubernetes-sigs/kueue
# pkg/scheduler/flavorassigner/flavorassigner.go findFlavorForPodSetResource; a zero request passes), so without
# them any pod asking for cpu or memory (a sidecar, a user's own manifest, an xpk workload with requests) would
# never be admitted. xpk covers them when given --cpu-limit/--memory-limit (core/kueue_manager.py
# `__build_template_context`: coveredResources [managed_resource, "cpu", "memory"] in the one flavor). tpuctl's
# quota for them is no limit: the TPU chips are what the queue shares, and each node's own allocatable bounds
# what its pods get (the kube-scheduler's check).
UNBOUNDED = {"cpu": 1_000_000, "memory": "1000Ti"}
_PLURALS = {"APIService": ("apiservices", False)}


@functools.lru_cache(maxsize=1)
def release_objects() -> tuple[dict[str, Any], ...]:
    return manifest.load_all(RELEASE_FILE)


def _path(obj: dict[str, Any]) -> str:
    if obj["kind"] in _PLURALS:
        plural, namespaced = _PLURALS[obj["kind"]]
        return kube.object_path(obj, plural, namespaced)
    return jobset_install.path_of(obj)


def flavor_name(shape: SliceShape) -> str:
    return f"tpuctl-{shape.accelerator}-{shape.topology}"


# The flavor names tpuctl's own node pools (issue 57 item 4: they carry the Kubernetes label and NoSchedule taint
# `tpuctl-cluster=<cluster>`, container.build_node_pool), per Kueue's v1beta1 ResourceFlavorSpec
# (kubernetes-sigs/kueue apis/kueue/v1beta1/resourceflavor_types.go): `nodeLabels` "associate the ResourceFlavor
# with Nodes that have the same labels" and are injected into the admitted pods' nodeSelector (at most 8), and
# `tolerations` are "extra tolerations that will be added to the pods admitted in the quota associated with this
# resource flavor" (at most 8; CEL rules: operator Equal or Exists, no value with Exists, effect NoSchedule,
# PreferNoSchedule or NoExecute). So a workload admitted through this queue (an xpk one too, whose pods select only
# the accelerator and topology) lands on this cluster's pools and tolerates their taint, not on another team's
# pools of the same shape. `nodeTaints` is left out: it would make Kueue refuse a workload whose pods lack the
# toleration, where the flavor's `tolerations` give it to them.
def queue_objects(shape: SliceShape, slices: int, namespace: str = manifest.DEFAULT_NAMESPACE,
                  cluster: str = "") -> list[dict[str, Any]]:
    """The ResourceFlavor, ClusterQueue, LocalQueue and PriorityClasses for `slices` node pools of `shape` made by
    tpuctl cluster `cluster`; the LocalQueue in `namespace`."""
    api = kueue.API
    own = {manifest.LABEL_CLUSTER: cluster} if cluster else {}
    flavor = {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": flavor_name(shape)}, "spec": {
        "nodeLabels": {manifest.ACCELERATOR_LABEL: shape.accelerator, manifest.TOPOLOGY_LABEL: shape.topology, **own},
        "tolerations": [{"key": manifest.TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
                        *({"key": k, "operator": "Equal", "value": v, "effect": "NoSchedule"}
                          for k, v in own.items())]}}
    queue = {"apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE}, "spec": {
        "namespaceSelector": {},
        "preemption": {"reclaimWithinCohort": "Never", "withinClusterQueue": "LowerPriority"},
        "resourceGroups": [{"coveredResources": [manifest.TPU_RESOURCE, *UNBOUNDED], "flavors": [{
            "name": flavor_name(shape),
            "resources": [{"name": manifest.TPU_RESOURCE, "nominalQuota": shape.chips * slices},
                          *({"name": r, "nominalQuota": q} for r, q in UNBOUNDED.items())]}]}]}}
    local = {"apiVersion": api, "kind": "LocalQueue", "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
             "spec": {"clusterQueue": CLUSTER_QUEUE}}
    prios = [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": n}, "value": v,
              "globalDefault": False, "description": f"xpk's {n} priority"} for n, v in PRIORITIES.items()]
    return [flavor, queue, local, *prios]


def _queue_path(obj: dict[str, Any]) -> str:
    plural = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues",
              "PriorityClass": "priorityclasses"}[obj["kind"]]
    return kube.object_path(obj, plural, obj["kind"] == "LocalQueue")


def ensure_kueue(api: Any, shape: SliceShape, slices: int, progress: Callable[[str], None] = lambda s: None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 adopted: bool = False, namespace: str = manifest.DEFAULT_NAMESPACE, cluster: str = "") -> str:
    """Kueue's release (when the cluster lacks it), then the queue objects; returns what was done. In an adopted
    cluster (`up --gke-cluster C --kueue`) a Kueue already there is its owner's: nothing is applied to it (its
    ClusterQueue may be named as xpk names it, `cluster-queue`, and ours would replace its quota)."""
    said = "found"
    if kube.get(api, CRD_PATH) is None:
        progress(f"installing Kueue {KUEUE_VERSION}")
        for obj in release_objects():
            kube.apply(api, _path(obj), obj)
        said = "installed"
    elif adopted:
        return "found (the cluster's own, left as it is: `submit --queue` picks one of its LocalQueues)"
    end = clock() + jobset_install.ready_seconds()
    step = 0.1
    todo = queue_objects(shape, slices, namespace, cluster)
    while todo:
        dep = kube.get(api, CONTROLLER_PATH)
        ready = dep is None or jobset_install.available(dep)   # a Kueue installed some other way: not looked for
        try:
            if ready:
                kube.apply(api, _queue_path(todo[0]), todo[0])
                todo.pop(0)
                continue
            state = "its controller not yet Available"
        except kube.KubeError as e:
            if not jobset_install.webhook_down(e):
                raise
            state = "its webhooks not yet serving"
        if clock() >= end:
            raise TpuctlError(ErrorKind.TIMEOUT, f"Kueue in the cluster: {state} after "
                              f"{jobset_install.ready_seconds():.0f}s", "`kubectl -n kueue-system get pods` and its "
                              "logs say why; `tpuctl up` again waits again")
        progress(f"waiting for Kueue: {state}")
        sleep(step)
        step = min(step * 2, 5.0)
    return f"{said} {KUEUE_VERSION}; LocalQueue {namespace}/{LOCAL_QUEUE} ({shape.chips * slices} google.com/tpu)"
