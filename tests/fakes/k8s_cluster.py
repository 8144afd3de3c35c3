"""The controllers and kubelet behind the Kubernetes API fake (k8s_server.py): a JobSet controller, the Job
controller and a kubelet that runs each pod's container command as a local process, the way tpu_host.py runs a
simulated TPU host's start-up script. One loop, every `tick` seconds.

Modelled, with sources:
- JobSet v0.10.1 (pkg/controllers/jobset_controller.go, failure_policy.go, pkg/constants): for each replicated job,
  `replicas` Jobs named `<jobset>-<rjob>-<index>`, labelled and annotated jobset.sigs.k8s.io/jobset-name,
  replicatedjob-name, job-index and restart-attempt (= status.restarts), owned by the JobSet, their pod template
  carrying the same; a failed Job is matched against failurePolicy.rules in order (onJobFailureReasons), first match
  wins: FailJobSet -> condition Failed, reason FailJobSetFailurePolicyAction; no match -> RestartJobSet: restarts+1
  while restarts < maxRestarts (the old attempt's Jobs deleted, new ones made), else Failed, reason
  ReachedMaxRestarts; every Job complete -> condition Completed, reason AllJobsCompleted;
- the Job controller (Kubernetes docs, "Jobs": Indexed completion mode, pod failure policy, backoffLimit): Indexed
  Jobs make one pod per completion index named `<job>-<index>-<5 chars>`, with the annotation
  batch.kubernetes.io/job-completion-index and the env JOB_COMPLETION_INDEX; with backoffLimit 0 the first failed
  pod fails the Job: reason PodFailurePolicy when a FailJob rule matches its exit code (onExitCodes NotIn/In),
  BackoffLimitExceeded otherwise; Complete once `completions` pods succeeded;
- the scheduler: a pod is bound to a Ready node whose labels hold every nodeSelector entry, that is not cordoned
  (spec.unschedulable: the NodeUnschedulable filter, kubernetes pkg/scheduler/framework/plugins/nodeunschedulable,
  passes such a node over unless the pod tolerates the taint node.kubernetes.io/unschedulable:NoSchedule) and that
  no other pod of another Job holds (the exclusive-topology annotation: one slice per node pool is what the test's node pools
  give; a pod that fits no node stays Pending with condition PodScheduled False, reason Unschedulable);
- the kubelet: the container's command run with its env (value, and fieldRef metadata.name / labels['k'] /
  annotations['k'] resolved by the downward API), plus the `image` environment the test gives (PATH, ...); phase
  Pending -> Running -> Succeeded/Failed with containerStatuses[].state.terminated.exitCode; its output is the
  pod's log; a deleted pod's process gets SIGTERM, then SIGKILL after terminationGracePeriodSeconds.
- the pod's status.qosClass as the API server sets it (qos_class; issue 57 item 6: tpuctl's pods not BestEffort);
- what the API server refuses (issue 57 item 2): each Job and pod the controllers make goes through
  FakeKube.create (k8s_validation.py); a refused Job is not made, its message kept in `refused`, and tried again
  next tick with no condition on the JobSet, as v0.10.1's reconcile returns the error and is requeued.
Not modelled: node failures and GKE's node-pool repair (a test deletes pods or nodes itself), DNS, networking.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
import time
import uuid
from typing import Any, Callable

from fakes.k8s_server import FakeKube, Invalid
from fakes.procs import kill_marked

JS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/"
L_JOBSET, L_RJOB, L_INDEX, L_RESTART = ("jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/replicatedjob-name",
                                        "jobset.sigs.k8s.io/job-index", "jobset.sigs.k8s.io/restart-attempt")
# JobSet v0.10.1 api/jobset/v1alpha2/jobset_types.go GlobalReplicasKey, JobGlobalIndexKey, CoordinatorKey; written on
# every Job and its pod template by pkg/controllers/jobset_controller.go `labelAndAnnotateObject`, the coordinator
# only when spec.coordinator is set, as `coordinatorEndpoint`: "<jobset>-<rjob>-<jobIndex>-<podIndex>.<subdomain>",
# the subdomain being spec.network.subdomain or the JobSet's name (`GetSubdomain`).
L_GLOBAL_REPLICAS, L_GLOBAL_INDEX, L_COORDINATOR = ("jobset.sigs.k8s.io/global-replicas",
                                                    "jobset.sigs.k8s.io/job-global-index",
                                                    "jobset.sigs.k8s.io/coordinator")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# In each container process's environment: its pod's path. When a container's main process ends, whether by itself
# or stopped, nothing in the container outlives it: the main process is the init of the container's PID namespace,
# and "if the init process of a PID namespace terminates, the kernel terminates all of the processes in the namespace
# via a SIGKILL signal" (pid_namespaces(7)). The agent starts jobs in sessions of their own, so no process group
# holds them all.
POD_MARK = "FAKE_K8S_POD"   # its value: the cluster's id and the pod's path (two suites may name pods alike)


def _cond(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind
                 and c["status"] == "True"), None)


class FakeCluster:
    def __init__(self, kube: FakeKube, image_env: dict[str, str], tick: float = 0.05,
                 image: Callable[[str], dict[str, str]] | None = None) -> None:
        """`image_env`: what every container's environment starts from (its image's PATH, ...); `image(pod)`: more
        of it made for each pod, as each container gets its own copy of the image's filesystem."""
        self.kube, self.image_env, self.tick, self.image = kube, image_env, tick, image
        self.procs: dict[str, subprocess.Popen[bytes]] = {}   # pod path -> its container's process
        self.uid = secrets.token_hex(8)
        self.stopping = threading.Event()
        kube.on_delete.append(self._deleted)
        self.controllers: list[Callable[[], None]] = []   # more controllers each tick (fakes/kueue.py)
        self.unpullable: set[str] = set()   # images no node can pull: their pods wait in ErrImagePull
        self.refused: dict[str, str] = {}   # path -> the API server's 422 for an object a controller made
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def add_node_pool(self, name: str, nodes: int, labels: dict[str, str],
                      taints: list[dict[str, str]] | None = None) -> None:
        """`taints`: the node pool's (GKE applies a node pool's NodeConfig.taints to each of its nodes:
        kubernetes-engine/docs/how-to/node-taints), each {key, value, effect}."""
        for i in range(nodes):
            node = f"gke-{name}-{i}"
            self.kube.create(f"/api/v1/nodes/{node}", {
                "apiVersion": "v1", "kind": "Node", "spec": {"taints": list(taints or [])},
                "metadata": {"name": node, "labels": {**labels, "cloud.google.com/gke-nodepool": name}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}})

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        for path, proc in list(self.procs.items()):
            _kill(proc, 0)
            kill_marked(POD_MARK, self.uid + path)

    # -- the loop ------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self.stopping.wait(self.tick):
            try:
                for controller in self.controllers:
                    controller()
                for path in [p for p in list(self.kube.objects) if p.startswith(JS) and "/jobsets/" in p]:
                    self._jobset(path)
                self._kubelet()
            except Exception as e:  # noqa: BLE001 - a fake's bug must show, not hang the test silently
                print(f"fake cluster: {type(e).__name__}: {e}", flush=True)

    def _jobset(self, path: str) -> None:
        js = self.kube.objects.get(path)
        if js is None or _cond(js, "Completed") or _cond(js, "Failed"):
            return
        status = js.setdefault("status", {"restarts": 0, "conditions": []})
        ns, name = js["metadata"]["namespace"], js["metadata"]["name"]
        attempt = int(status.get("restarts", 0))
        if js["spec"].get("suspend"):
            # a suspended JobSet keeps no running Jobs (jobset v0.10.1 jobset_controller.go: suspendJobs sets each
            # Job's suspend, and the Job controller deletes a suspended Job's active pods); resumed, it runs them
            # again, in the same restart attempt. Here its Jobs are deleted, and made again on resume.
            for p in [p for p, o in list(self.kube.objects.items()) if "/jobs/" in p
                      and o["metadata"].get("labels", {}).get(L_JOBSET) == name]:
                self.kube.remove(p)
            return
        jobs, made = [], 0
        for rj in js["spec"]["replicatedJobs"]:
            for i in range(int(rj.get("replicas", 1))):
                job = self._ensure_job(js, ns, rj, i, attempt, made)
                made += 1
                if job is not None:
                    jobs.append(job)
        if len(jobs) < made:
            return   # a Job the API server refused: tried again next tick, as v0.10.1 requeues
        failed = [j for j in jobs if _cond(j, "Failed")]
        if failed:
            reason = _cond(failed[0], "Failed")["reason"]   # type: ignore[index]
            fp = js["spec"].get("failurePolicy", {})
            rule = next((r for r in fp.get("rules", []) if not r.get("onJobFailureReasons")
                         or reason in r["onJobFailureReasons"]), None)
            if rule is not None and rule["action"] == "FailJobSet":
                return self._end(js, "Failed", "FailJobSetFailurePolicyAction")
            if attempt >= int(fp.get("maxRestarts", 0)):
                return self._end(js, "Failed", "ReachedMaxRestarts")
            status["restarts"] = attempt + 1
            status["restartsCountTowardsMax"] = attempt + 1
            for j in jobs:   # the old attempt's Jobs go; the next tick makes the new ones
                self.kube.remove(f"/apis/batch/v1/namespaces/{ns}/jobs/{j['metadata']['name']}")
            return
        if jobs and all(_cond(j, "Complete") for j in jobs):
            self._end(js, "Completed", "AllJobsCompleted")

    def _end(self, js: dict[str, Any], kind: str, reason: str) -> None:
        js["status"]["conditions"].append({"type": kind, "status": "True", "reason": reason,
                                           "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    def _ensure_job(self, js: dict[str, Any], ns: str, rj: dict[str, Any], i: int, attempt: int,
                    global_index: int) -> dict[str, Any] | None:
        name = f"{js['metadata']['name']}-{rj['name']}-{i}"
        path = f"/apis/batch/v1/namespaces/{ns}/jobs/{name}"
        job = self.kube.objects.get(path)
        if job is None:
            try:
                job = self.kube.create(path, build_job(js, rj, i, attempt, global_index))
            except Invalid as e:
                # createJobs returns the error and the reconcile is retried, with no condition on the JobSet
                # (jobset_controller.go v0.10.1 lines 538-541, 559-587; the error goes to the controller's log)
                self.refused[path] = str(e)
                return None
            for k in range(int(job["spec"].get("completions", 1))):
                pod = build_pod(job, k)
                path = f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}"
                try:
                    self.kube.create(path, pod)
                except Invalid as e:
                    self.refused[path] = str(e)
        self._job_status(job, ns)
        return job

    def _job_status(self, job: dict[str, Any], ns: str) -> None:
        if _cond(job, "Failed") or _cond(job, "Complete"):
            return
        pods = self.kube.list(f"/api/v1/namespaces/{ns}/pods/", {L_JOBSET: job["metadata"]["labels"][L_JOBSET]})
        pods = [p for p in pods if p["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]]
        for p in pods:
            if p["status"]["phase"] == "Failed":
                code = p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]
                reason = "PodFailurePolicy" if _fail_job(job["spec"], code) else "BackoffLimitExceeded"
                job["status"]["conditions"].append({"type": "Failed", "status": "True", "reason": reason})
                for q in pods:   # a failed Job's running pods are deleted (Kubernetes docs, "Jobs")
                    if q["status"]["phase"] in ("Pending", "Running"):
                        self.kube.remove(f"/api/v1/namespaces/{ns}/pods/{q['metadata']['name']}")
                return
        if sum(p["status"]["phase"] == "Succeeded" for p in pods) >= int(job["spec"].get("completions", 1)):
            job["status"]["conditions"].append({"type": "Complete", "status": "True"})

    # -- scheduler and kubelet -------------------------------------------------------------------------------
    def _kubelet(self) -> None:
        pods = [(p, o) for p, o in list(self.kube.objects.items()) if "/pods/" in p]
        for path, pod in pods:
            phase = pod["status"]["phase"]
            if phase == "Pending" and path not in self.procs:
                node = pod["spec"].get("nodeName") or self._schedule(pod, pods)
                if node and pod["spec"]["containers"][0]["image"] in self.unpullable:
                    # the kubelet reports the pull's failure in the container's waiting state, and the pod stays
                    # Pending (Kubernetes docs, "Images": ErrImagePull, then ImagePullBackOff)
                    pod["spec"]["nodeName"] = node
                    # startTime: "RFC 3339 date and time at which the object was acknowledged by the Kubelet"
                    # (Kubernetes API, PodStatus): when its pulls began
                    pod["status"].setdefault("startTime", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                    pod["status"]["containerStatuses"] = [{"name": pod["spec"]["containers"][0]["name"], "state": {
                        "waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image "
                                    f"\"{pod['spec']['containers'][0]['image']}\""}}}]
                elif node:
                    pod["spec"]["nodeName"] = node
                    self._start(path, pod)
            elif phase == "Running" and path in self.procs and "deletionTimestamp" not in pod["metadata"]:
                rc = self.procs[path].poll()
                if rc is not None:
                    # a container killed by signal N reports exit code 128 + N (137: SIGKILL, as an eviction's
                    # or the OOM killer's; Kubernetes docs "Debug Running Pods"/"Pod Lifecycle" exit codes)
                    rc = 128 - rc if rc < 0 else rc
                    kill_marked(POD_MARK, self.uid + path, wait=10)   # the container is over before its pod says so
                    pod["status"]["phase"] = "Succeeded" if rc == 0 else "Failed"
                    pod["status"]["containerStatuses"] = [{"name": pod["spec"]["containers"][0]["name"], "state": {
                        "terminated": {"exitCode": rc, "reason": "Completed" if rc == 0 else "Error"}}}]

    def _schedule(self, pod: dict[str, Any], pods: list[tuple[str, dict[str, Any]]]) -> str:
        want = pod["spec"].get("nodeSelector", {})
        busy = {o["spec"].get("nodeName") for _, o in pods if o["status"]["phase"] in ("Pending", "Running")}
        for node in self.kube.list("/api/v1/nodes/"):
            labels = node["metadata"]["labels"]
            if all(labels.get(k) == v for k, v in want.items()) and node["metadata"]["name"] not in busy \
                    and _tolerated(node, pod) and not _cordoned(node, pod):
                return str(node["metadata"]["name"])
        # lastTransitionTime: when the condition last changed (Kubernetes docs, "Pod conditions"): kept while the
        # pod stays unschedulable
        was = next((c for c in pod["status"].get("conditions", []) if c.get("reason") == "Unschedulable"), {})
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                        "lastTransitionTime": was.get("lastTransitionTime") or
                                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]
        return ""

    def _start(self, path: str, pod: dict[str, Any]) -> None:
        c = pod["spec"]["containers"][0]
        env = dict(self.image_env)
        if self.image is not None:
            env.update(self.image(pod["metadata"]["name"]))
        for e in c.get("env", []):
            env[e["name"]] = e["value"] if "value" in e else _field(pod, e["valueFrom"]["fieldRef"]["fieldPath"])
        env[POD_MARK] = self.uid + path
        log = open(self._log_file(path), "wb")
        proc = subprocess.Popen(c["command"] + c.get("args", []), env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[path] = proc
        pod["status"] = {"phase": "Running", "hostIP": "127.0.0.1", "qosClass": pod["status"].get("qosClass"),
                         "conditions": [{"type": "PodScheduled", "status": "True"}]}
        threading.Thread(target=self._relay_log, args=(path, proc), daemon=True).start()

    def _log_file(self, path: str) -> str:
        return os.path.join(self.image_env["TMPDIR"], path.strip("/").replace("/", "_") + ".log")

    def _relay_log(self, path: str, proc: subprocess.Popen[bytes]) -> None:
        while True:   # the pod's log as the API serves it: what the container wrote so far
            done = proc.poll() is not None
            with open(self._log_file(path), "rb") as f:
                self.kube.logs[path] = f.read()
            if done:
                return
            time.sleep(self.tick)

    def _deleted(self, path: str, obj: dict[str, Any]) -> None:
        proc = self.procs.get(path)
        if proc is not None and proc.poll() is None:
            grace = float(obj["spec"].get("terminationGracePeriodSeconds", 30))
            threading.Thread(target=self._terminate, args=(path, proc, grace), daemon=True).start()
        elif "deletionTimestamp" in obj["metadata"]:
            self.kube.objects.pop(path, None)

    def _terminate(self, path: str, proc: subprocess.Popen[bytes], grace: float) -> None:
        _kill(proc, grace)
        kill_marked(POD_MARK, self.uid + path, wait=10)
        self.kube.objects.pop(path, None)   # the container stopped: the Terminating pod goes


def build_job(js: dict[str, Any], rj: dict[str, Any], i: int, attempt: int, global_index: int) -> dict[str, Any]:
    """The Job JobSet v0.10.1 makes for replica `i` of replicated job `rj`, as the API server would store it."""
    ns = js["metadata"].get("namespace") or "default"
    name = f"{js['metadata']['name']}-{rj['name']}-{i}"   # placement.GenJobName
    marks = jobset_marks(js, rj, i, attempt, global_index, ns)
    spec = _copy(rj["template"]["spec"])
    # constructJob (jobset_controller.go v0.10.1, lines 694-712): the Job's metadata from the replicated job's
    # template, both it and the pod template labelled and annotated (labelAndAnnotateObject), and with
    # enableDNSHostnames (defaulted true by the webhook) the pod template's subdomain = GetSubdomain
    meta = spec["template"].setdefault("metadata", {})
    meta["labels"] = {**meta.get("labels", {}), **marks}
    meta["annotations"] = {**meta.get("annotations", {}), **marks, **_exclusive(js)}
    if js["spec"].get("network", {}).get("enableDNSHostnames", True):
        spec["template"].setdefault("spec", {})["subdomain"] = _subdomain(js)
    tmpl_meta = rj["template"].get("metadata", {})
    # the API server's Job strategy adds the selector's labels to the pod template (kubernetes
    # pkg/registry/batch/job/strategy.go generateSelector: batch.kubernetes.io/job-name = the Job's name,
    # batch.kubernetes.io/controller-uid, and the legacy job-name / controller-uid), then validates them
    uid = str(uuid.uuid4())
    meta["labels"].update({"batch.kubernetes.io/job-name": name, "job-name": name,
                           "batch.kubernetes.io/controller-uid": uid, "controller-uid": uid})
    return {"apiVersion": "batch/v1", "kind": "Job", "spec": spec, "status": {"conditions": []}, "metadata": {
        "name": name, "namespace": ns, "uid": uid, "labels": {**tmpl_meta.get("labels", {}), **marks},
        "annotations": {**tmpl_meta.get("annotations", {}), **marks, **_exclusive(js)},
        "ownerReferences": [{"kind": "JobSet", "name": js["metadata"]["name"], "uid": js["metadata"]["uid"]}]}}


def build_pod(job: dict[str, Any], index: int) -> dict[str, Any]:
    """Pod `index` of an Indexed Job, as the Job controller makes it."""
    tmpl = _copy(job["spec"]["template"])
    name = f"{job['metadata']['name']}-{index}-{secrets.token_hex(3)[:5]}"
    meta = tmpl.setdefault("metadata", {})
    meta.update(name=name, namespace=job["metadata"]["namespace"], ownerReferences=[
        {"kind": "Job", "name": job["metadata"]["name"], "uid": job["metadata"]["uid"]}])
    meta["annotations"] = {**meta.get("annotations", {}), COMPLETION_INDEX: str(index)}
    # an Indexed Job's pod has hostname `<job>-<index>` (kubernetes pkg/controller/job/job_controller.go manageJob:
    # `template.Spec.Hostname = fmt.Sprintf("%s-%d", job.Name, completionIndex)`)
    tmpl.setdefault("spec", {})["hostname"] = f"{job['metadata']['name']}-{index}"
    for c in tmpl["spec"]["containers"]:
        c.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "value": str(index)})
    return {"apiVersion": "v1", "kind": "Pod", **tmpl, "status": {"phase": "Pending",
                                                                  "qosClass": qos_class(tmpl["spec"])}}


def qos_class(spec: dict[str, Any]) -> str:
    """The pod's QoS class, which the API server sets at creation (kubernetes pkg/registry/core/pod/strategy.go
    PrepareForCreate: `qos.ComputePodQOS`; pkg/apis/core/helper/qos/qos.go): only cpu and memory count, a zero
    quantity is none; no request or limit of them in any container: BestEffort; every container limiting both, with
    requests equal to limits (a request left out defaults to the limit): Guaranteed; else Burstable."""
    def nonzero(d: dict[str, Any]) -> dict[str, str]:
        return {k: str(v) for k, v in (d or {}).items() if k in ("cpu", "memory") and str(v) not in ("0", "")}
    containers = spec.get("initContainers", []) + spec.get("containers", [])
    asks = [(nonzero(c.get("resources", {}).get("requests", {})), nonzero(c.get("resources", {}).get("limits", {})))
            for c in containers]
    if not any(req or lim for req, lim in asks):
        return "BestEffort"
    if all(set(lim) == {"cpu", "memory"} and all(req.get(k, v) == v for k, v in lim.items()) for req, lim in asks):
        return "Guaranteed"
    return "Burstable"


def jobset_marks(js: dict[str, Any], rj: dict[str, Any], i: int, attempt: int, global_index: int,
                 ns: str) -> dict[str, str]:
    """The labels (and, the same, annotations) JobSet v0.10.1 writes on each Job and its pod template:
    pkg/controllers/jobset_controller.go `labelAndAnnotateObject` (lines 765-825): jobset-name, jobset-uid,
    replicatedjob-name, restart-attempt (status.restarts), replicatedjob-replicas, global-replicas, job-index,
    job-key (sha1 of "<ns>/<job name>", jobHashKey lines 863-870), job-global-index, group-name (the replicated
    job's groupName, "default" by the CRD's default), group-replicas, job-group-index, and with spec.coordinator
    set, the coordinator = coordinatorEndpoint (lines 1086-1090): "<jobset>-<rjob>-<jobIndex>-<podIndex>.<subdomain>".
    """
    import hashlib
    name = js["metadata"]["name"]
    rjobs = js["spec"]["replicatedJobs"]
    group = rj.get("groupName") or "default"
    in_group = [r for r in rjobs if (r.get("groupName") or "default") == group]
    before = 0
    for r in in_group:
        if r["name"] == rj["name"]:
            break
        before += int(r.get("replicas", 1))
    marks = {L_JOBSET: name, "jobset.sigs.k8s.io/jobset-uid": str(js["metadata"]["uid"]), L_RJOB: rj["name"],
             L_RESTART: str(attempt), "jobset.sigs.k8s.io/replicatedjob-replicas": str(int(rj.get("replicas", 1))),
             L_GLOBAL_REPLICAS: str(sum(int(r.get("replicas", 1)) for r in rjobs)), L_INDEX: str(i),
             "jobset.sigs.k8s.io/job-key": hashlib.sha1(f"{ns}/{name}-{rj['name']}-{i}".encode()).hexdigest(),
             L_GLOBAL_INDEX: str(global_index), "jobset.sigs.k8s.io/group-name": group,
             "jobset.sigs.k8s.io/group-replicas": str(sum(int(r.get("replicas", 1)) for r in in_group)),
             "jobset.sigs.k8s.io/job-group-index": str(before + i)}
    coord = js["spec"].get("coordinator")
    if coord:
        marks[L_COORDINATOR] = (f"{name}-{coord['replicatedJob']}-{coord.get('jobIndex', 0)}-"
                                f"{coord.get('podIndex', 0)}.{_subdomain(js)}")
    return marks


def _subdomain(js: dict[str, Any]) -> str:
    """GetSubdomain (jobset_controller.go v0.10.1 lines 835-844): spec.network.subdomain, else the JobSet's name."""
    return str(js["spec"].get("network", {}).get("subdomain") or js["metadata"]["name"])


def _exclusive(js: dict[str, Any]) -> dict[str, str]:
    """The JobSet's exclusive-topology annotation, copied to its Jobs and pods (labelAndAnnotateObject, 805-812)."""
    key = "alpha.jobset.sigs.k8s.io/exclusive-topology"
    notes = js["metadata"].get("annotations", {})
    return {key: notes[key]} if key in notes else {}


def _tolerated(node: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Every NoSchedule / NoExecute taint of the node is tolerated by the pod (Kubernetes docs, "Taints and
    Tolerations"; k8s.io/api core/v1 toleration.go ToleratesTaint: an empty effect matches every effect, an empty
    key with Exists every key, Exists any value, Equal (the default) the same value)."""
    tols = pod["spec"].get("tolerations") or []
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any((not t.get("effect") or t["effect"] == taint["effect"]) and
                   (t.get("key", "") == taint["key"] or (not t.get("key") and t.get("operator") == "Exists")) and
                   (t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", ""))
                   for t in tols):
            return False
    return True


def _cordoned(node: dict[str, Any], pod: dict[str, Any]) -> bool:
    """NodeUnschedulable's Filter: the node's spec.unschedulable, unless the pod tolerates
    node.kubernetes.io/unschedulable:NoSchedule (node_unschedulable.go: TolerationsTolerateTaint)."""
    if not node.get("spec", {}).get("unschedulable"):
        return False
    taint = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    return not _tolerated({"spec": {"taints": [taint]}}, pod)


def _kill(proc: subprocess.Popen[bytes], grace: float) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def _fail_job(job_spec: dict[str, Any], code: int) -> bool:
    for rule in job_spec.get("podFailurePolicy", {}).get("rules", []):
        on = rule.get("onExitCodes")
        if on and rule["action"] == "FailJob" and (code in on["values"]) == (on["operator"] == "In"):
            return True
    return False


def _field(pod: dict[str, Any], path: str) -> str:
    """The downward API's metadata.name, metadata.labels['k'], metadata.annotations['k'], and spec.nodeName
    (Kubernetes docs, "Downward API": available to env through fieldRef)."""
    meta = pod["metadata"]
    if path == "metadata.name":
        return str(meta["name"])
    if path == "spec.nodeName":
        return str(pod["spec"].get("nodeName", ""))
    for kind in ("labels", "annotations"):
        prefix = f"metadata.{kind}['"
        if path.startswith(prefix):
            return str(meta.get(kind, {}).get(path[len(prefix):-2], ""))
    raise ValueError(f"fieldRef {path} not modelled")


def _copy(obj: Any) -> Any:
    import copy
    return copy.deepcopy(obj)
