"""What `up --provider gke` makes and `down` removes, in order: the GKE cluster (made, or adopted by --gke-cluster),
the TPU7x workload policy, one TPU node pool per slice, then JobSet in the cluster. A failure part-way removes what
this call made (base.py's rule for ensure_compute); what it adopted stays. `down` removes the node pools and the
policy, and the cluster only when tpuctl made it (an adopted one is never deleted: its record says `adopted`).

The cluster's facts are kept in the state's record under "gke" (the contract with the JobSet half of issue 37):
project, location, cluster, adopted, endpoint, ca_certificate, node_pools, workload_policy, service_account, image,
slices, tpu_type.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from ...core.errors import ErrorKind, TpuctlError
from ...core.models import ClusterState, HostFacts, require_owned
from ..base import Compute, Created, Reporter, progress_of
from ...core.together import together
from . import container, policy
from .planning import SYSTEM_MACHINE, SYSTEM_POOL, cluster_name, policy_name, pool_names
from .tputypes import TPU7X_MIN_GKE_VERSION, shape

JobSetInstaller = Callable[[dict[str, Any]], str]   # the cluster's record -> JobSet's state in words
Installer = Callable[[ClusterState], str]          # the cluster (its record written) -> what was done, in words
NamespaceMaker = Callable[[ClusterState], bool]    # the cluster -> whether its namespace was made now


def record_of(st: ClusterState) -> dict[str, Any]:
    """The cluster's GKE record, as this state knows it ({} before `up` got that far)."""
    return dict(st.record.get("gke") or {})


def _adopt_cluster(st: ClusterState, name: str) -> Any:
    c = container.find_cluster(st.spec.project, name)
    if c is None:
        raise TpuctlError(ErrorKind.NOT_FOUND, f"no GKE cluster {name} in project {st.spec.project}",
                          "check --gke-cluster and --project (`gcloud container clusters list`)")
    if c.autopilot.enabled:
        raise TpuctlError(ErrorKind.INPUT, f"GKE cluster {name} is an Autopilot cluster; tpuctl makes TPU node "
                          "pools, which only a Standard cluster has", "pass a Standard cluster to --gke-cluster")
    _check_version(st, c)
    return c


def _check_version(st: ClusterState, c: Any) -> None:
    if shape(st.spec.tpu_type).family != "tpu7x":
        return
    if container.version_key(c.current_master_version) < container.version_key(TPU7X_MIN_GKE_VERSION):
        raise TpuctlError(ErrorKind.INPUT, f"GKE cluster {c.name} runs {c.current_master_version}; TPU7x needs "
                          f">= {TPU7X_MIN_GKE_VERSION}", f"gcloud container clusters upgrade {c.name} --master "
                          f"--cluster-version=VERSION --location={c.location}")


class GkeCompute:
    """Makes and removes a cluster's GKE resources. `install_jobset(record)` puts JobSet into the cluster and says
    its state (provider.py's, through the JobSet half's jobset_install.ensure_jobset); tests pass their own."""

    def __init__(self, default_account: Callable[[str], str], install_jobset: JobSetInstaller,
                 install_kueue: Installer = lambda st: "", make_namespace: NamespaceMaker = lambda st: False,
                 drop_namespace: Installer = lambda st: "") -> None:
        self.default_account = default_account
        self.install_jobset = install_jobset
        self.install_kueue = install_kueue
        self.make_namespace = make_namespace      # namespaces.ensure, through the record's Kubernetes API
        self.drop_namespace = drop_namespace      # namespaces.remove, likewise

    def ensure(self, st: ClusterState, reporter: Reporter) -> Compute:
        made: list[Created] = []
        try:
            rec = self._ensure_all(st, reporter, made)
        except BaseException:   # Ctrl-C too: what this call made is not left billing
            for c in reversed(made):
                try:
                    c.undo()
                except TpuctlError as e:
                    reporter.warn(f"could not remove {c.kind} {c.name}: {e.message}")
            raise
        s = shape(st.spec.tpu_type)
        return Compute(made, HostFacts(hosts=s.hosts, service_account=rec["service_account"]))

    def _ensure_all(self, st: ClusterState, reporter: Reporter, made: list[Created]) -> dict[str, Any]:
        spec, s = st.spec, shape(st.spec.tpu_type)
        name = cluster_name(spec)
        # The policy first: it needs no cluster, and undone last, after the node pools that use it are gone.
        wp = policy_name(spec)
        if wp and policy.ensure(spec.project, st.zone, wp, s.topology, spec.name, progress_of(reporter, "policy", wp)):
            made.append(Created("policy", wp, lambda: policy.delete(spec.project, st.zone, wp, spec.name,
                                                                    lambda m: None)))
        c = self._ensure_cluster(st, name, reporter, made)
        account = spec.service_account or self.default_account(spec.project)
        try:
            endpoint, ca = container.api_endpoint(c)
        except TpuctlError:
            if not spec.kube_context:   # with one, the context is the way in: the endpoint only marks it reachable
                raise
            endpoint, ca = c.endpoint or c.control_plane_endpoints_config.dns_endpoint_config.endpoint, ""
        rec = {"project": spec.project, "location": c.location, "cluster": name, "adopted": bool(spec.gke_cluster),
               "endpoint": endpoint, "ca_certificate": ca,
               "node_pools": pool_names(spec), "workload_policy": wp, "service_account": account,
               "image": spec.image, "slices": spec.slices, "tpu_type": spec.tpu_type, "context": spec.kube_context,
               "namespace": spec.namespace or "default"}
        st.record["gke"] = rec
        # All at once, as xpk makes them (core/nodepool.py: run_commands(create_commands, ..., batch=100)): `up
        # --slices N` takes one node pool's time, not N. Each is waited for; the first failure in order is raised
        # after all have ended, and ensure() undoes what was made (container._start waits out a cluster that runs
        # one operation at a time).
        vpc_native = bool(c.ip_allocation_policy.use_ip_aliases)   # container.build_node_pool: max pods per node
        together([functools.partial(self._ensure_pool, st, c.location, name, pool, account, reporter, made,
                                    vpc_native) for pool in rec["node_pools"]])
        reporter.resource("jobset", name, self.install_jobset(rec), final=True)
        if spec.namespace:   # `up --namespace` (namespaces.py): before the LocalQueue that goes in it
            made_now = self.make_namespace(st)
            reporter.resource("namespace", spec.namespace, "made" if made_now else "found", final=True)
            if made_now and spec.gke_cluster:   # in a cluster this `up` made, the cluster's undo takes it
                made.append(Created("namespace", spec.namespace, lambda: self._drop_namespace(st)))
        if spec.kueue:   # in a cluster this `up` made, down deletes it all; in an adopted one, down leaves it
            reporter.resource("kueue", name, self.install_kueue(st), final=True)
        return rec

    def _drop_namespace(self, st: ClusterState) -> None:
        self.drop_namespace(st)

    def _ensure_cluster(self, st: ClusterState, name: str, reporter: Reporter, made: list[Created]) -> Any:
        spec = st.spec
        show = progress_of(reporter, "gke", name)
        if spec.gke_cluster:
            c = _adopt_cluster(st, name)
            show("ADOPTED")
            return c
        c = container.find_cluster(spec.project, name)
        if c is not None:
            require_owned(c.resource_labels, spec.name, f"GKE cluster {name}")
            _check_version(st, c)
            c = container.wait_ready(f"GKE cluster {name}", lambda: container.find_cluster(spec.project, name), show)
            show("adopted")
            return c
        version = container.pick_version(spec.project, st.zone,
                                         TPU7X_MIN_GKE_VERSION if shape(spec.tpu_type).family == "tpu7x" else "")
        try:
            container.create_cluster(spec.project, st.zone, container.build_cluster(
                name, spec.labels, version, SYSTEM_MACHINE, SYSTEM_POOL, spec.network, spec.subnetwork), show)
        finally:   # a create that failed part-way may still have left a cluster: removed with the rest
            if container.find_cluster(spec.project, name) is not None:
                made.append(Created("gke", name, lambda: container.delete_cluster(
                    spec.project, name, spec.name, lambda m: None)))
        return container.find_cluster(spec.project, name)

    def _ensure_pool(self, st: ClusterState, location: str, cluster: str, pool: str, account: str,
                     reporter: Reporter, made: list[Created], vpc_native: bool = True) -> None:
        spec, s = st.spec, shape(st.spec.tpu_type)
        show = progress_of(reporter, "pool", pool)
        have = container.find_pool(spec.project, location, cluster, pool)
        if have is not None:
            require_owned(have.config.resource_labels, spec.name, f"node pool {pool} of {cluster}")
            if have.config.machine_type != s.machine_type or have.initial_node_count != s.hosts:
                raise TpuctlError(ErrorKind.INPUT, f"node pool {pool} is {have.initial_node_count} x "
                                  f"{have.config.machine_type}, not {s.hosts} x {s.machine_type}",
                                  f"`tpuctl down -c {spec.name}` first, then up again")
            container.wait_ready(f"node pool {pool}", lambda: container.find_pool(spec.project, location, cluster,
                                                                                  pool), show)
            show("adopted")
            return
        try:
            container.create_pool(spec.project, location, cluster, container.build_node_pool(
                pool, s, st.zone, spec.labels, account, spec.spot, policy_name(spec), spec.reservation, vpc_native),
                show)
        finally:
            # a pool this call made is undone by itself unless this `up` made the cluster too (the cluster's own
            # undo takes its node pools): in an adopted cluster, and on a re-`up` of a cluster tpuctl made earlier
            # (issue 57 item 6: a failed create there was left in ERROR, billing); a create that failed part-way
            # may have left one too, as the cluster path finds (_ensure_cluster)
            cluster_made_now = any(m.kind == "gke" for m in made)
            if not cluster_made_now and container.find_pool(spec.project, location, cluster, pool) is not None:
                made.append(Created("pool", pool, lambda: container.delete_pool(
                    spec.project, location, cluster, pool, spec.name, lambda m: None)))

    def delete(self, st: ClusterState, reporter: Reporter) -> None:
        """Node pools, the workload policy, and the cluster unless adopted. Names come from the spec, so a state
        cut off before its record was saved is removed all the same."""
        spec = st.spec
        name = cluster_name(spec)
        c = container.find_cluster(spec.project, name)
        if c is not None:
            if spec.gke_cluster:
                together([functools.partial(container.delete_pool, spec.project, c.location, name, pool, spec.name,
                                            progress_of(reporter, "pool", pool)) for pool in pool_names(spec)])
                reporter.resource("gke", name, "kept (adopted: not tpuctl's to delete)", final=True)
                if spec.kueue:   # installed by `up --kueue` or found: others' runs may queue on it now
                    reporter.resource("kueue", name, "kept (adopted cluster: others may queue on it)", final=True)
                if spec.namespace:   # the namespace goes only if `up` made it (namespaces.remove)
                    reporter.resource("namespace", spec.namespace, self.drop_namespace(st), final=True)
            else:
                container.delete_cluster(spec.project, name, spec.name, progress_of(reporter, "gke", name))
        wp = policy_name(spec)
        if wp and st.zone:
            policy.delete(spec.project, st.zone, wp, spec.name, progress_of(reporter, "policy", wp))
