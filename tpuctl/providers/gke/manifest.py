"""The Kubernetes objects of one run on GKE: one JobSet, built as Python data and dumped to YAML.

Shaped as xpk 1.16.0 shapes a TPU workload (`commands/workload.py` WORKLOAD_CREATE_YAML, `core/scheduling.py`),
field by field; where tpuctl differs, the difference and its reason are listed in tests/test_gke_xpk.py, which
compares the two manifests. The fields and their JobSet meaning are from kubernetes-sigs/jobset v0.10.1
(`api/jobset/v1alpha2/jobset_types.go`, `pkg/webhooks/jobset_webhook.go`); tests validate every manifest against
that release's CRD schema and the pod template against Kubernetes' own (kubernetes-validate).

Each pod runs tpuctl's agent for this one run, installed from the cluster's store as a TPU VM host installs it
(templates/startup.sh: the agent wheel at layout.agent_package, pip-installed with --no-deps, then the store client),
so logs, metrics, outputs and restarts go through the store as on a TPU VM.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ...core import layout
from ...core.errors import bad_input
from ..google.gcs_store import SATISFIED, STORAGE

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
REPLICATED_JOB = "slice"        # xpk names it slice-job; shorter leaves room for the run id in pod names
CONTAINER = "tpuctl"            # the container the pod failure policy's exit codes refer to
DEFAULT_IMAGE = "python:3.12-slim-bookworm"   # pip and python3, nothing else: the agent installs each job's stack
DEFAULT_NAMESPACE = "default"
LABEL_CLUSTER = "tpuctl-cluster"
LABEL_RUN = "tpuctl-run"

# xpk `get_restart_exit_codes`: 42 (a job that asks to be restarted, tpuctl's own convention too) and 127..255
# (killed by a signal: 128 + N; 127 a command not found) restart; every other non-zero code fails the JobSet.
RESTART_EXIT_CODES = [42, *range(127, 256)]

# JobSet v0.10.1 `api/jobset/v1alpha2/jobset_types.go`: ExclusiveKey; xpk core/scheduling.py
# ONE_TO_ONE_REPLICA_NODE_POOL_ASSIGNMENT_ANNOTATION: each Job (slice) takes a node pool of its own.
EXCLUSIVE_TOPOLOGY = {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
# JobSet sets these on every pod (jobset_types.go JobIndexKey, pkg/constants RestartsKey); read by the downward API.
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
# Multislice (issue 49 item 1; issue 57 item 1). JobSet sets no MEGASCALE_* (kubernetes-sigs/jobset#787), and JAX
# reads them from the environment first (jax/_src/clusters/cloud_tpu_cluster.py `get_tpu_env_value`): the manifest
# gives each pod its own. `global-replicas` (the Jobs of the JobSet: its slices) and `job-global-index` (this Job's:
# its slice) are annotations JobSet v0.10.1 writes on every Job and pod (api/jobset/v1alpha2/jobset_types.go).
# The coordinator is NOT taken from `spec.coordinator`: JobSet v0.10.1 writes it as a *label* too
# (pkg/controllers/jobset_controller.go `labelAndAnnotateObject`, lines 799-803:
# `labels[jobset.CoordinatorKey] = coordinatorEndpoint(js)`), with `coordinatorEndpoint` (lines 1086-1090)
# = "%s-%s-%d-%d.%s" (name, replicated job, job index, pod index, subdomain = the JobSet's name: `GetSubdomain`,
# lines 835-844). With a JobSet name of "tpuctl-" + a 24-character run id that is 73 characters; a label value holds
# 63, so the API server refused every Job and v0.10.1 retried for ever (`createJobs` returns the error, no
# condition: lines 538-541, 559-587); v0.11 refuses the JobSet (commit a9461e60). The address itself is known when
# the manifest is built, so it is written as a plain value: slice 0's worker 0, "the host with process id = 0"
# (cloud_tpu_cluster.py), by the DNS name Kubernetes gives it: an Indexed Job's pod is named `<job>-<index>` as
# hostname under the pod template's subdomain (Kubernetes docs, Job "Completion mode"), which JobSet sets to the
# JobSet's name (constructJob, lines 708-712; enableDNSHostnames defaulted true by pkg/webhooks/jobset_webhook.go
# lines 130-136) behind a headless Service of that name (createHeadlessSvcIfNecessary, lines 614-640); a Job is
# named `<jobset>-<replicatedJob>-<jobIndex>` (placement.GenJobName). JAX keeps the host part only
# (`coordinator_address.split(':')[0]`) and libtpu uses its own port by default, so no port is added.
GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
# Kueue (issue 49 item 9): a JobSet opts into a LocalQueue by this label, as xpk's WORKLOAD_CREATE_YAML and
# Kueue's JobSet integration read it (kueue pkg/controller/constants QueueLabel "kueue.x-k8s.io/queue-name"); the
# run's priority is its pods' priorityClassName, which Kueue takes as the Workload's priority (kueue
# pkg/util/priority: the pod sets' PriorityClassName) and which xpk writes (`priorityClassName: {priority}`).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# A Kueue WorkloadPriorityClass is named by this label on the job, which Kueue reads before the pods'
# priorityClassName (kueue pkg/controller/constants WorkloadPriorityClassLabel; jobframework/reconciler.go
# `ExtractPriority`): `--priority NAME` naming one is written so (issue 57 item 6).
WORKLOAD_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Bounds that keep a manifest inside its fields: maxRestarts is an int32 (jobset_types.go FailurePolicy.MaxRestarts
# int32), and a run takes at most the slices `up` makes (planning.MAX_SLICES).
MAX_RESTARTS = 1000
MAX_SLICES = 64
# GKE TPU node labels (xpk core/system_characteristics.py create_accelerator_label / create_machine_label;
# TPU7x multi-host: core/scheduling.py create_placement_policy_label).
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
PLACEMENT_LABEL = "cloud.google.com/placement-policy-name"
TPU_RESOURCE = "google.com/tpu"
# The pod's cpu and memory requests (issue 57 item 6), so that it is not BestEffort: the QoS class of a pod none of
# whose containers requests or limits cpu or memory, the first the kubelet evicts under node pressure (Kubernetes
# docs, "Pod Quality of Service Classes"; google.com/tpu, an extended resource, does not count). A request is what the
# scheduler reserves, so it is small beside any TPU host (the smallest, ct5lp-hightpu-1t, has 24 vCPUs and 48 GB:
# GKE TPU docs, "Plan TPUs in GKE"); the agent and the job may use more (no cpu or memory limit is set).
# Kueue's rule decides when they are written: a Workload whose pods request a resource (non-zero) that no resource
# group of its ClusterQueue covers is never admitted ("resource cpu unavailable in ClusterQueue":
# kubernetes-sigs/kueue pkg/scheduler/flavorassigner/flavorassigner.go findFlavorForPodSetResource; a zero request
# passes), and a team's ClusterQueue may cover google.com/tpu alone (as xpk's does without --cpu-limit /
# --memory-limit). So the pods request cpu and memory when the run has no queue (no Kueue admits it), or when the
# queue's ClusterQueue covers both (tpuctl's own from `up --kueue` does: kueue_install.UNBOUNDED); otherwise they
# ask for none, as before, rather than wait for ever.
POD_REQUESTS = {"cpu": "1", "memory": "4Gi"}
# The agent's grace between SIGTERM and SIGKILL (host/agent.py passes SIGTERM to the job, which checkpoints);
# cancel waits this long before deleting the JobSet, and the pod is given as long.
GRACE_SECONDS = 30


class Shape(Protocol):
    """What the manifest uses of providers/gke/tputypes.SliceShape (a frozen dataclass: read-only here too)."""
    @property
    def tpu_type(self) -> str: ...
    @property
    def accelerator(self) -> str: ...
    @property
    def topology(self) -> str: ...
    @property
    def chips_per_host(self) -> int: ...
    @property
    def hosts(self) -> int: ...
    @property
    def needs_workload_policy(self) -> bool: ...


@dataclass(frozen=True)
class RunObjects:
    """What one run's JobSet is made from."""
    cluster: str
    run_id: str
    shape: Shape
    slices: int
    max_restarts: int
    image: str
    store_uri: str          # gs://bucket (a directory under the fake kubelet)
    agent_version: str
    workload_policy: str = ""   # TPU7x multi-host: the node pools' workload policy (placement-policy-name)
    namespace: str = DEFAULT_NAMESPACE
    queue: str = ""             # Kueue's LocalQueue ("": none: the cluster runs no Kueue)
    priority: str = ""          # the pods' PriorityClass ("": the cluster's default)
    workload_priority: bool = False   # `priority` names a Kueue WorkloadPriorityClass: the JobSet's label instead
    own_pools: bool = True      # the pods select tpuctl's node pools (False: a team's queue's flavors place them)
    service_account: str = ""   # the pods' account, which may cordon their node (cordoning.py); "": the default
    queue_covers: bool = False  # the ClusterQueue behind `queue` covers cpu and memory (kueue.covers)


def jobset_name(run_id: str) -> str:
    """DNS-1035 (a letter first; JobSet's webhook checks the pod names it derives fit 63 characters)."""
    return "tpuctl-" + run_id.lower()


def check(slices: int, max_restarts: int, shape: Shape) -> None:
    if slices < 1:
        raise bad_input(f"--slices {slices}: a run needs at least one slice", "--slices 1 or more")
    if slices > MAX_SLICES:
        raise bad_input(f"--slices {slices} is more than a GKE cluster of tpuctl's has", f"give 1 to {MAX_SLICES}")
    if slices > 1 and not shape.hosts > 1:
        # GKE Multislice needs multi-host node pools (kubernetes-engine/docs/how-to/tpu-multislice).
        raise bad_input(f"{shape.tpu_type} is a single-host slice: GKE Multislice takes multi-host slices only",
                        "a type of more than one host, e.g. v6e-16, or --slices 1")
    if max_restarts < 0:
        raise bad_input(f"--max-restarts {max_restarts} is negative", "--max-restarts 0 or more")
    if max_restarts > MAX_RESTARTS:
        raise bad_input(f"--max-restarts {max_restarts} is more than tpuctl allows", f"give 0 to {MAX_RESTARTS}")


def build_jobset(r: RunObjects) -> dict[str, Any]:
    check(r.slices, r.max_restarts, r.shape)
    labels = {LABEL_CLUSTER: r.cluster, LABEL_RUN: r.run_id.lower()}
    meta_labels = {**labels, **({QUEUE_LABEL: r.queue} if r.queue else {}),
                   **({WORKLOAD_PRIORITY_LABEL: r.priority} if r.priority and r.workload_priority else {})}
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {"name": jobset_name(r.run_id), "namespace": r.namespace, "labels": meta_labels,
                     "annotations": dict(EXCLUSIVE_TOPOLOGY)},
        "spec": {
            # xpk: rules [FailJobSet on PodFailurePolicy]: a Job failed by its pod failure policy (a code not in
            # RESTART_EXIT_CODES) fails the JobSet at once; any other Job failure restarts it, counted against
            # maxRestarts (jobset_types.go FailurePolicy; no matching rule = RestartJobSet).
            "failurePolicy": {"maxRestarts": r.max_restarts,
                              "rules": [{"name": "fail-on-exit-code", "action": "FailJobSet",
                                         "onJobFailureReasons": ["PodFailurePolicy"]}]},
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": r.slices,
                                "template": {"metadata": {"labels": dict(labels)}, "spec": _job_spec(r, labels)}}],
        },
    }


def _job_spec(r: RunObjects, labels: dict[str, str]) -> dict[str, Any]:
    hosts = r.shape.hosts
    return {
        "parallelism": hosts, "completions": hosts,   # every host of the slice at once, one pod each
        "completionMode": "Indexed",   # JobSet's webhook defaults it; written so JOB_COMPLETION_INDEX is explicit
        "backoffLimit": 0,             # a failed pod fails its Job; the JobSet restarts the whole run
        "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
            "containerName": CONTAINER, "operator": "NotIn", "values": RESTART_EXIT_CODES}}]},
        "template": {"metadata": {"labels": dict(labels)}, "spec": _pod_spec(r)},
    }


def _node_selector(r: RunObjects) -> dict[str, str]:
    sel = {ACCELERATOR_LABEL: r.shape.accelerator, TOPOLOGY_LABEL: r.shape.topology}
    if r.own_pools:   # the node label `up` gives tpuctl's pools (container.build_node_pool)
        sel[LABEL_CLUSTER] = r.cluster
    if r.shape.needs_workload_policy:
        if not r.workload_policy:
            raise bad_input(f"{r.shape.tpu_type} is multi-host TPU7x: its pods select the workload policy",
                            "the cluster record names it (up makes it)")
        sel[PLACEMENT_LABEL] = r.workload_policy
    return sel


def _pod_spec(r: RunObjects) -> dict[str, Any]:
    return {
        **({"priorityClassName": r.priority} if r.priority and not r.workload_priority else {}),
        "restartPolicy": "Never",   # the Job's pod failure policy needs it (Kubernetes Job docs)
        **({"serviceAccountName": r.service_account} if r.service_account else {}),
        "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",   # xpk: TPU hosts talk over the host network
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "nodeSelector": _node_selector(r),
        # any effect, as xpk; and the taint of tpuctl's pools (container.build_node_pool): a run placed by a team's
        # queue may be given one of them by its flavors
        "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists"},
                        {"key": LABEL_CLUSTER, "operator": "Equal", "value": r.cluster, "effect": "NoSchedule"}],
        "containers": [_container(r)],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }


def _container(r: RunObjects) -> dict[str, Any]:
    chips = str(r.shape.chips_per_host)
    return {
        "name": CONTAINER, "image": r.image,
        "command": ["/bin/sh", "-c", AGENT_SCRIPT],
        "env": [
            {"name": "TPUCTL_STORE", "value": r.store_uri},
            {"name": "TPUCTL_AGENT_PACKAGE", "value": layout.agent_package(r.agent_version)},
            {"name": "TPUCTL_RUN", "value": r.run_id},
            {"name": "TPUCTL_ACCELERATOR", "value": r.shape.tpu_type},
            {"name": "TPUCTL_SLICE", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{JOB_INDEX}']"}}},
            {"name": "TPUCTL_RESTART", "valueFrom": {"fieldRef": {
                "fieldPath": f"metadata.labels['{RESTART_ATTEMPT}']"}}},
            # the node a sick host's agent cordons (host/cordon.py); the downward API gives env spec.nodeName
            {"name": "TPUCTL_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            *(_megascale(jobset_name(r.run_id)) if r.slices > 1 else []),
        ],
        "resources": {"limits": {TPU_RESOURCE: chips},
                      **({"requests": dict(POD_REQUESTS)} if not r.queue or r.queue_covers else {})},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }


def coordinator_address(name: str) -> str:
    """Slice 0's worker 0 by its DNS name under the JobSet's headless Service (see GLOBAL_REPLICAS above)."""
    return f"{name}-{REPLICATED_JOB}-0-0.{name}"


def _megascale(name: str) -> list[dict[str, Any]]:
    def annotation(key: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}
    return [{"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": coordinator_address(name)},
            {"name": "MEGASCALE_NUM_SLICES", "valueFrom": annotation(GLOBAL_REPLICAS)},
            {"name": "MEGASCALE_SLICE_ID", "valueFrom": annotation(JOB_GLOBAL_INDEX)}]


# The pod's program: the agent wheel from the store (gs:// through google-cloud-storage, in the range the agent
# needs; a directory under the fake kubelet), then the agent for this run alone; its exit code is the job's, which
# the pod failure policy reads. JOB_COMPLETION_INDEX is set by Kubernetes for an Indexed Job (Job docs,
# "Completion mode"): the host's worker number in its slice.
# Each install is retried as the TPU VM's start-up script retries (templates/startup.sh `retry`: backing off 2 s,
# 4 s, ... 60 s, for TPUCTL_RETRY_SECONDS, 300 by default): a registry or the bucket that does not answer at once is
# no reason to end the run (an image without python3 is: exit 1). One that never answers exits 42, a restart code
# (RESTART_EXIT_CODES), so the JobSet restarts the run within --max-restarts rather than the pod failure policy's
# FailJob ending it for good (exit 1).
AGENT_SCRIPT = r"""set -u
PY="${TPUCTL_PYTHON:-python3}"
WHEEL="${TMPDIR:-/tmp}/$(basename "$TPUCTL_AGENT_PACKAGE")"
if ! command -v "$PY" >/dev/null 2>&1; then   # no retry mends an image: exit 1, the pod failure policy's FailJob
  echo "tpuctl pod: no $PY in the image (it needs python3 with pip)" >&2; exit 1
fi
retry() {
  what="$1"; shift; start=$(date +%s); delay=2
  until "$@"; do
    if [ $(( $(date +%s) - start )) -ge "${TPUCTL_RETRY_SECONDS:-300}" ]; then
      echo "tpuctl pod: giving up on $what; exit 42 asks the JobSet to restart the run" >&2; exit 42
    fi
    echo "tpuctl pod: $what failed; again in ${delay}s" >&2; sleep "$delay"
    delay=$(( delay * 2 > 60 ? 60 : delay * 2 ))
  done
}
fetch() {
  "$PY" - "$TPUCTL_STORE" "$TPUCTL_AGENT_PACKAGE" "$WHEEL" <<'EOF'
import shutil, sys
store, key, dest = sys.argv[1:]
if store.startswith("gs://"):
    from google.cloud import storage
    storage.Client().bucket(store[5:]).blob(key).download_to_filename(dest)
else:
    shutil.copyfile(store.rstrip("/") + "/" + key, dest)
EOF
}
case "$TPUCTL_STORE" in   # the store client, unless the image has one in range (gcs_store.SATISFIED)
  gs://*) "$PY" -c '@{satisfied}' "@{storage_req}" >/dev/null 2>&1 || retry "pip install of the store client" \
            "$PY" -m pip install -q --no-cache-dir --no-compile "@{storage_req}" ;;
esac
retry "the agent package in the store" fetch
retry "pip install of the agent" "$PY" -m pip install -q --no-cache-dir --no-compile --force-reinstall --no-deps "$WHEEL"
exec "$PY" -m tpuctl.agent --store "$TPUCTL_STORE" --run "$TPUCTL_RUN" --slice "${TPUCTL_SLICE:-0}" \
  --worker "${JOB_COMPLETION_INDEX:-0}" --accelerator "$TPUCTL_ACCELERATOR" --attempt "$((${TPUCTL_RESTART:-0} + 1))"
""".replace("@{storage_req}", STORAGE).replace("@{satisfied}", SATISFIED)   # as the start-up script's STORAGE_REQ


def dump(objects: list[dict[str, Any]]) -> str:
    """YAML, one document per object, keys in the order built (kubectl's order is not required)."""
    import yaml
    return "---\n".join(yaml.safe_dump(o, sort_keys=False, default_flow_style=False) for o in objects)


def load_all(path: Path) -> tuple[dict[str, Any], ...]:
    """The non-empty YAML documents of a shipped release file (JobSet's, Kueue's), with libyaml's safe loader where
    PyYAML was built with it (the same documents; PyYAML's own loader is the fallback): a 1.7 MB release parses in a
    tenth of the CPU, once per `up`."""
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(d for d in yaml.load_all(path.read_text(), Loader=loader) if d)
