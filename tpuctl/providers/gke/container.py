"""The GKE API calls (google-cloud-container's ClusterManagerClient, built in providers/google/clients.py): the cluster
tpuctl makes or adopts, its TPU node pools, and the long-running operations both return.

Facts relied on, with sources:
- Clusters and node pools are addressed `projects/P/locations/L/clusters/C[/nodePools/NP]`; L = "-" lists clusters
  in every location (container_v1 ClusterManagerClient.list_clusters: "Specify "-" for all zones").
- create/delete return an Operation (`status` PENDING, RUNNING, DONE, ABORTING; `error` a google.rpc.Status once
  DONE with a failure) read by get_operation(name=projects/P/locations/L/operations/OP) (container_v1 types
  `Operation`).
- A cluster carries `resource_labels` (GCE labels: proof of ownership, as elsewhere); a node pool has no labels of
  its own, its nodes' `config.resource_labels` carry ours (container_v1 `NodeConfig.resource_labels`).
- get_server_config(name=projects/P/locations/L) lists `valid_master_versions` and, per release channel,
  `channels[].valid_versions` / `default_version` (container_v1 `ServerConfig`).
- TPU node pools as xpk 1.16 makes them (core/nodepool.py): `--num-nodes` = hosts per slice, `--node-locations`
  the zone, `--scopes=storage-full,gke-default,cloud-platform`, and only for multi-host slices `--placement-type=
  COMPACT --tpu-topology=T`, except TPU7x, which takes `--placement-policy=WORKLOAD_POLICY` instead (GKE's
  tpu-ironwood page: it "replaces the --tpu-topology flag"); single-host slices get neither.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from ...core import knobs
from ...core.errors import ErrorKind, TpuctlError
from ...core.models import require_owned
from ..base import Progress
from ..google import clients
from ..google.errors import classify_text
from ..google.operations import call, get_or_none, wait
from .tputypes import SliceShape

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-gke\.(\d+))?")


def deadline() -> float:
    """Seconds a cluster or node pool operation may take (a cluster: minutes; TPU node pools: longer)."""
    return knobs.number("TPUCTL_GKE_DEADLINE", 1800)


def version_key(version: str) -> tuple[int, ...]:
    """GKE's versions sort as major.minor.patch, then the -gke.N build (1.34.0-gke.2201000)."""
    m = _VERSION_RE.match(version or "")
    return tuple(int(g or 0) for g in m.groups()) if m else (0,)


def _parent(project: str, location: str) -> str:
    return f"projects/{project}/locations/{location}"


def list_clusters(project: str) -> list[Any]:
    got = call(clients.container().list_clusters, parent=_parent(project, "-"), what="list GKE clusters")
    return list(got.clusters)


def find_cluster(project: str, name: str) -> Any:
    """The cluster of that name in any location of the project, or None."""
    return next((c for c in list_clusters(project) if c.name == name), None)


def pick_version(project: str, location: str, at_least: str) -> str:
    """The RAPID channel's default version (xpk makes its clusters on `--release-channel=rapid`), or its newest
    valid version when the default is older than `at_least`; "" to take GKE's default when nothing is required."""
    from google.cloud import container_v1 as c
    cfg = call(clients.container().get_server_config, name=_parent(project, location),
               what=f"read GKE versions in {location}")
    rapid = next((ch for ch in cfg.channels if ch.channel == c.ReleaseChannel.Channel.RAPID), None)
    default = rapid.default_version if rapid else cfg.default_cluster_version
    if not at_least or version_key(default) >= version_key(at_least):
        return default
    # the RAPID channel's own list only: a version outside it cannot be created on that channel
    # (container_v1 ServerConfig.ReleaseChannelConfig.valid_versions: "List of valid versions for the channel")
    offered = sorted(list(rapid.valid_versions if rapid else cfg.valid_master_versions), key=version_key)
    if not offered or version_key(offered[-1]) < version_key(at_least):
        raise TpuctlError(ErrorKind.INPUT, f"GKE in {location} offers no version >= {at_least} (newest: "
                          f"{offered[-1] if offered else 'none'})", "pick a zone where TPU7x is offered")
    return offered[-1]


# A call refused because another operation runs on the cluster (GKE's own upgrade or repair, or, on a cluster that
# runs one at a time, another node pool's create). kubernetes-engine/docs/troubleshooting/concurrent-operations:
# "Cluster is running incompatible operation OPERATION_NAME", "Cluster is currently being created, deleted, updated
# or repaired and cannot be updated", "Operation OPERATION_NAME is currently ACTIONING cluster CLUSTER_NAME. Please
# wait and try again once it is done"; its fix is to wait for that operation and retry. Matched on the words, not
# on the HTTP code, which that page does not give.
_BUSY = re.compile(r"incompatible operation|currently being (created|deleted|updated|repaired)|"
                   r"please wait and try again", re.I)


def _start(fn: Callable[..., Any], what: str, doing: str, progress: Progress, **kwargs: Any) -> Any:
    """call(fn, **kwargs), retried while GKE answers that another operation runs on the cluster, until deadline();
    `doing` is said once it started."""
    started: list[Any] = []

    def attempt() -> tuple[bool, str]:
        try:
            started[:] = [call(fn, what=what, **kwargs)]
            return True, doing
        except TpuctlError as e:
            if not _BUSY.search(e.message):
                raise
            return False, "waiting for another operation on the cluster"
    wait(attempt, what, deadline(), progress)
    return started[0]


def wait_operation(project: str, location: str, op: Any, what: str) -> None:
    client = clients.container()
    name = f"{_parent(project, location)}/operations/{op.name}"

    def poll() -> tuple[bool, str]:
        cur = call(client.get_operation, name=name, what=what)
        return cur.status == type(cur).Status.DONE, "working"
    wait(poll, what, deadline(), progress=None)
    done = call(client.get_operation, name=name, what=what)
    if done.error and done.error.code:
        raise classify_text(done.error.code, done.error.message, what)


def api_endpoint(c: Any) -> tuple[str, str]:
    """(endpoint, base64 CA) through which the cluster's Kubernetes API is reached, as gcloud's get-credentials
    picks it (googlecloudsdk api_lib/container/util.py `_GetClusterEndpoint`): a cluster whose IP endpoints are off
    (container_v1 ControlPlaneEndpointsConfig.ip_endpoints_config.enabled: "Controls whether to allow direct IP
    access") is reached on its DNS endpoint (dns_endpoint_config.endpoint: "A DNS format address. This is
    accessible from the public internet. Ex: uid.us-central1.gke.goog"), with the same Google token and no cluster
    CA: gcloud writes none for it (kubeconfig.py `Cluster(..., has_dns_endpoint=True)`), the endpoint's certificate
    being publicly trusted. One that refuses outside traffic (allow_external_traffic false) is refused here as
    gcloud refuses it (AllowExternalTrafficIsDisabledError).
    Issue 57 item 6: IPEndpointsConfig's `enabled` and `enable_public_endpoint` are optional fields, and proto-plus
    reads an unset one as False: a config that does not set `enabled` leaves the IP endpoints on (their default), so
    presence is tested, not the value. A cluster whose public IP endpoint is off (enable_public_endpoint false:
    "Controls whether the control plane allows access through a public IP") has only a private IP, which this machine
    does not reach from outside the VPC: its DNS endpoint is taken where it has one."""
    cfg = c.control_plane_endpoints_config
    ip = cfg.ip_endpoints_config if "ip_endpoints_config" in cfg else None
    ip_off = ip is not None and "enabled" in ip and not ip.enabled
    public_off = ip is not None and "enable_public_endpoint" in ip and not ip.enable_public_endpoint
    dns = cfg.dns_endpoint_config
    if not ip_off and not (public_off and dns.endpoint):
        return c.endpoint, c.master_auth.cluster_ca_certificate
    if not dns.endpoint:
        raise TpuctlError(ErrorKind.INPUT, f"GKE cluster {c.name} has its IP endpoints off and no DNS endpoint",
                          f"gcloud container clusters update {c.name} --location={c.location} --enable-dns-access")
    if "allow_external_traffic" in dns and not dns.allow_external_traffic:
        raise TpuctlError(ErrorKind.INPUT, f"GKE cluster {c.name} has its IP endpoints off and its DNS endpoint "
                          "refuses outside traffic: tpuctl cannot reach its Kubernetes API",
                          f"gcloud container clusters update {c.name} --location={c.location} --enable-dns-access, "
                          "or give `up --kube-context` a context that reaches it")
    return dns.endpoint, ""


def wait_ready(what: str, read: Callable[[], Any], progress: Progress) -> Any:
    """A cluster or node pool found while being made (an `up` cut off, another machine's `up`) is waited for until
    RUNNING; one in ERROR is refused (container_v1 Cluster.Status / NodePool.Status: PROVISIONING, RUNNING,
    RUNNING_WITH_ERROR, RECONCILING, STOPPING, ERROR, DEGRADED). Returns it as last read."""
    got: list[Any] = []

    def poll() -> tuple[bool, str]:
        cur = read()
        if cur is None:
            raise TpuctlError(ErrorKind.NOT_FOUND, f"{what} disappeared while being made", "run `tpuctl up` again")
        got[:] = [cur]
        status = type(cur).Status(cur.status).name
        if status in ("ERROR", "STOPPING"):
            raise TpuctlError(ErrorKind.ERROR, f"{what} is {status}", "`tpuctl down` removes it; then up again")
        return status in ("RUNNING", "RECONCILING", "RUNNING_WITH_ERROR", "DEGRADED"), status
    wait(poll, what, deadline(), progress)
    return got[0]


def build_cluster(name: str, labels: dict[str, str], version: str, system_machine: str, system_pool: str,
                  network: str = "", subnetwork: str = "") -> Any:
    """`network`/`subnetwork` (`up --network/--subnetwork`): container_v1 `Cluster.network` ("the name of the Google
    Compute Engine network ... If left unspecified, the `default` network will be used") and `Cluster.subnetwork`.
    The system node pool's management is written out: auto-upgrade and auto-repair, which a release channel
    requires ("cannot be disabled when using release channels": GKE docs, node auto-upgrades), as the TPU pools'."""
    from google.cloud import container_v1 as c
    return c.Cluster(
        name=name, resource_labels=labels, initial_cluster_version=version, network=network, subnetwork=subnetwork,
        release_channel=c.ReleaseChannel(channel=c.ReleaseChannel.Channel.RAPID),
        ip_allocation_policy=c.IPAllocationPolicy(use_ip_aliases=True),
        node_pools=[c.NodePool(name=system_pool, initial_node_count=1,
                               management=c.NodeManagement(auto_repair=True, auto_upgrade=True),
                               config=c.NodeConfig(machine_type=system_machine, resource_labels=labels,
                                                   oauth_scopes=[CLOUD_PLATFORM]))])


def create_cluster(project: str, zone: str, cluster: Any, progress: Progress) -> None:
    what = f"create GKE cluster {cluster.name}"
    progress("creating")
    try:
        op = call(clients.container().create_cluster, parent=_parent(project, zone), cluster=cluster, what=what)
        wait_operation(project, zone, op, what)
    except TpuctlError as e:
        if "network" in e.message.lower() and not cluster.network:
            # a project without the `default` VPC (Cluster.network: "If left unspecified, the default network
            # will be used"); GKE's exact wording is not relied on, only that it names the network
            raise TpuctlError(e.kind, e.message, "the project may have no `default` network: give `up --network "
                              "NAME --subnetwork NAME` (`gcloud compute networks list`)") from None
        raise
    progress("RUNNING")


def delete_cluster(project: str, name: str, cluster_label: str, progress: Progress) -> None:
    c = find_cluster(project, name)
    if c is None:
        return
    require_owned(c.resource_labels, cluster_label, f"GKE cluster {name}")
    what = f"delete GKE cluster {name}"
    try:
        op = _start(clients.container().delete_cluster, what, "deleting", progress,
                    name=f"{_parent(project, c.location)}/clusters/{name}")
        wait_operation(project, c.location, op, what)
    except TpuctlError as e:
        if e.kind is not ErrorKind.NOT_FOUND:
            raise
    progress("deleted")


# xpk's node-pool options (AI-Hypercomputer/xpk 367c838, src/xpk/core/nodepool.py, its `gcloud beta container
# node-pools create` command), compared (issue 57 item 6):
# - `--enable-gvnic`, on every pool: taken, as container_v1 NodeConfig.gvnic (VirtualNIC.enabled: "Whether gVNIC
#   features are enabled in the node pool");
# - `--max-pods-per-node 15`, on multi-host TPU pools only: taken, as container_v1 NodePool.max_pods_constraint
#   (MaxPodsConstraint.max_pods_per_node), where the cluster is VPC-native: GKE configures the maximum Pods per node
#   "only in VPC-native clusters" (kubernetes-engine/docs/how-to/flexible-pod-cidr, Limitations); a cluster tpuctl
#   makes is (build_cluster: use_ip_aliases), an adopted routes-based one gets GKE's default;
# - `--host-maintenance-interval` (xpk: AS_NEEDED by default, PERIODIC by choice): NOT taken. Its field,
#   NodeConfig.host_maintenance_policy, is in the v1beta1 API only (google-cloud-container 2.67.0:
#   container_v1beta1.NodeConfig has it, container_v1.NodeConfig, which tpuctl uses, does not; the GKE fake refuses
#   it as an unknown field of v1), which is why xpk runs `gcloud beta`. What GKE does with it unspecified
#   (MAINTENANCE_INTERVAL_UNSPECIFIED: "not explicitly specified", v1beta1 reference) is not said: not relied on;
# - `--node-version`, `--scopes=storage-full,gke-default,cloud-platform`: GKE's default version for the pool (the
#   cluster's), and tpuctl's cloud-platform scope, which covers the other two.
XPK_MAX_PODS_PER_NODE = 15


def build_node_pool(name: str, s: SliceShape, zone: str, labels: dict[str, str], service_account: str, spot: bool,
                    policy: str, reservation: str = "", vpc_native: bool = True) -> Any:
    """`reservation`: consumed by name (container_v1 ReservationAffinity: SPECIFIC_RESERVATION with key
    "compute.googleapis.com/reservation-name" and the name as its value; gcloud's --reservation-affinity=specific
    --reservation=NAME, as xpk passes it). `vpc_native`: the cluster uses alias IPs (max pods per node is set)."""
    from google.cloud import container_v1 as c
    affinity = None
    if reservation:
        affinity = c.ReservationAffinity(consume_reservation_type=c.ReservationAffinity.Type.SPECIFIC_RESERVATION,
                                         key="compute.googleapis.com/reservation-name", values=[reservation])
    placement = None
    if s.multi_host:
        placement = (c.NodePool.PlacementPolicy(policy_name=policy) if s.needs_workload_policy else
                     c.NodePool.PlacementPolicy(type_=c.NodePool.PlacementPolicy.Type.COMPACT, tpu_topology=s.topology))
    # The pool is tpuctl's own in Kubernetes too (issue 57 item 4): its nodes carry the Kubernetes label and the
    # NoSchedule taint tpuctl-cluster=<cluster> (container_v1 NodeConfig.labels: "Kubernetes labels ... applied to
    # each node"; NodeConfig.taints / NodeTaint NO_SCHEDULE: "Do not allow new pods to schedule onto the node unless
    # they tolerate the taint"), so another team's pods that select only the accelerator and topology (as xpk's
    # ResourceFlavors do) do not land on it, and tpuctl's runs select it (manifest.py).
    max_pods = c.MaxPodsConstraint(max_pods_per_node=XPK_MAX_PODS_PER_NODE) if s.multi_host and vpc_native else None
    return c.NodePool(
        name=name, initial_node_count=s.hosts, locations=[zone], placement_policy=placement,
        management=c.NodeManagement(auto_repair=True, auto_upgrade=True), max_pods_constraint=max_pods,
        config=c.NodeConfig(machine_type=s.machine_type, resource_labels=labels, spot=spot,
                            service_account=service_account, oauth_scopes=[CLOUD_PLATFORM],
                            reservation_affinity=affinity, labels=dict(labels), gvnic=c.VirtualNIC(enabled=True),
                            taints=[c.NodeTaint(key=k, value=v, effect=c.NodeTaint.Effect.NO_SCHEDULE)
                                    for k, v in labels.items()]))


def find_pool(project: str, location: str, cluster: str, name: str) -> Any:
    return get_or_none(clients.container().get_node_pool,
                       name=f"{_parent(project, location)}/clusters/{cluster}/nodePools/{name}",
                       what=f"get node pool {name}")


def list_pools(project: str, location: str, cluster: str) -> list[Any]:
    got = call(clients.container().list_node_pools, parent=f"{_parent(project, location)}/clusters/{cluster}",
               what=f"list node pools of {cluster}")
    return list(got.node_pools)


def create_pool(project: str, location: str, cluster: str, pool: Any, progress: Progress) -> None:
    what = f"create node pool {pool.name}"
    op = _start(clients.container().create_node_pool, what, "creating", progress,
                parent=f"{_parent(project, location)}/clusters/{cluster}", node_pool=pool)
    wait_operation(project, location, op, what)
    progress("RUNNING")


def delete_pool(project: str, location: str, cluster: str, name: str, cluster_label: str, progress: Progress) -> None:
    pool = find_pool(project, location, cluster, name)
    if pool is None:
        return
    require_owned(pool.config.resource_labels, cluster_label, f"node pool {name} of {cluster}")
    what = f"delete node pool {name}"
    try:
        op = _start(clients.container().delete_node_pool, what, "deleting", progress,
                    name=f"{_parent(project, location)}/clusters/{cluster}/nodePools/{name}")
        wait_operation(project, location, op, what)
    except TpuctlError as e:
        if e.kind is not ErrorKind.NOT_FOUND:
            raise
    progress("deleted")
