"""Kueue on a GKE cluster (issue 49 items 9-11): the queue a run is submitted to and how Kueue answers.

Kueue's objects and behaviour relied on (kubernetes-sigs/kueue; the version pinned by xpk's core/kueue_manager.py
is in GKE_FACTS.md):
- a JobSet opts in with the label `kueue.x-k8s.io/queue-name` naming a LocalQueue in its namespace (manifest.py
  QUEUE_LABEL); Kueue then makes a Workload for it, owned by the JobSet (ownerReferences), and keeps the JobSet
  suspended (`spec.suspend: true`) until the Workload is admitted (site/content/en/docs/tasks/run/jobsets.md);
- a Workload's conditions (apis/kueue/v1beta1/workload_types.go): `QuotaReserved` (False with reason Pending and
  a message such as "couldn't assign flavors to pod set ...: insufficient unused quota ..." while it waits),
  `Admitted`, `Evicted` (reason Preempted when a higher priority took its quota; the JobSet is suspended again and
  the Workload goes back to the queue), `Finished`;
- LocalQueue and PriorityClass names are DNS-1123 subdomains (Kubernetes object names);
- the API read is v1beta1: served by every Kueue release teams run, v0.17 included (its CRDs serve v1beta1 and
  store v1beta2: kueue-v0.17.8.yaml), with the same condition types."""
from __future__ import annotations

import re
import time
from typing import Any, Callable

from ...core.errors import ErrorKind, TpuctlError, bad_input
from . import kube

API = "kueue.x-k8s.io/v1beta1"
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")


def check_namespace(name: str | None) -> str:
    """`--namespace`: a Namespace's name is a DNS-1123 label (Kubernetes docs, "Namespaces"; apimachinery
    IsDNS1123Label: at most 63 characters); "" when not given."""
    if not name:
        return ""
    if len(name) > 63 or not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z", name):
        raise bad_input(f"invalid --namespace {name!r}", "a namespace name: at most 63 lowercase letters, digits "
                        "and '-', starting and ending with a letter or digit, e.g. --namespace team-a")
    return name


# A label value holds at most 63 characters (apimachinery IsValidLabelValue): the LocalQueue's name is the JobSet's
# `kueue.x-k8s.io/queue-name` label, so a longer one (a valid object name: 253) would fail the JobSet's create.
LABEL_VALUE_MAX = 63


def check_name(name: str | None, flag: str) -> str:
    """A LocalQueue's or PriorityClass's name as given to `flag`, checked offline ("" when not given)."""
    if not name:
        return ""
    if not _NAME_RE.match(name) or (flag == "--queue" and len(name) > LABEL_VALUE_MAX):
        raise bad_input(f"invalid {flag} {name!r}", "a Kubernetes name: lowercase letters, digits, '-' and '.'"
                        f"{', at most 63 of them' if flag == '--queue' else ''}, "
                        "e.g. --queue multislice-queue --priority medium")
    return name


def condition(workload: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in workload.get("status", {}).get("conditions", []) if c.get("type") == kind), None)


def queued_words(workload: dict[str, Any] | None) -> str:
    """`queued (Kueue: <why>)` for a Workload Kueue has not admitted, "" for one it has. An evicted one (Evicted
    True: preempted by a higher priority) is back in the queue, said as such: not a failure."""
    if workload is None:
        return "queued (Kueue: no Workload yet)"
    admitted = condition(workload, "Admitted")
    if admitted is not None and admitted.get("status") == "True":
        return ""
    evicted = condition(workload, "Evicted")
    if evicted is not None and evicted.get("status") == "True":
        return f"queued (Kueue: requeued after eviction, {evicted.get('reason') or 'Evicted'}: " \
               f"{evicted.get('message') or 'waiting for quota again'})"
    reserved = condition(workload, "QuotaReserved")
    why = str(reserved.get("message") or reserved.get("reason") or "") if reserved is not None else ""
    return f"queued (Kueue: {why or 'waiting for admission'})"


# Kueue labels each Workload with its job's UID (kueue pkg/controller/constants JobUIDLabel: "the label key in the
# workload resource, that holds the UID of the owner job"): the run's Workload is found by it, not by listing every
# Workload of the namespace at each look (issue 57 item 6).
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def workload_of(api: Any, jobset: dict[str, Any]) -> dict[str, Any] | None:
    """The Workload Kueue made for `jobset` (labelled with its UID and owned by it), None before Kueue made one."""
    ns, name = jobset["metadata"].get("namespace") or "default", jobset["metadata"]["name"]
    found = read(api, f"/apis/{API}/namespaces/{ns}/workloads",
                     [("labelSelector", f"{JOB_UID_LABEL}={jobset['metadata'].get('uid', '')}")]) or {}
    return next((w for w in found.get("items", []) if any(r.get("kind") == "JobSet" and r.get("name") == name
                                                         for r in w["metadata"].get("ownerReferences", []))), None)


# Kueue's v1beta1 LocalQueue, ClusterQueue and Workload are converted by Kueue's own webhook (their CRDs:
# `conversion: strategy: Webhook`, kueue-v0.17.8.yaml), so while its one replica is down a read fails: 500,
# 'conversion webhook for kueue.x-k8s.io/v1beta2, Kind=Workload failed: Post "https://kueue-webhook-service...".
# Waited out as JobSet's webhooks are (jobset_install.ready_seconds), then said.
CONVERSION_DOWN = "conversion webhook for kueue.x-k8s.io"


def read(api: Any, path: str, query: list[tuple[str, str]] | None = None,
         sleep: Callable[[float], None] = time.sleep) -> dict[str, Any] | None:
    """kube.get of a Kueue object or list, retried while Kueue's conversion webhook does not serve."""
    from .jobset_install import ready_seconds
    end = time.monotonic() + ready_seconds()
    while True:
        try:
            return kube.get(api, path, query)
        except kube.KubeError as e:
            if e.status < 500 or CONVERSION_DOWN not in e.message:
                raise
            if time.monotonic() >= end:
                raise TpuctlError(ErrorKind.TIMEOUT, f"Kueue's conversion webhook did not serve for "
                                  f"{ready_seconds():.0f}s: {e.message}", "`kubectl -n kueue-system get pods` and "
                                  "its logs say why; Kueue's one replica may be restarting") from None
            sleep(1.0)


def is_workload_priority(api: Any, name: str) -> bool:
    """Whether `name` is a Kueue WorkloadPriorityClass (cluster-scoped; Kueue reads its label first: manifest.py
    WORKLOAD_PRIORITY_LABEL). Its name goes in a label: one longer than 63 characters could not be written."""
    if not name or read(api, f"/apis/{API}/workloadpriorityclasses/{name}") is None:
        return False
    if len(name) > LABEL_VALUE_MAX:
        raise bad_input(f"--priority {name}: a WorkloadPriorityClass name over {LABEL_VALUE_MAX} characters cannot "
                        "be the JobSet's label", "name a shorter one")
    return True


def local_queues(api: Any, namespace: str) -> list[str] | None:
    """The namespace's LocalQueues; None when the cluster runs no Kueue (its API is not served: 404)."""
    found = read(api, f"/apis/{API}/namespaces/{namespace}/localqueues")
    return None if found is None else sorted(str(q["metadata"]["name"]) for q in found.get("items", []))


def all_local_queues(api: Any) -> dict[str, list[str]]:
    """Namespace -> its LocalQueues, across the cluster (the cluster-wide list Kubernetes serves at
    /apis/GROUP/VERSION/PLURAL: "API Concepts", resource URIs)."""
    found = read(api, f"/apis/{API}/localqueues") or {}
    out: dict[str, list[str]] = {}
    for q in found.get("items", []):
        out.setdefault(str(q["metadata"].get("namespace") or "default"), []).append(str(q["metadata"]["name"]))
    return {ns: sorted(names) for ns, names in sorted(out.items())}


# Kueue's default LocalQueue (kueue pkg/controller/jobframework/defaults.go `ApplyDefaultLocalQueue`, the
# LocalQueueDefaulting feature): a job without the queue label in a namespace with a LocalQueue of this name is
# labelled with it by Kueue's webhook. tpuctl takes it the same way, and writes it on the JobSet.
DEFAULT_LOCAL_QUEUE = "default"


def pick_queue(api: Any, namespace: str, queue: str, priority: str) -> str:
    """The LocalQueue a run is submitted to: `queue` when the namespace has it; without one, on a Kueue cluster, the
    namespace's LocalQueue `default` (Kueue's own default), else its only LocalQueue; "" on a cluster without
    Kueue. Refused, before anything is sent, when Kueue runs and the namespace has no LocalQueue: a JobSet without
    the queue label runs outside Kueue's quota with Kueue's default `manageJobsWithoutQueueName: false`, and is
    suspended for ever with `true` (kueue v0.17 jobframework/defaults.go `WorkloadShouldBeSuspended`;
    GKE_FACTS.md). A `priority` must name a PriorityClass (the API server refuses a pod naming a missing one: "no
    PriorityClass with name ... was found", Kubernetes docs "Pod Priority and Preemption")."""
    if priority and not is_workload_priority(api, priority) and \
            kube.get(api, f"/apis/scheduling.k8s.io/v1/priorityclasses/{priority}") is None:
        found = kube.get(api, "/apis/scheduling.k8s.io/v1/priorityclasses") or {}
        names = sorted(str(p["metadata"]["name"]) for p in found.get("items", []))
        wpcs = sorted(str(p["metadata"]["name"]) for p in (
            read(api, f"/apis/{API}/workloadpriorityclasses") or {}).get("items", []))
        raise bad_input(f"--priority {priority}: the cluster has no such PriorityClass or Kueue "
                        "WorkloadPriorityClass", "the cluster has: " + (", ".join(names) or "none") +
                        (f"; WorkloadPriorityClasses: {', '.join(wpcs)}" if wpcs else "") +
                        " (`tpuctl up --kueue` makes xpk's)")
    queues = local_queues(api, namespace)
    if queues is None:
        if queue:
            raise bad_input(f"--queue {queue}: the cluster runs no Kueue", "leave --queue out, or `tpuctl up "
                            "--kueue` on a cluster tpuctl makes")
        return ""
    if queue:
        if queue not in queues:
            raise bad_input(f"--queue {queue}: namespace {namespace} has no such LocalQueue",
                            "it has: " + (", ".join(queues) or "none"))
        return queue
    if DEFAULT_LOCAL_QUEUE in queues:
        return DEFAULT_LOCAL_QUEUE
    if len(queues) > 1:
        raise bad_input(f"the cluster runs Kueue and namespace {namespace} has {len(queues)} LocalQueues",
                        "name one: " + " or ".join(f"--queue {q}" for q in queues))
    if not queues:
        elsewhere = all_local_queues(api)
        raise bad_input(f"the cluster runs Kueue and namespace {namespace} has no LocalQueue: the run would "
                        "bypass Kueue's quota (or wait for ever, with manageJobsWithoutQueueName)",
                        ("LocalQueues are in: " + "; ".join(f"--namespace {ns} (--queue {', '.join(q)})"
                                                            for ns, q in elsewhere.items()))
                        if elsewhere else "the cluster has no LocalQueue: ask its owner for one")
    return queues[0]


def check_flavors(api: Any, namespace: str, queue: str, accelerator: str, topology: str) -> str:
    """A run placed by a team's LocalQueue (`--queue` on an adopted cluster: its pods carry no tpuctl node selector,
    manifest.RunObjects.own_pools) needs a ResourceFlavor of the queue's ClusterQueue that covers google.com/tpu and
    whose nodeLabels do not exclude the run's accelerator and topology (Kueue assigns a flavor whose resource group
    covers the resource and adds its nodeLabels to the pods' nodeSelector: kueue site docs "Resource Flavor",
    "Cluster Queue"; xpk's flavors label the accelerator and topology alone, GKE_FACTS.md). Returns the ClusterQueue's
    name; refused, one line, with what the flavors cover, when none fits."""
    from .manifest import ACCELERATOR_LABEL, TOPOLOGY_LABEL, TPU_RESOURCE
    lq = read(api, f"/apis/{API}/namespaces/{namespace}/localqueues/{queue}") or {}
    cq_name = str(lq.get("spec", {}).get("clusterQueue") or "")
    cq = read(api, f"/apis/{API}/clusterqueues/{cq_name}") if cq_name else None
    seen = []
    for group in (cq or {}).get("spec", {}).get("resourceGroups", []):
        if TPU_RESOURCE not in group.get("coveredResources", []):
            continue
        for f in group.get("flavors", []):
            rf = kube.get(api, f"/apis/{API}/resourceflavors/{f['name']}") or {}
            labels = rf.get("spec", {}).get("nodeLabels") or {}
            if labels.get(ACCELERATOR_LABEL, accelerator) == accelerator and \
                    labels.get(TOPOLOGY_LABEL, topology) == topology:
                return cq_name
            seen.append(f"{f['name']} ({labels.get(ACCELERATOR_LABEL, 'any accelerator')} "
                        f"{labels.get(TOPOLOGY_LABEL, 'any topology')})")
    raise bad_input(f"--queue {queue}: ClusterQueue {cq_name or '?'} has no ResourceFlavor for {accelerator} "
                    f"{topology}, the cluster's TPU shape", "its google.com/tpu flavors: " + (", ".join(seen) or
                                                                                            "none") +
                    "; name a queue whose flavors cover this shape")


def covers(api: Any, namespace: str, queue: str, resources: tuple[str, ...] = ("cpu", "memory")) -> bool:
    """Whether the ClusterQueue behind LocalQueue `queue` covers every one of `resources` in some resource group:
    Kueue never admits a Workload whose pods request a resource its ClusterQueue does not cover ("resource R
    unavailable in ClusterQueue": kubernetes-sigs/kueue pkg/scheduler/flavorassigner/flavorassigner.go
    findFlavorForPodSetResource). False when the queue or its ClusterQueue cannot be read: the pods then request
    none (manifest.POD_REQUESTS), as a run admitted anywhere."""
    lq = read(api, f"/apis/{API}/namespaces/{namespace}/localqueues/{queue}") or {}
    cq_name = str(lq.get("spec", {}).get("clusterQueue") or "")
    cq = read(api, f"/apis/{API}/clusterqueues/{cq_name}") if cq_name else None
    groups = (cq or {}).get("spec", {}).get("resourceGroups", [])
    return bool(groups) and all(any(r in g.get("coveredResources", []) for g in groups) for r in resources)
