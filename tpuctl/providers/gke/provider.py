"""GkeProvider: the Provider contract (../base.py) over GKE (issue 37). TPU slices are node pools of a GKE Standard
cluster (compute.py), planned offline (planning.py, tputypes.py); the store is the same GCS bucket as for
--provider gcp, with grants on the bucket only for the node pools' service account (TPU pods use the host network,
and Workload Identity does not serve host-network pods: GCS FUSE CSI driver docs/authentication.md; GKE_FACTS.md),
so the gcp provider's storage and IAM code serves as it is. Each run is a JobSet (the JobSet half of issue 37:
manifest.py, runs.py); recovery from a lost node is GKE's (it recreates a repaired multi-host node pool whole:
kubernetes-engine/docs/concepts/tpus) and JobSet's (it restarts the run, up to `submit --max-restarts`)."""
from __future__ import annotations

import secrets
from typing import Any

from ...core.catalog import region_of
from ...core.errors import ErrorKind, TpuctlError, bad_input
from ...core.models import ClusterSpec, ClusterState, ProviderName, cluster_record
from ..base import Compute, Enforcement, Placement, PlanRow, Price, Progress, Reporter, UpFlags, progress_of
from ..google import clients, permissions, storage
from ..google.gcs_store import GcsStore
from ..google.iam import BucketIam
from . import container, planning
from .compute import GkeCompute, record_of
from .inventory import GkeInventory
from .kube import KubeError
from .runs import GkeRuns

SELF_RECOVERY = ("on GKE, GKE recreates a preempted or repaired TPU node pool and JobSet restarts the run from its "
                 "checkpoint, up to `submit --max-restarts N` times")


def install_jobset(rec: dict[str, Any]) -> str:
    """JobSet into the cluster (jobset_install.ensure_jobset: "installed v0.10.1", "found v0.10.1"; an older JobSet
    is refused, and this `up` undone), through the record's kubeconfig context or GKE's endpoint and a token."""
    from . import kube
    from .jobset_install import ensure_jobset
    return str(ensure_jobset(kube.for_record(rec, clients.access_token)))


def install_kueue(st: ClusterState) -> str:
    """`up --kueue`: Kueue and its queue for the record's node pools, the LocalQueue in the cluster's namespace
    (kueue_install.ensure_kueue)."""
    from . import kube, tputypes
    from .kueue_install import ensure_kueue
    rec = record_of(st)
    return ensure_kueue(kube.for_record(rec, clients.access_token), tputypes.shape(str(rec["tpu_type"])),
                        int(rec.get("slices") or 1), adopted=bool(rec.get("adopted")),
                        namespace=st.spec.namespace or "default", cluster=st.name)


def make_namespace(st: ClusterState) -> bool:
    """`up --namespace`: the namespace, made if missing (namespaces.ensure)."""
    from . import kube, namespaces
    try:
        return namespaces.ensure(kube.for_record(record_of(st), clients.access_token), st.spec.namespace, st.name)
    except KubeError as e:   # one line, and this `up` undone, as for any step
        raise TpuctlError(ErrorKind.ERROR, f"namespace {st.spec.namespace}: {e.message}",
                          "creating a namespace needs that right in the cluster (Kubernetes RBAC); or give "
                          "--namespace one that exists") from None


def drop_namespace(st: ClusterState) -> str:
    """`down` (or an undone `up`) in an adopted cluster: the namespace, if tpuctl made it (namespaces.remove)."""
    from . import kube, namespaces
    rec = record_of(st)
    if not rec.get("endpoint"):
        return "not looked at (up never reached the cluster's Kubernetes API)"
    try:
        return namespaces.remove(kube.for_record(rec, clients.access_token), st.spec.namespace, st.name)
    except KubeError as e:   # the rest of `down` goes on; the namespace is said kept
        return f"kept ({e.message})"


class GkeProvider:
    name = ProviderName.GKE
    store_noun = "bucket"
    watcher_host = None
    self_recovery = SELF_RECOVERY

    def __init__(self) -> None:
        self.grants = BucketIam()
        self.nonce = secrets.token_hex(4)
        self.compute = GkeCompute(self.grants.default_service_account, install_jobset, install_kueue,
                                  make_namespace, drop_namespace)
        self.inventory = GkeInventory()
        self.remote_runs = GkeRuns()   # each run is a JobSet (runs.py)
        self._checked: set[str] = set()

    # -- planning (offline) ------------------------------------------------------------------------------
    def make_spec(self, name: str, flags: UpFlags) -> ClusterSpec:
        return planning.make_spec(name, flags)

    def plan(self, spec: ClusterSpec) -> list[PlanRow]:
        if spec.autostop or spec.max_duration:
            # Nothing on a GKE node ends its node pool (no host agent holds a grant to): refused, not shown armed.
            raise bad_input("--autostop and --max-duration are not enforced on GKE",
                            "leave them out (and autostop/max_duration in the config); `tpuctl down` ends the "
                            "node pools")
        return planning.plan(spec)

    def price(self, spec: ClusterSpec) -> Price:
        return planning.price(spec)

    def placements(self, spec: ClusterSpec) -> list[Placement]:
        return [Placement(z, region_of(z)) for z in spec.zones]

    # -- making and removing -----------------------------------------------------------------------------
    def preflight(self, spec: ClusterSpec) -> list[str]:
        """Credentials, then the project-level permissions `up` needs (Resource Manager's testIamPermissions, as for
        --provider gcp), asked once per process."""
        clients.preflight(clients.GKE_APIS)
        if spec.project in self._checked:
            return []
        self._checked.add(spec.project)
        return permissions.check(spec, planning.permissions_needed(spec))

    def ensure_store(self, spec: ClusterSpec, region: str, progress: Progress) -> bool:
        return storage.ensure(spec.project, spec, storage.bucket_of(spec), region, self.nonce, progress)

    def delete_store(self, st: ClusterState, progress: Progress) -> None:
        storage.delete(st.spec.project, storage.bucket_of(st.spec), st.name, progress)

    def choose_runtime(self, spec: ClusterSpec, placement: Placement) -> str:
        return ""   # GKE picks the node image; the run's container image is the spec's

    def ensure_compute(self, st: ClusterState, reporter: Reporter) -> Compute:
        return self.compute.ensure(st, reporter)

    def delete_compute(self, st: ClusterState, reporter: Reporter) -> None:
        if record_of(st).get("endpoint"):   # the runs' JobSets first: an adopted cluster outlives down
            self.remote_runs.delete_all(st, progress_of(reporter, "jobsets", st.name))
        self.compute.delete(st, reporter)

    def write_cluster_record(self, st: ClusterState, confirmed: bool) -> None:
        """cluster.json for the pods' agents (the job runs in the pod: tpu_address "local"), with the GKE record
        under "gke"; ahead of creation, the agent package the pods install."""
        record = cluster_record(st, "local")
        record["gke"] = record_of(st)
        storage.write_record(st.spec.project, storage.bucket_of(st.spec), record, with_agent=not confirmed)

    # -- using -------------------------------------------------------------------------------------------
    def store(self, st: ClusterState) -> GcsStore:
        return GcsStore(st.spec.store, st.spec.project)

    def revive(self, st: ClusterState, reporter: Reporter) -> ClusterState:
        return st   # GKE restarts what fails on its nodes

    def _missing(self, st: ClusterState) -> list[str]:
        name = planning.cluster_name(st.spec)
        c = container.find_cluster(st.spec.project, name)
        if c is None:
            return [f"GKE cluster {name}"]
        have = {p.name for p in container.list_pools(st.spec.project, c.location, name)}
        return [f"node pool {p}" for p in planning.pool_names(st.spec) if p not in have]

    def check_ready(self, st: ClusterState) -> None:
        missing = self._missing(st)
        if missing:
            raise TpuctlError(ErrorKind.NOT_FOUND, f"cluster {st.name} lacks {', '.join(missing)}",
                              f"`tpuctl up -c {st.name}` makes them again")

    def host_state(self, st: ClusterState) -> tuple[bool, str]:
        return True, "GKE runs the pods; JobSet restarts them"

    def problem(self, st: ClusterState) -> tuple[str, str] | None:
        missing = self._missing(st)
        return (f"missing: {', '.join(missing)}", f"tpuctl up -c {st.name}") if missing else None

    def compute_lost(self, st: ClusterState) -> str | None:
        missing = self._missing(st)
        return f"{', '.join(missing)} deleted" if missing else None

    def enforcement(self, st: ClusterState) -> Enforcement:
        return Enforcement(False, "nothing on a GKE node ends its node pools", "`tpuctl down` ends them")

    def ssh_argv(self, st: ClusterState, worker: int, command: str) -> list[str]:
        rec = record_of(st)
        raise bad_input(f"cluster {st.name} runs in GKE pods: there is no host tpuctl opens a shell on",
                        f"gcloud container clusters get-credentials {rec.get('cluster', st.spec.tpu_name)} "
                        f"--location {rec.get('location', st.zone)}, then kubectl exec -it POD -- bash")

    def location(self, st: ClusterState) -> str:
        return f"{st.spec.tpu_type} x {st.spec.slices} on GKE cluster {planning.cluster_name(st.spec)} in {st.zone}"

    def summary(self, st: ClusterState) -> dict[str, object]:
        s = st.spec
        return {"project": s.project, "type": s.tpu_type, "zone": st.zone, "gke_cluster": planning.cluster_name(s),
                "adopted": bool(s.gke_cluster), "node_pools": ", ".join(planning.pool_names(s)), "slices": s.slices,
                "spot": s.spot, "image": s.image or "the default", "namespace": s.namespace or "default"}

    def describe(self, st: ClusterState) -> dict[str, dict[str, object]]:
        name = planning.cluster_name(st.spec)
        c = container.find_cluster(st.spec.project, name)
        if c is None:
            return {"gke": {"name": name, "state": "MISSING"}}
        out: dict[str, dict[str, object]] = {"gke": {"name": name, "state": type(c).Status(c.status).name,
                                                     "version": c.current_master_version, "location": c.location}}
        pools = {p.name: p for p in container.list_pools(st.spec.project, c.location, name)}
        for pool in planning.pool_names(st.spec):
            p = pools.get(pool)
            out[f"pool {pool}"] = {"state": type(p).Status(p.status).name if p else "MISSING",
                                   "nodes": p.initial_node_count if p else 0}
        if record_of(st).get("endpoint"):   # the runs: JobSet conditions, restarts, each pod's phase and node
            try:
                out.update(self.remote_runs.describe(st))
            except (TpuctlError, KubeError) as e:   # status shows the rest all the same
                out["jobsets"] = {"state": f"unknown: {e}"}
        return out

    def teardown_list(self, st: ClusterState) -> list[str]:
        s = st.spec
        items = [f"node pool {p}" for p in planning.pool_names(s)] if s.gke_cluster else \
            [f"GKE cluster {planning.cluster_name(s)} and its node pools"]
        wp = planning.policy_name(s)
        return items + ([f"workload policy {wp}"] if wp else [])
