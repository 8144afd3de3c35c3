"""Kueue's admission, as a controller beside the fake JobSet controller (k8s_cluster.py): what tpuctl's GKE runs see
of a team's Kueue cluster (issue 49 item 11). Each behaviour with its source in kubernetes-sigs/kueue (v0.14, the
line xpk's pinned v0.17 keeps):
- a JobSet labelled `kueue.x-k8s.io/queue-name` is suspended on creation by Kueue's JobSet webhook
  (pkg/controller/jobframework/defaults.go `ApplyDefaultForSuspend`: "Jobs with queue names ... are default
  suspended"; done in k8s_server.py's admission, where the webhook runs);
- Kueue makes one Workload per such JobSet, owned by it (ownerReferences: deleted with it), with the LocalQueue as
  `spec.queueName`, the priority of its pods' PriorityClass (`spec.priority`, `spec.priorityClassName`), and a pod
  set per replicated job of `replicas x parallelism` pods (pkg/controller/jobs/jobset `PodSets`);
- the ClusterQueue the LocalQueue points at (`spec.clusterQueue`) admits Workloads, highest priority first, then
  oldest (StrictFIFO/BestEffortFIFO ordering), while their `google.com/tpu` fits the flavor's `nominalQuota` less
  what admitted Workloads use; on admission the Workload gets conditions QuotaReserved and Admitted True and its
  JobSet is unsuspended (apis/kueue/v1beta1/workload_types.go; site docs "Run A JobSet");
- one that does not fit stays pending: QuotaReserved False, reason Pending, message "couldn't assign flavors to pod
  set NAME: insufficient unused quota for google.com/tpu in flavor F, N more needed"
  (pkg/scheduler/flavorassigner/flavorassigner.go);
- with `preemption.withinClusterQueue: LowerPriority` (xpk's kueue_config template), a pending Workload that would
  fit once lower-priority admitted ones are gone evicts them: condition Evicted True, reason Preempted
  (workload_types.go WorkloadEvictedByPreemption), Admitted and QuotaReserved False, the JobSet suspended again,
  and the Workload goes back to the queue, to be admitted again when quota frees (docs "Preemption");
- a Workload whose JobSet completed or failed is Finished and holds no quota;
- a Workload whose pods request a resource (non-zero; a container's requests, else its limits, which Kubernetes
  copies to requests) that no resource group of the ClusterQueue covers stays pending: "couldn't assign flavors to
  pod set NAME: resource R unavailable in ClusterQueue" (pkg/scheduler/flavorassigner/flavorassigner.go
  `findFlavorForPodSetResource`; its test "zero resource request not in clusterQueue should succeed").
Not modelled: cohorts, borrowing, admission checks, multiple flavors per resource, fair sharing, quota of
resources other than google.com/tpu (cpu and memory are checked for coverage only)."""
from __future__ import annotations

import itertools
import time
from typing import Any

from fakes.k8s_server import CRD_PREFIX, FakeKube

API = "/apis/kueue.x-k8s.io/v1beta1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TPU = "google.com/tpu"
# xpk's five PriorityClasses (xpk core/kueue_manager.py / templates: very-low 100 ... very-high 1000)
XPK_PRIORITIES = {"very-low": 100, "low": 250, "medium": 500, "high": 750, "very-high": 1000}
KINDS = ("workloads", "localqueues", "clusterqueues", "resourceflavors")


def _cond(obj: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


def _set(obj: dict[str, Any], kind: str, value: bool, reason: str = "", message: str = "") -> None:
    conds = [c for c in obj.setdefault("status", {}).setdefault("conditions", []) if c["type"] != kind]
    conds.append({"type": kind, "status": "True" if value else "False", "reason": reason, "message": message,
                  "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    obj["status"]["conditions"] = conds


class FakeKueue:
    def __init__(self, kube: FakeKube, cluster: Any) -> None:
        self.kube = kube
        self.seq = itertools.count()
        cluster.controllers.append(self.step)

    def install(self, chips: int, namespace: str = "default", queue: str = "lq", flavor: str = "tpu") -> None:
        """Kueue's CRDs served, one ResourceFlavor, a ClusterQueue of `chips` google.com/tpu, a LocalQueue, and
        xpk's PriorityClasses: the objects xpk's kueue_config template makes."""
        for kind in KINDS:
            self.kube.put(f"{CRD_PREFIX}{kind}.kueue.x-k8s.io", {"kind": "CustomResourceDefinition", "metadata": {
                "name": f"{kind}.kueue.x-k8s.io"}, "status": {"conditions": [{"type": "Established",
                                                                              "status": "True"}]}})
        self.kube.put(f"{API}/resourceflavors/{flavor}", {"kind": "ResourceFlavor", "metadata": {"name": flavor}})
        self.kube.put(f"{API}/clusterqueues/cq", {"kind": "ClusterQueue", "metadata": {"name": "cq"}, "spec": {
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{"coveredResources": [TPU], "flavors": [{"name": flavor, "resources": [
                {"name": TPU, "nominalQuota": chips}]}]}]}})
        if namespace != "default":   # the team's namespace, as their admin made it
            self.kube.put(f"/api/v1/namespaces/{namespace}", {"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": namespace}})
        self.kube.put(f"{API}/namespaces/{namespace}/localqueues/{queue}", {
            "kind": "LocalQueue", "metadata": {"name": queue, "namespace": namespace}, "spec": {"clusterQueue": "cq"}})
        for name, value in XPK_PRIORITIES.items():
            self.kube.put(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}", {
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                "value": value})

    # -- the controller ----------------------------------------------------------------------------------------
    def step(self) -> None:
        if CRD_PREFIX + "workloads.kueue.x-k8s.io" not in self.kube.objects:
            return
        with self.kube.lock:
            jobsets = {p: o for p, o in self.kube.objects.items() if "/jobsets/" in p
                       and QUEUE_LABEL in o["metadata"].get("labels", {})}
            for path, js in jobsets.items():
                self._ensure_workload(js)
            workloads = [o for p, o in self.kube.objects.items() if p.startswith(API) and "/workloads/" in p]
            for wl in workloads:
                js = self._jobset_of(wl)
                if js is not None and any(_cond(js, k) for k in ("Completed", "Failed")) and not _cond(wl, "Finished"):
                    _set(wl, "Finished", True, "Succeeded" if _cond(js, "Completed") else "Failed")
            self._admit([w for w in workloads if self._jobset_of(w) is not None])

    def _jobset_of(self, wl: dict[str, Any]) -> dict[str, Any] | None:
        ref = wl["metadata"]["ownerReferences"][0]
        return self.kube.objects.get(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{wl['metadata']['namespace']}"
                                     f"/jobsets/{ref['name']}")

    def _ensure_workload(self, js: dict[str, Any]) -> None:
        ns, name = js["metadata"]["namespace"], js["metadata"]["name"]
        path = f"{API}/namespaces/{ns}/workloads/jobset-{name}"
        if path in self.kube.objects:
            return
        sets, prio_name, requested = [], "", set()
        for rj in js["spec"]["replicatedJobs"]:
            job = rj["template"]["spec"]
            pod = job["template"]["spec"]
            prio_name = prio_name or pod.get("priorityClassName", "")
            per_pod = sum(int(c.get("resources", {}).get("limits", {}).get(TPU, 0)) for c in pod["containers"])
            for c in pod["containers"]:
                res = c.get("resources", {})
                asked = {**res.get("limits", {}), **res.get("requests", {})}
                requested.update(r for r, q in asked.items() if str(q).strip() not in ("0", "0m", ""))
            count = int(rj.get("replicas", 1)) * int(job.get("parallelism", 1))
            sets.append({"name": rj["name"], "count": count, "tpu": per_pod * count})
        prio = self.kube.objects.get(f"/apis/scheduling.k8s.io/v1/priorityclasses/{prio_name}", {}).get("value", 0)
        wpc = js["metadata"].get("labels", {}).get("kueue.x-k8s.io/priority-class")
        if wpc:   # the WorkloadPriorityClass label first (jobframework/reconciler.go ExtractPriority)
            prio_name = wpc
            prio = self.kube.objects.get(f"{API}/workloadpriorityclasses/{wpc}", {}).get("value", 0)
        self.kube.put(path, {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", "metadata": {
            "name": f"jobset-{name}", "namespace": ns,
            # constants.JobUIDLabel "kueue.x-k8s.io/job-uid": the owner job's UID (pkg/controller/constants)
            "labels": {"kueue.x-k8s.io/job-uid": js["metadata"]["uid"]},
            "ownerReferences": [{"kind": "JobSet", "name": name, "uid": js["metadata"]["uid"]}]},
            "spec": {"queueName": js["metadata"]["labels"][QUEUE_LABEL], "priority": prio,
                     "priorityClassName": prio_name, "podSets": [{"name": s["name"], "count": s["count"]}
                                                                  for s in sets]},
            "status": {"conditions": []}, "_tpu": sum(s["tpu"] for s in sets), "_seq": next(self.seq),
            "_podset": sets[0]["name"], "_requests": sorted(requested)})

    def _queue_of(self, wl: dict[str, Any]) -> tuple[int, str, set[str]]:
        """The google.com/tpu quota of the Workload's ClusterQueue, its flavor, and every resource it covers."""
        lq = self.kube.objects.get(f"{API}/namespaces/{wl['metadata']['namespace']}/localqueues/"
                                   f"{wl['spec']['queueName']}")
        if lq is None:
            return 0, "", set()
        cq = self.kube.objects[f"{API}/clusterqueues/{lq['spec']['clusterQueue']}"]
        covered = {r for g in cq["spec"]["resourceGroups"] for r in g.get("coveredResources", [])}
        flavor = cq["spec"]["resourceGroups"][0]["flavors"][0]
        tpu = next(int(r["nominalQuota"]) for r in flavor["resources"] if r["name"] == TPU)
        return tpu, str(flavor["name"]), covered

    def _suspend(self, wl: dict[str, Any], value: bool) -> None:
        js = self._jobset_of(wl)
        if js is not None:
            js["spec"]["suspend"] = value

    def _admit(self, workloads: list[dict[str, Any]]) -> None:
        live = [w for w in workloads if not _cond(w, "Finished")]
        pending = sorted((w for w in live if not _cond(w, "Admitted")),
                         key=lambda w: (-int(w["spec"]["priority"]), w["_seq"]))
        for wl in pending:
            quota, flavor, covered = self._queue_of(wl)
            uncovered = [r for r in wl.get("_requests", []) if r not in covered]
            if uncovered:
                _set(wl, "QuotaReserved", False, "Pending", f"couldn't assign flavors to pod set {wl['_podset']}: "
                     f"resource {uncovered[0]} unavailable in ClusterQueue")
                continue
            admitted = [w for w in live if _cond(w, "Admitted")]
            free = quota - sum(w["_tpu"] for w in admitted)
            if wl["_tpu"] > free:
                lower = sorted((w for w in admitted if int(w["spec"]["priority"]) < int(wl["spec"]["priority"])),
                               key=lambda w: (int(w["spec"]["priority"]), -w["_seq"]))
                victims, freed = [], 0
                for v in lower:
                    if free + freed >= wl["_tpu"]:
                        break
                    victims.append(v)
                    freed += v["_tpu"]
                if free + freed < wl["_tpu"]:
                    _set(wl, "QuotaReserved", False, "Pending",
                         f"couldn't assign flavors to pod set {wl['_podset']}: insufficient unused quota for {TPU} "
                         f"in flavor {flavor}, {wl['_tpu'] - free} more needed")
                    continue
                for v in victims:
                    _set(v, "Evicted", True, "Preempted", "Preempted to accommodate a workload (UID: "
                         f"{wl['metadata']['uid']}) due to prioritization in the ClusterQueue")
                    _set(v, "Admitted", False, "NoReservation")
                    _set(v, "QuotaReserved", False, "Pending", "Preempted")
                    self._suspend(v, True)
            _set(wl, "QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue cq")
            _set(wl, "Admitted", True, "Admitted", "The workload is admitted")
            if any(c["type"] == "Evicted" for c in wl["status"]["conditions"]):
                _set(wl, "Evicted", False, "QuotaReserved", "Previously: Preempted")
            self._suspend(wl, False)
