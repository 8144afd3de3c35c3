"""GKE runs: providers/base.py's RemoteRuns over JobSets. `submit` has written job.json; `dispatch` creates the run's
JobSet, whose pods each run tpuctl's agent for the run (manifest.py), so the run's status, logs and outputs reach the
store as on a TPU VM. `advance` reads the JobSet's conditions and pods for `status`/`logs` and, when the JobSet
ended but no agent ever wrote the run's end (an image that cannot be pulled, an agent that could not install), ends
the run in the store with each pod's own log read through the Kubernetes API. `cancel` leaves the agents their grace
(the cancel marker, written by control/submission.cancel, is what they act on), then deletes the JobSet.

JobSet semantics relied on (kubernetes-sigs/jobset v0.10.1, api/jobset/v1alpha2/jobset_types.go and
pkg/constants): conditions Completed / Failed, `status.restarts` (every restart, counted against maxRestarts by the
failure policy), pods labelled jobset.sigs.k8s.io/restart-attempt."""
from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any, Callable

from ... import __version__
from ...core import knobs, layout, runindex, runs
from ...core.models import ClusterState
from ...core.runs import RunState, RunStatus
from ...core.store import BlobStore
from ...core.errors import ErrorKind, TpuctlError
from ...core.jobspec import JobSpec
from . import cordoning, frameworks, jobset_install, kube, kueue, maintenance, manifest, tputypes
from .jobset_status import condition, exit_code, jobsets_of, pods_of, stuck_words, words

Connect = Callable[[dict[str, Any]], Any]


def poll_seconds() -> float:
    """Least time between two looks at one run's JobSet (TPUCTL_GKE_POLL_SECONDS, 5 s)."""
    return knobs.number("TPUCTL_GKE_POLL_SECONDS", 5)


def cancel_grace() -> float:
    """How long cancel waits for the agents to end the run before deleting its JobSet (TPUCTL_GKE_CANCEL_GRACE,
    the pods' own termination grace by default)."""
    return knobs.number("TPUCTL_GKE_CANCEL_GRACE", manifest.GRACE_SECONDS)


def _connect(rec: dict[str, Any]) -> Any:
    from ..google import clients
    return kube.for_record(rec, clients.access_token)


def jobset_path(namespace: str, run_id: str) -> str:
    return f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets/{manifest.jobset_name(run_id)}"


def namespace_of(store: BlobStore, run_id: str) -> str:
    """The run's namespace, from its job.json (`submit --namespace`); default for a run written before it."""
    job = runs.job(store, run_id)
    return (job.namespace if job else "") or manifest.DEFAULT_NAMESPACE


def run_objects(st: ClusterState, run_id: str, max_restarts: int, queue: str = "",
                priority: str = "", namespace: str = "") -> manifest.RunObjects:
    rec = dict(st.record.get("gke") or {})
    return manifest.RunObjects(
        cluster=st.name, run_id=run_id, shape=tputypes.shape(str(rec.get("tpu_type") or st.spec.tpu_type)),
        slices=int(rec.get("slices") or st.spec.slices or 1), max_restarts=max_restarts,
        image=str(rec.get("image") or manifest.DEFAULT_IMAGE), store_uri=st.spec.store, agent_version=__version__,
        workload_policy=str(rec.get("workload_policy") or ""), queue=queue, priority=priority,
        namespace=namespace or manifest.DEFAULT_NAMESPACE, own_pools=not team_placed(rec, queue))


def team_placed(rec: dict[str, Any], queue: str) -> bool:
    """A run submitted through a queue on a cluster tpuctl adopted is placed by that queue's ResourceFlavors (the
    team's quota gates it), not on tpuctl's own node pools (issue 57 item 4)."""
    return bool(rec.get("adopted")) and bool(queue)


# `submit` without --max-restarts on GKE (issue 49 item 5): spot preemption, maintenance and the node auto-upgrades
# and auto-repairs that release channels make mandatory ("cannot be disabled when using release channels": GKE
# release-channels docs) kill a run's pods (no exit code, or 137/143 from eviction). Kubernetes counts such a pod
# against the Job's backoffLimit (0), the Job fails with BackoffLimitExceeded, which no failurePolicy rule of the
# JobSet names, so JobSet restarts the whole run, counted against maxRestarts (jobset_types.go: "no match =
# RestartJobSet"); with xpk's default of 0 the first disruption ended the run. A job's own failure (an exit code
# not in RESTART_EXIT_CODES, e.g. 1) is FailJob, then FailJobSet: it still ends the run at once.
DEFAULT_RESTARTS = 5


class GkeRuns:
    restarts = True   # the JobSet's failurePolicy.maxRestarts = submit --max-restarts (manifest.py)
    default_restarts = DEFAULT_RESTARTS

    def __init__(self, connect: Connect = _connect, upgrades: Any = maintenance) -> None:
        self.connect = connect
        self.upgrades = upgrades   # hold(rec) / release(rec): node upgrades held off while runs are active
        self.looked: dict[str, float] = {}     # run -> when its JobSet was last read
        self.said: dict[str, str] = {}
        self.ended: set[str] = set()   # runs whose end this process has seen (the hold looked at once each)
        self.seen: dict[str, tuple[ClusterState, BlobStore]] = {}   # run -> where advance last looked at it

    def check_run(self, st: ClusterState, job: JobSpec, max_restarts: int, queue: str, priority: str,
                  namespace: str = "") -> str:
        frameworks.check_job(job.name, job.framework, job.env, job.keras_backend)
        objs = run_objects(st, "check", max_restarts)   # the shape and slices dispatch will use
        manifest.check(objs.slices, max_restarts, objs.shape)
        ns = kueue.check_namespace(namespace) or manifest.DEFAULT_NAMESPACE
        api = self._api(st)
        picked = kueue.pick_queue(api, ns, kueue.check_name(queue, "--queue"), kueue.check_name(priority, "--priority"))
        if team_placed(dict(st.record.get("gke") or {}), picked):
            kueue.check_flavors(api, ns, picked, objs.shape.accelerator, objs.shape.topology)
        return picked

    def _api(self, st: ClusterState) -> Any:
        return self.connect(dict(st.record.get("gke") or {}))

    def dispatch(self, st: ClusterState, store: BlobStore, run_id: str, sessions: int,
                 progress: Callable[[str], None], keep_inputs: bool = False) -> None:
        job = runs.job(store, run_id)
        ns = (job.namespace if job else "") or manifest.DEFAULT_NAMESPACE
        api = self._api(st)
        objs = run_objects(st, run_id, job.max_restarts if job else 0, job.queue if job else "",
                           job.priority if job else "", ns)
        if objs.priority and objs.queue and kueue.is_workload_priority(api, objs.priority):
            objs = replace(objs, workload_priority=True)
        if objs.queue and kueue.covers(api, ns, objs.queue):   # the pods may request cpu/memory (manifest.py)
            objs = replace(objs, queue_covers=True)
        labelled = kube.get(api, "/api/v1/nodes", [("labelSelector", f"{manifest.LABEL_CLUSTER}={st.name}"),
                                                    ("limit", "1")]) if objs.own_pools else None
        if objs.own_pools and not (labelled or {}).get("items"):
            # node pools made before tpuctl labelled its own (issue 57 item 4): selecting the label would leave
            # the run Pending for ever; it selects the TPU shape alone, as before, and says why
            objs = replace(objs, own_pools=False)
            progress(f"no node is labelled {manifest.LABEL_CLUSTER}={st.name} (node pools of an older tpuctl): the "
                     "run may land on any node pool of its TPU shape; `tpuctl down` and `up` make labelled ones")
        account, refused = cordoning.ensure(api, st.name, ns)   # a sick host's pod cordons its node (issue 60)
        if account:
            objs = replace(objs, service_account=account)
        else:
            progress(f"a sick host's node will not be cordoned (the cluster refused its role: {refused}); the run "
                     "goes on without it")
        js = manifest.build_jobset(objs)
        end = time.monotonic() + jobset_install.ready_seconds()
        while True:   # JobSet's webhooks refuse while its controller (re)starts (jobset_install.py WEBHOOK_DOWN)
            try:
                kube.apply(api, jobset_path(ns, run_id), js)
                break
            except kube.KubeError as e:
                if not jobset_install.webhook_down(e):
                    raise
                if time.monotonic() >= end:
                    raise TpuctlError(ErrorKind.TIMEOUT, f"JobSet's webhooks refused run {run_id}'s JobSet for "
                                      f"{jobset_install.ready_seconds():.0f}s: {e.message}",
                                      "`kubectl -n jobset-system get pods` and its logs say why; the run is "
                                      f"written: `tpuctl cancel {run_id}` ends it") from None
                progress("waiting for JobSet's webhooks (its controller is not serving yet)")
                time.sleep(1.0)
        progress(f"JobSet {js['metadata']['name']} created")
        try:   # on a cluster tpuctl made (maintenance.py); a failure leaves the run as it is, exposed to upgrades
            if self.upgrades.hold(dict(st.record.get("gke") or {})):
                progress(f"node upgrades held off for up to {maintenance.hold_days():g} days while runs are active")
        except TpuctlError as e:
            progress(f"node upgrades not held off ({e.message}): one would restart the run from its checkpoint")

    def _release_if_idle(self, st: ClusterState, store: BlobStore, api: Any, run_id: str) -> None:
        """The run ended: with no other run's JobSet still active (not ended, its run not final in the store), the
        exclusion goes (maintenance.release). A failure is left to its end time (maintenance.hold_days) or the next
        run's end."""
        if run_id in self.ended:
            return
        self.ended.add(run_id)
        for js in jobsets_of(api, st.name):
            other = str(js["metadata"].get("labels", {}).get(manifest.LABEL_RUN, ""))
            if not condition(js) and other.lower() != run_id.lower() and \
                    not (other and runs.status(store, other).state.final):
                return
        try:
            self.upgrades.release(dict(st.record.get("gke") or {}))
        except TpuctlError:
            pass

    def advance(self, st: ClusterState, store: BlobStore, run_id: str, follow: bool = False) -> str:
        now = time.monotonic()
        if run_id in self.said and now - self.looked.get(run_id, 0.0) < poll_seconds():
            return self.said[run_id]
        self.looked[run_id] = now
        api = self._api(st)
        ns = namespace_of(store, run_id)
        js = kube.get(api, jobset_path(ns, run_id))
        if js is None:
            self.said[run_id] = "" if runs.status(store, run_id).state.final else "no JobSet (deleted)"
            return self.said[run_id]
        pods = pods_of(api, run_id, ns)
        ended = condition(js)
        if ended and not runs.status(store, run_id).state.final:
            self._end_unreported(api, store, run_id, js, pods, ended)
        self.seen[run_id] = (st, store)
        if ended or runs.status(store, run_id).state.final:
            self._release_if_idle(st, store, api, run_id)
        queued = "" if ended else queued_words(api, js)
        if queued or (not ended and stuck_words(pods)):
            _note(store, run_id, queued or stuck_words(pods))   # `status` and `jobs` say it, never a bare pending
        self.said[run_id] = f"JobSet {js['metadata']['name']} {queued}" if queued else words(js, pods)
        return self.said[run_id]

    def _end_unreported(self, api: Any, store: BlobStore, run_id: str, js: dict[str, Any],
                        pods: list[dict[str, Any]], ended: str) -> None:
        """The JobSet ended and no agent wrote the run's end: the pods' own logs and exit code, in the store."""
        code = next((c for c in map(exit_code, pods) if c not in (None, 0)), 0 if ended == "Completed" else 1)
        chunks = store.list(layout.run_logs(run_id, 0))
        text = [f"tpuctl: JobSet {js['metadata']['name']} {ended.lower()} without the agent reporting the run's "
                "end; the pods' own logs follow\n"]
        for pod in pods:
            name = pod["metadata"]["name"]
            try:
                log = kube.request(api, "GET", f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{name}/log",
                                   query=[("tailLines", "200")], content_type="application/json")
            except kube.KubeError as e:
                log = f"(no log: {e.message})"
            text.append(f"--- pod {name} ({pod.get('status', {}).get('phase', '?')}) ---\n{_text(log)}")
        store.create(layout.log_chunk(run_id, 0, len(chunks) + 1), "".join(text).encode())
        state = RunState.SUCCEEDED if ended == "Completed" else RunState.FAILED
        store.write(layout.run_status(run_id, 0), json.dumps(RunStatus(
            state=state, exit_code=code, ended=time.time(), heartbeat=time.time(), host="gke",
            restarts=int(js.get("status", {}).get("restarts", 0)), note=f"JobSet {ended}").to_json()).encode())
        runindex.settle(store, run_id, 1)

    def cancel(self, st: ClusterState, store: BlobStore, run_id: str) -> None:
        """The cancel marker first (the agents end the job: SIGTERM, its grace, SIGKILL; host/supervisor.py), then
        the JobSet deleted once the run is final or the grace is over; a run no agent ended is ended here once its
        pods are gone (so a dying agent's last word cannot follow). A run Kueue holds (its JobSet suspended: no
        pod, no agent) is deleted at once, before it starts."""
        store.write(layout.run_cancel(run_id), json.dumps({"time": time.time()}).encode())
        step = min(1.0, max(0.05, cancel_grace() / 20))
        ns = namespace_of(store, run_id)
        js = kube.get(self._api(st), jobset_path(ns, run_id))
        held = js is not None and bool(js["spec"].get("suspend")) and not pods_of(self._api(st), run_id, ns)
        deadline = time.monotonic() + (0 if held else cancel_grace())
        while time.monotonic() < deadline and not runs.status(store, run_id).state.final:
            time.sleep(step)
        api = self._api(st)
        kube.delete(api, jobset_path(ns, run_id))
        self._release_if_idle(st, store, api, run_id)
        deadline = time.monotonic() + manifest.GRACE_SECONDS + cancel_grace()
        while pods_of(api, run_id, ns) and time.monotonic() < deadline:   # Terminating until their processes end
            time.sleep(step)
        if not runs.status(store, run_id).state.final:
            store.write(layout.run_status(run_id, 0), json.dumps(RunStatus(
                state=RunState.CANCELLED, ended=time.time(), heartbeat=time.time(), host="gke",
                note="JobSet deleted by cancel").to_json()).encode())
            runindex.settle(store, run_id, 1)

    def describe(self, st: ClusterState) -> dict[str, dict[str, object]]:
        """`status`: each of the cluster's JobSets (labelled tpuctl-cluster=NAME): its state, restarts, pods."""
        api = self._api(st)
        out: dict[str, dict[str, object]] = {}
        for js in jobsets_of(api, st.name):
            run_id = str(js["metadata"].get("labels", {}).get(manifest.LABEL_RUN, ""))
            pods = pods_of(api, run_id, str(js["metadata"].get("namespace") or manifest.DEFAULT_NAMESPACE)) \
                if run_id else []
            queue = str(js["metadata"].get("labels", {}).get(manifest.QUEUE_LABEL, ""))
            out[f"jobset {js['metadata']['name']}"] = {
                **({"placed by": f"queue {queue}'s ResourceFlavors: the team's quota gates the run"}
                   if team_placed(dict(st.record.get("gke") or {}), queue) else {}),
                "state": condition(js) or "Running", "restarts": int(js.get("status", {}).get("restarts", 0)),
                "pods": ", ".join(f"{p['metadata']['name']} {p.get('status', {}).get('phase', 'Pending')}"
                                  f"@{p.get('spec', {}).get('nodeName') or '-'}" for p in pods) or "none"}
        return out

    def delete_all(self, st: ClusterState, progress: Callable[[str], None]) -> None:
        """`down`: every JobSet of the cluster (an adopted cluster keeps none of tpuctl's); their pods go with them."""
        api = self._api(st)
        for js in jobsets_of(api, st.name):
            kube.delete(api, jobset_path(str(js["metadata"].get("namespace") or manifest.DEFAULT_NAMESPACE),
                                         str(js["metadata"]["name"])[len("tpuctl-"):]))
            progress(f"JobSet {js['metadata']['name']} deleted")
        try:   # the pods' account and its role to cordon nodes (cordoning.py)
            cordoning.delete(api, st.name)
        except kube.KubeError as e:
            progress(f"the role that lets tpuctl's pods cordon a sick node was not deleted: {e.message}")

    def let_go(self, run_id: str) -> None:
        """A follower (`submit`, `logs -f`) is done with the run: if it ended, the hold may go (the follower saw
        its end in the store, after its last look at the JobSet)."""
        self.said.pop(run_id, None)
        seen = self.seen.pop(run_id, None)
        if seen is not None and runs.status(seen[1], run_id).state.final:
            self._release_if_idle(seen[0], seen[1], self._api(seen[0]), run_id)


def queued_words(api: Any, js: dict[str, Any]) -> str:
    """`queued (Kueue: ...)` while Kueue holds the run's JobSet (kueue.py), "" when it has admitted it or the
    JobSet has no queue."""
    if manifest.QUEUE_LABEL not in js["metadata"].get("labels", {}):
        return ""
    return kueue.queued_words(kueue.workload_of(api, js))


def _note(store: BlobStore, run_id: str, said: str) -> None:
    """Kueue's word in the run's status (`status`, `jobs`) while no agent runs it: a run not yet started stays
    queued, one evicted stays interrupted (requeued, not failed), each with Kueue's reason."""
    cur = runs.status(store, run_id)
    if cur.state in (RunState.QUEUED, RunState.INTERRUPTED) and cur.note != said:
        store.write(layout.run_status(run_id, 0), json.dumps(replace(cur, note=said).to_json()).encode())


def _text(log: Any) -> str:
    s = log if isinstance(log, str) else json.dumps(log) if log is not None else ""
    return s if s.endswith("\n") or not s else s + "\n"
