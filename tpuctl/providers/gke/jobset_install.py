"""JobSet on the cluster: the pinned release, shipped inside the package, applied server-side when the cluster lacks
it; an older JobSet is refused with the command that upgrades it (xpk#443: an older JobSet than the manifest needs
drops or rejects the fields it does not know).

The shipped `jobset-v0.10.1.yaml` is the release's `manifests.yaml` as its Makefile makes it (`make artifacts
IMAGE_REGISTRY=registry.k8s.io/jobset`, .github/ISSUE_TEMPLATE/new-release.md: `kustomize build config/default`
after `kustomize edit set image controller=registry.k8s.io/jobset/jobset:v0.10.1`), assembled from
kubernetes-sigs/jobset at tag v0.10.1 with `kubectl kustomize config/default` (kustomize v5.5.0) and that one image
line set, because the GitHub release asset itself could not be fetched here. Install as its README says: `kubectl
apply --server-side -f .../releases/download/v0.10.1/manifests.yaml`; xpk adds --force-conflicts
(core/cluster.py)."""
from __future__ import annotations

import functools
import re
import time
from pathlib import Path
from typing import Any, Callable

from ...core import knobs
from ...core.errors import ErrorKind, TpuctlError
from . import kube, manifest, schema

# JobSet's webhooks (the release's mjobset.kb.io, vjobset.kb.io, mpod.kb.io, vpod.kb.io) are `failurePolicy: Fail`
# and serve only once the controller's certificate rotator is ready (v0.10.1 main.go: the controllers and webhooks
# are set up after `<-certsReady`, and the readiness probe waits on it too; pkg/util/cert/cert.go). Until then
# every JobSet create is refused with 'failed calling webhook "mjobset.kb.io"'. So `up` waits for the CRD to be
# Established, the controller Deployment Available and a server-side dry run of a JobSet (dryRun=All, through
# admission: Kubernetes docs "API Concepts: Dry-run") to pass; and a submit that still meets a webhook not serving
# (the controller restarting) retries within the same deadline (runs.py dispatch).
WEBHOOK_DOWN = "failed calling webhook"
PROBE_NAME = "tpuctl-admission-check"   # never stored: dry runs only

JOBSET_VERSION = "v0.10.1"
RELEASE_FILE = Path(__file__).with_name(f"jobset-{JOBSET_VERSION}.yaml")
RELEASE_URL = f"https://github.com/kubernetes-sigs/jobset/releases/download/{JOBSET_VERSION}/manifests.yaml"
UPGRADE = f"kubectl apply --server-side --force-conflicts -f {RELEASE_URL}"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/jobsets.jobset.x-k8s.io"
# The controller as the release names it (config/default: namespace jobset-system, namePrefix jobset-).
CONTROLLER_PATH = "/apis/apps/v1/namespaces/jobset-system/deployments/jobset-controller-manager"

# Every kind in the release manifest: its plural and whether it lives in a namespace (Kubernetes API reference).
_KINDS = {"Namespace": ("namespaces", False), "CustomResourceDefinition": ("customresourcedefinitions", False),
          "ServiceAccount": ("serviceaccounts", True), "Role": ("roles", True), "ClusterRole": ("clusterroles", False),
          "RoleBinding": ("rolebindings", True), "ClusterRoleBinding": ("clusterrolebindings", False),
          "ConfigMap": ("configmaps", True), "Secret": ("secrets", True), "Service": ("services", True),
          "Deployment": ("deployments", True),
          "MutatingWebhookConfiguration": ("mutatingwebhookconfigurations", False),
          "ValidatingWebhookConfiguration": ("validatingwebhookconfigurations", False)}
_TAG = re.compile(r":v(\d+)\.(\d+)\.(\d+)(?:@.*)?$")


@functools.lru_cache(maxsize=1)
def release_objects() -> tuple[dict[str, Any], ...]:
    return manifest.load_all(RELEASE_FILE)


def release_crd() -> dict[str, Any]:
    (crd,) = [o for o in release_objects() if o["kind"] == "CustomResourceDefinition"]
    return crd


def path_of(obj: dict[str, Any]) -> str:
    plural, namespaced = _KINDS[obj["kind"]]
    return kube.object_path(obj, plural, namespaced)


def installed_version(api: Any) -> tuple[int, int, int] | None:
    """The controller's version from its image tag; None when it is not the release's Deployment (installed some
    other way) or its tag is not a version."""
    dep = kube.get(api, CONTROLLER_PATH)
    if dep is None:
        return None
    for c in dep.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        m = _TAG.search(str(c.get("image", "")))
        if m:
            return (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    return None


def _pinned() -> tuple[int, int, int]:
    m = _TAG.search(":" + JOBSET_VERSION)
    assert m
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)))


def ready_seconds() -> float:
    """How long `up` waits for JobSet's controller and webhooks, and `submit` for its webhooks
    (TPUCTL_GKE_JOBSET_READY_SECONDS, 300 s: the controller pulls its image and makes its certificates)."""
    return knobs.number("TPUCTL_GKE_JOBSET_READY_SECONDS", 300)


def _probe() -> dict[str, Any]:
    """The smallest JobSet the webhooks and the schema accept, for a dry run."""
    pod = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": PROBE_NAME, "namespace": "default"},
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {"template": {
                "spec": pod}}}}]}}


def webhook_down(e: kube.KubeError) -> bool:
    return e.status >= 500 and WEBHOOK_DOWN in e.message


def _conditions(obj: dict[str, Any] | None) -> dict[str, str]:
    return {str(c.get("type")): str(c.get("status")) for c in (obj or {}).get("status", {}).get("conditions", [])}


def available(deployment: dict[str, Any]) -> bool:
    """A Deployment's Available condition (apps/v1 DeploymentCondition): its pods pass their readiness probes."""
    return _conditions(deployment).get("Available") == "True"


def wait_ready(api: Any, progress: Callable[[str], None] = lambda s: None,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Until JobSet takes a JobSet: its CRD Established, its controller Available (when it is the release's
    Deployment: one installed some other way is not looked for), and a dryRun=All JobSet through admission."""
    end = clock() + ready_seconds()
    said = ""
    step = 0.1
    while True:
        if _conditions(kube.get(api, CRD_PATH)).get("Established") != "True":
            state = "its CRD not yet Established"
        else:
            dep = kube.get(api, CONTROLLER_PATH)
            if dep is not None and not available(dep):
                state = "its controller not yet Available"
            else:
                probe = _probe()
                try:
                    kube.apply(api, f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{PROBE_NAME}",
                               probe, dry_run=True)
                    return
                except kube.KubeError as e:
                    if not webhook_down(e):
                        raise
                    state = "its webhooks not yet serving"
        if state != said:
            progress(f"waiting for JobSet: {state}")
            said = state
        if clock() >= end:
            raise TpuctlError(ErrorKind.TIMEOUT, f"JobSet in the cluster: {state} after {ready_seconds():.0f}s",
                              "`kubectl -n jobset-system get pods` and its logs say why; `tpuctl up` again waits "
                              "again (TPUCTL_GKE_JOBSET_READY_SECONDS sets how long)")
        sleep(step)
        step = min(step * 2, 5.0)


def ensure_jobset(api: Any, sample: dict[str, Any] | None = None,
                  progress: Callable[[str], None] = lambda s: None) -> str:
    """JobSet ready for tpuctl's manifests; returns what was done ("installed v0.10.1", "found v0.10.1").
    `sample`: a JobSet as tpuctl writes it: an installed CRD whose schema would drop any of its fields is refused
    even when the controller's version cannot be read."""
    crd = kube.get(api, CRD_PATH)
    if crd is None:
        progress(f"installing JobSet {JOBSET_VERSION}")
        for obj in release_objects():
            kube.apply(api, path_of(obj), obj)
        wait_ready(api, progress)
        return f"installed {JOBSET_VERSION}"
    have = installed_version(api)
    if have is not None and have < _pinned():
        raise TpuctlError(ErrorKind.INPUT, f"the cluster runs JobSet v{'.'.join(map(str, have))}; tpuctl's runs need "
                          f"{JOBSET_VERSION} or later", f"upgrade it: {UPGRADE}")
    if sample is not None:
        served = schema.version_schema(crd, sample["apiVersion"].split("/")[1])
        lost = schema.dropped(sample, served) if served is not None else ["apiVersion " + sample["apiVersion"]]
        if lost:
            raise TpuctlError(ErrorKind.INPUT, "the cluster's JobSet does not know fields tpuctl's runs use: "
                              + ", ".join(lost[:3]), f"upgrade it: {UPGRADE}")
    wait_ready(api, progress)   # found, but perhaps just installed by another `up`, or its controller restarting
    return f"found {'v' + '.'.join(map(str, have)) if have else 'JobSet (version unknown)'}"
