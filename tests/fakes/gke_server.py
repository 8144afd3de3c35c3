"""A wire-level fake of the GKE API (container.googleapis.com v1, REST): clusters, node pools, operations and the
server config; and of Compute's regional resource policies (the TPU7x workload policy), on a FakeCompute.

The real google-cloud-container client talks to it over REST (CONTAINER_EMULATOR_HOST=http://127.0.0.1:PORT).
Routes are the client's own (google-cloud-container 2.67, cluster_manager/transports/rest_base.py `_get_http_options`:
`/v1/{parent=projects/*/locations/*}/clusters`, `/v1/{name=projects/*/locations/*/clusters/*/nodePools/*}`,
`/v1/{name=projects/*/locations/*/operations/*}`, `/v1/{name=projects/*/locations/*}/serverConfig`); request bodies
are the request message as JSON (`"body": "*"`: {"cluster": {...}}, {"nodePool": {...}}), its enums as names or, with
numeric enums, as numbers: both are read. Each behaviour below cites its source beside it. Faults:
  fake.faults["create_pool"].append((400, "FAILED_PRECONDITION", "..."))   the next such HTTP call fails at once
  fake.op_faults["create_pool"].append((8, "... ZONE_RESOURCE_POOL_EXHAUSTED ..."))  its operation ends with this
  fake.pool_faults["tpuctl-x-np-1"] = (8, "...")   that node pool's create operation ends with this
Operations finish after `delay` seconds (0: at once, on the next read).
Concurrent operations (kubernetes-engine/docs/troubleshooting/concurrent-operations): "GKE generally allows only
one cluster-level operation or one operation per node pool at a time", GKE's own (a control plane upgrade, an
automatic repair) counting too; a refused call reads "Cluster is running incompatible operation OPERATION_NAME" or
"Operation OPERATION_NAME is currently ACTIONING cluster CLUSTER_NAME. Please wait and try again once it is done".
So a cluster-level operation refuses every other, and a node pool's refuses another on the same pool. Whether two
node pools of one cluster are made at once is not settled by that page ("Creating, ... or deleting node pools" is
among its "cluster operations"); xpk creates them up to 100 at a time (core/nodepool.py: run_commands(...,
batch=100)), so GKE accepts it at least there. `one_op_per_cluster` makes the fake refuse that too, and the tests
pass under both. `gke_operation(...)` starts one of GKE's own (an upgrade) for a while.
"""
from __future__ import annotations

import base64
import collections
import itertools
import re
import threading
import time

from fakes.compute_server import FakeCompute

_LOC = r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
_ROUTES = [
    ("GET", _LOC + r"/serverConfig$", "server_config"),
    ("POST", _LOC + r"/clusters$", "create_cluster"),
    ("GET", _LOC + r"/clusters$", "list_clusters"),
    ("GET", _LOC + r"/clusters/(?P<cluster>[^/:]+)$", "get_cluster"),
    ("DELETE", _LOC + r"/clusters/(?P<cluster>[^/:]+)$", "delete_cluster"),
    ("POST", _LOC + r"/clusters/(?P<cluster>[^/]+)/nodePools$", "create_pool"),
    ("GET", _LOC + r"/clusters/(?P<cluster>[^/]+)/nodePools$", "list_pools"),
    ("GET", _LOC + r"/clusters/(?P<cluster>[^/]+)/nodePools/(?P<pool>[^/:]+)$", "get_pool"),
    ("DELETE", _LOC + r"/clusters/(?P<cluster>[^/]+)/nodePools/(?P<pool>[^/:]+)$", "delete_pool"),
    ("GET", _LOC + r"/operations/(?P<op>[^/:]+)$", "operation"),
    ("POST", _LOC + r"/clusters/(?P<cluster>[^/:]+):setMaintenancePolicy$", "set_maintenance"),
]
MUTATING = {"create_cluster", "delete_cluster", "create_pool", "delete_pool", "set_maintenance"}
_SCOPES = {0: "NO_UPGRADES", 1: "NO_MINOR_UPGRADES", 2: "NO_MINOR_OR_NODE_UPGRADES"}
# container_v1 enums, by number, for a client that sends numeric enums (types/cluster_service.py)
_CHANNELS = {0: "UNSPECIFIED", 1: "RAPID", 2: "REGULAR", 3: "STABLE", 4: "EXTENDED"}
_PLACEMENT = {0: "TYPE_UNSPECIFIED", 1: "COMPACT"}
_AFFINITY = {0: "UNSPECIFIED", 1: "NO_RESERVATION", 2: "ANY_RESERVATION", 3: "SPECIFIC_RESERVATION",
             4: "ANY_RESERVATION_THEN_FAIL"}
# GKE versions offered, newest last: TPU7x needs >= 1.34.0-gke.2201000 (kubernetes-engine/docs/concepts/tpu-ironwood)
VERSIONS = ["1.32.9-gke.1100000", "1.33.5-gke.1200000", "1.34.1-gke.1829001"]
TPU7X_MIN = "1.34.0-gke.2201000"


def _vkey(v):
    m = re.match(r"^(\d+)\.(\d+)\.(\d+)(?:-gke\.(\d+))?", v or "")
    return tuple(int(g or 0) for g in m.groups()) if m else (0,)


def _ts(value):
    """A google.protobuf.Timestamp as JSON (RFC 3339, "2026-11-28T17:00:00Z", maybe with fractions) -> epoch s."""
    import datetime as dt
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _fields(message) -> set[str]:
    """A container_v1 message's fields as its JSON names them (the REST body's keys: proto3 JSON lowerCamelCase)."""
    return {f.json_name for f in message.pb().DESCRIPTOR.fields}


def _unknown_fields(p) -> str:
    """A node pool body with a field the v1 API does not have is refused as Google APIs refuse one ("Invalid JSON
    payload received. Unknown name ... Cannot find field.": the JSON transcoding of every REST API); v1's fields are
    google-cloud-container 2.67.0's container_v1 types (NodeConfig.host_maintenance_policy, for one, is v1beta1's
    only)."""
    from google.cloud import container_v1 as v1
    for where, body, message in (("node_pool", p, v1.NodePool), ("node_pool.config", p.get("config") or {},
                                                                   v1.NodeConfig)):
        unknown = sorted(set(body) - _fields(message))
        if unknown:
            return f"Invalid JSON payload received. Unknown name \"{unknown[0]}\" at '{where}': Cannot find field."
    return ""


def _name(value, names):
    return names.get(value, str(value)) if isinstance(value, int) else (value or "")


def _chips_per_host(machine_type):
    """The TPU machine types' chips (GKE plan-tpus: ct5lp-hightpu-1t/4t/8t, ct6e-standard-1t/4t/8t, ct4p-hightpu-4t,
    ct5p-hightpu-4t, tpu7x-standard-1t/4t): the number before the final `t`; 0 for a machine without TPUs."""
    m = re.match(r"^(ct\d[a-z]*-[a-z]+|tpu7x-standard)-(\d+)t$", machine_type or "")
    return int(m.group(2)) if m else 0


class FakeGke:
    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.clusters = {}   # (project, location, name) -> cluster JSON (nodePools inside)
        self.ops = {}
        self.faults = collections.defaultdict(list)
        self.op_faults = collections.defaultdict(list)
        self.pool_faults = {}   # node pool name -> (code, message) its create operation ends with
        self.upgrade_before = {}   # action -> seconds of GKE's own operation started just before that call
        self.stale_answer = (409, ("ABORTED", "Cluster maintenance policy was updated concurrently."))
        self.policy_edits_before_set = 0
        self.calls = []
        self.one_op_per_cluster = False
        self.versions = list(VERSIONS)
        self.kube_endpoint = "127.0.0.1"   # what clusters report as `endpoint` (a fake Kubernetes API, if any)
        self.policies = None   # FakePolicies: a TPU7x node pool's workload policy must exist
        self.on_pool_ready = []   # callables (cluster, pool JSON) once a node pool is RUNNING: its nodes exist
        self.lock = threading.RLock()
        self._ids = itertools.count(1)
        self.httpd = None

    def start(self) -> str:
        from fakes.wire import serve_json, url_of
        self.httpd = serve_json(self.handle)
        return url_of(self.httpd)

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def reset(self):
        with self.lock:
            self.clusters.clear()
            self.ops.clear()
            self.faults.clear()
            self.op_faults.clear()
            self.pool_faults.clear()
            self.upgrade_before.clear()
            self.stale_answer = (409, ("ABORTED", "Cluster maintenance policy was updated concurrently."))
            self.policy_edits_before_set = 0
            self.calls.clear()
            self.delay, self.one_op_per_cluster, self.versions = 0.0, False, list(VERSIONS)
            self.on_pool_ready = []

    def dns_only(self, cluster, allow_external=True, ip_config=None):
        """The cluster (JSON) with its IP endpoints off: its Kubernetes API answers only on its DNS endpoint
        (container_v1 ControlPlaneEndpointsConfig: ip_endpoints_config.enabled "Controls whether to allow direct IP
        access"; dns_endpoint_config.endpoint "A DNS format address ... Ex: uid.us-central1.gke.goog"). Its
        `endpoint` names a port nothing listens on (an IP address nobody reaches), its DNS endpoint the fake
        Kubernetes API; `allow_external=False`: that endpoint refuses user traffic (allow_external_traffic);
        `ip_config`: another ipEndpointsConfig, e.g. {"enabled": True, "enablePublicEndpoint": False} (the public IP
        off: `endpoint` is then the private IP, unreachable from outside the VPC)."""
        cluster["endpoint"] = "http://127.0.0.1:9"
        cluster["controlPlaneEndpointsConfig"] = {
            "ipEndpointsConfig": {"enabled": False} if ip_config is None else ip_config,
            "dnsEndpointConfig": {"endpoint": self.kube_endpoint, "allowExternalTraffic": allow_external}}
        return cluster

    def mutating_calls(self):
        return [c for c in self.calls if c[0] in MUTATING]

    def pools(self):
        """(cluster, pool JSON) of every node pool of every cluster."""
        return [(c["name"], p) for c in self.clusters.values() for p in c["nodePools"]]

    def handle(self, method, path, body):
        for verb, rx, action in _ROUTES:
            m = re.match(rx, path)
            if verb == method and m:
                break
        else:
            return 404, ("NOT_FOUND", f"no route {method} {path}")
        with self.lock:
            self.calls.append((action, path, body))
            if self.faults[action]:
                code, status, message = self.faults[action].pop(0)
                return code, (status, message)
            self._advance()
            if action in self.upgrade_before:
                self.gke_operation(m["project"], m["location"], m["cluster"], self.upgrade_before.pop(action))
            return getattr(self, "do_" + action)(body, **m.groupdict())

    # -- operations ------------------------------------------------------------------------------------
    def _advance(self):
        now = time.monotonic()
        for op in self.ops.values():
            if op["status"] != "DONE" and op["at"] <= now:
                op["status"] = "DONE"
                op.pop("finish")()

    def _busy(self, project, location, cluster, pool=None):
        """The refusal a new operation gets while another runs (the rule and messages in the module's doc), or None.
        `pool`: the node pool a node-pool operation acts on; None for a cluster-level one."""
        for o in self.ops.values():
            if o["status"] == "DONE" or o["key"] != (project, location, cluster):
                continue
            if o["pool"] is None or pool is None or o["pool"] == pool:
                return 400, ("FAILED_PRECONDITION", f"Cluster is running incompatible operation {o['name']}.")
            if self.one_op_per_cluster:
                return 400, ("FAILED_PRECONDITION", f"Operation {o['name']} is currently creating node pool "
                             f"{o['pool']} of cluster {cluster}. Please wait and try again once it is done.")
        return None

    def gke_operation(self, project, location, cluster, seconds, kind="UPGRADE_MASTER"):
        """One of GKE's own cluster-level operations (a control plane upgrade), running `seconds` from now
        (`upgrade_before[action] = seconds`: from the next such call, which it then refuses)."""
        with self.lock:
            delay, self.delay = self.delay, seconds
            try:
                self._op(project, location, cluster, kind, cluster, lambda error: None, kind)
            finally:
                self.delay = delay

    def _op(self, project, location, cluster, kind, target, finish, action, pool=None):
        """An Operation as container_v1 returns it (types `Operation`: name, operationType, status, selfLink,
        targetLink, location; `error` a google.rpc.Status once DONE with a failure)."""
        name = f"operation-{next(self._ids)}"
        error = self.op_faults[action].pop(0) if self.op_faults[action] else None
        op = {"name": name, "operationType": kind, "status": "RUNNING", "location": location, "zone": location,
              "selfLink": f"projects/{project}/locations/{location}/operations/{name}",
              "targetLink": target, "at": time.monotonic() + self.delay, "key": (project, location, cluster),
              "pool": pool}
        if error:
            op["error"] = {"code": error[0], "message": error[1]}
            op["statusMessage"] = error[1]

        def done():
            finish(error)
        op["finish"] = done
        self.ops[name] = op
        if self.delay == 0:
            self._advance()
        return 200, self._show(op)

    @staticmethod
    def _show(op):
        return {k: v for k, v in op.items() if k not in ("at", "finish", "key", "pool")}

    def do_operation(self, body, project, location, op):
        o = self.ops.get(op)
        if o is None:
            return 404, ("NOT_FOUND", f"Operation \"{op}\" not found.")
        return 200, self._show(o)

    # -- server config ----------------------------------------------------------------------------------
    def do_server_config(self, body, project, location):
        """ServerConfig (container_v1 types): defaultClusterVersion, validMasterVersions (newest first, as GKE
        lists them), channels[] {channel, defaultVersion, validVersions}."""
        newest_first = sorted(self.versions, key=_vkey, reverse=True)
        return 200, {"defaultClusterVersion": newest_first[-1] if len(newest_first) > 1 else newest_first[0],
                     "validMasterVersions": newest_first,
                     "channels": [{"channel": "RAPID", "defaultVersion": newest_first[1 if len(newest_first) > 1
                                                                                       else 0],
                                   "validVersions": newest_first}]}

    # -- clusters ---------------------------------------------------------------------------------------
    def _cluster(self, project, location, name):
        if location == "-":
            return next((c for (p, _, n), c in self.clusters.items() if p == project and n == name), None)
        return self.clusters.get((project, location, name))

    def _missing(self, project, location, name):
        return 404, ("NOT_FOUND", f"Not found: projects/{project}/locations/{location}/clusters/{name}.")

    def do_create_cluster(self, body, project, location):
        c = dict(body.get("cluster") or {})
        name = c.get("name", "")
        if not re.match(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$", name):
            return 400, ("INVALID_ARGUMENT", f"Invalid value for field \"cluster.name\": \"{name}\"")
        if (project, location, name) in self.clusters:
            return 409, ("ALREADY_EXISTS", f"Already exists: projects/{project}/locations/{location}/clusters/{name}.")
        version = c.get("initialClusterVersion") or ""
        if version and version not in self.versions:
            return 400, ("INVALID_ARGUMENT", f"Master version \"{version}\" is unsupported.")
        if not c.get("nodePools") and not c.get("initialNodeCount"):
            # a Standard cluster needs a node pool or an initial node count (CreateClusterRequest docs)
            return 400, ("INVALID_ARGUMENT", "Cluster.initial_node_count must be greater than zero.")
        c.update(location=location, status="PROVISIONING", currentMasterVersion=version or
                 sorted(self.versions, key=_vkey)[0], endpoint=self.kube_endpoint, autopilot={"enabled": False},
                 masterAuth={"clusterCaCertificate": base64.b64encode(b"fake CA for " + name.encode()).decode()},
                 nodePools=[dict(p, status="PROVISIONING", locations=p.get("locations") or [location])
                            for p in c.get("nodePools") or []],
                 releaseChannel={"channel": _name((c.get("releaseChannel") or {}).get("channel"), _CHANNELS)})
        self._bump_policy(c)   # every cluster has a policy version to quote (MaintenancePolicy.resource_version)
        self.clusters[(project, location, name)] = c

        def finish(error):
            if error:   # a failed create leaves the cluster in ERROR, to be deleted (GKE troubleshooting)
                c["status"] = "ERROR"
                return
            c["status"] = "RUNNING"
            for p in c["nodePools"]:
                p["status"] = "RUNNING"
        return self._op(project, location, name, "CREATE_CLUSTER", f"projects/{project}/locations/{location}/clusters/"
                        f"{name}", finish, "create_cluster")

    def do_list_clusters(self, body, project, location):
        """location "-": every location of the project (ListClustersRequest.parent)."""
        return 200, {"clusters": [c for (p, loc, _), c in self.clusters.items()
                                  if p == project and location in ("-", loc)]}

    def do_get_cluster(self, body, project, location, cluster):
        c = self._cluster(project, location, cluster)
        return (200, c) if c is not None else self._missing(project, location, cluster)

    def do_delete_cluster(self, body, project, location, cluster):
        c = self._cluster(project, location, cluster)
        if c is None:
            return self._missing(project, location, cluster)
        busy = self._busy(project, c["location"], cluster)
        if busy:
            return busy
        c["status"] = "STOPPING"

        def finish(error):
            if not error:   # its node pools go with it
                self.clusters.pop((project, c["location"], cluster), None)
        return self._op(project, c["location"], cluster, "DELETE_CLUSTER", cluster, finish, "delete_cluster")

    # -- maintenance policy ------------------------------------------------------------------------------
    def do_set_maintenance(self, body, project, location, cluster):
        """clusters.setMaintenancePolicy (container_v1 SetMaintenancePolicyRequest): the whole policy replaces the
        old ("An empty field clears the existing maintenance policy"); MaintenancePolicy.resource_version must be
        the current one ("Make a get() request to the cluster to get the current resource version and include it
        with requests to set the policy"). What GKE answers to a stale version is not documented: `stale_answer`
        is one plausible answer (409 ABORTED) or another (400 FAILED_PRECONDITION), and the tests pass under both.
        An exclusion needs an end after its start, and a "No upgrades" one lasts at most 30 days
        (kubernetes-engine/docs/concepts/maintenance-windows-and-exclusions). `policy_edits_before_set`: another
        party sets the policy just before the next such call (its version moves). Cluster-level: it refuses while
        another operation runs, as any (module doc)."""
        c = self._cluster(project, location, cluster)
        if c is None:
            return self._missing(project, location, cluster)
        if self.policy_edits_before_set:
            self.policy_edits_before_set -= 1
            self._bump_policy(c)
        policy = dict(body.get("maintenancePolicy") or {})
        have = (c.get("maintenancePolicy") or {}).get("resourceVersion", "")
        if policy.get("resourceVersion", "") != have:
            return self.stale_answer
        for key, w in ((policy.get("window") or {}).get("maintenanceExclusions") or {}).items():
            start, end = _ts(w.get("startTime")), _ts(w.get("endTime"))
            scope = _name((w.get("maintenanceExclusionOptions") or {}).get("scope", 0), _SCOPES) or "NO_UPGRADES"
            if start is None or end is None or end <= start:
                return 400, ("INVALID_ARGUMENT", f"Maintenance exclusion \"{key}\" needs an end time after its "
                                                 "start time.")
            if scope == "NO_UPGRADES" and end - start > 30 * 86400:
                return 400, ("INVALID_ARGUMENT", f"Maintenance exclusion \"{key}\" of scope NO_UPGRADES is longer "
                                                 "than 30 days.")
        busy = self._busy(project, c["location"], cluster)
        if busy:
            return busy
        c["maintenancePolicy"] = policy
        self._bump_policy(c)
        return self._op(project, c["location"], cluster, "SET_MAINTENANCE_POLICY", cluster, lambda error: None,
                        "set_maintenance")

    def _bump_policy(self, c):
        c.setdefault("maintenancePolicy", {})["resourceVersion"] = f"v{next(self._ids)}"

    def exclusions(self, project, location, cluster):
        c = self._cluster(project, location, cluster)
        return ((c.get("maintenancePolicy") or {}).get("window") or {}).get("maintenanceExclusions") or {}

    # -- node pools -------------------------------------------------------------------------------------
    def do_create_pool(self, body, project, location, cluster):
        c = self._cluster(project, location, cluster)
        if c is None:
            return self._missing(project, location, cluster)
        p = dict(body.get("nodePool") or {})
        if any(q["name"] == p.get("name") for q in c["nodePools"]):
            return 409, ("ALREADY_EXISTS", f"Already exists: node pool \"{p.get('name')}\".")
        busy = self._busy(project, location, cluster, p.get("name"))
        if busy:
            return busy
        refused = _unknown_fields(p) or self._refuse_pool_options(c, p) or self._refuse_tpu_pool(project, c, p)
        if refused:
            return 400, ("INVALID_ARGUMENT", refused)
        p.update(status="PROVISIONING", locations=p.get("locations") or [location])
        c["nodePools"].append(p)

        def finish(error):
            p["status"] = "ERROR" if error else "RUNNING"
            for hook in [] if error else self.on_pool_ready:
                hook(cluster, p)
        error = self.pool_faults.pop(p.get("name"), None)
        if error:
            self.op_faults["create_pool"].insert(0, error)
        return self._op(project, location, cluster, "CREATE_NODE_POOL", f"{cluster}/nodePools/{p['name']}", finish,
                        "create_pool", pool=p.get("name"))

    def _refuse_pool_options(self, c, p):
        """xpk's node-pool options as the v1 API takes them (tpuctl container.build_node_pool):
        - maxPodsConstraint.maxPodsPerNode (int64, sent as a string): "You can only configure the maximum Pods per
          node in VPC-native clusters" (kubernetes-engine/docs/how-to/flexible-pod-cidr, Limitations), i.e. a
          cluster with ipAllocationPolicy.useIpAliases; the wording of GKE's refusal is the fake's own;
        - config.gvnic: a VirtualNIC, {"enabled": bool} (container_v1 VirtualNIC)."""
        max_pods = (p.get("maxPodsConstraint") or {}).get("maxPodsPerNode")
        if max_pods is not None:
            if not str(max_pods).isdigit() or int(max_pods) < 1:
                return f"Invalid value for field \"node_pool.max_pods_constraint.max_pods_per_node\": \"{max_pods}\""
            if not (c.get("ipAllocationPolicy") or {}).get("useIpAliases"):
                return "Max pods constraint is only supported on VPC-native (IP alias) clusters."
        gvnic = (p.get("config") or {}).get("gvnic")
        if gvnic is not None and not isinstance(gvnic.get("enabled", False), bool):
            return "Invalid value for field \"node_pool.config.gvnic.enabled\"."
        return ""

    def _refuse_tpu_pool(self, project, c, p):
        """What GKE refuses of a TPU node pool, with sources:
        - TPU7x needs a cluster at >= 1.34.0-gke.2201000 (kubernetes-engine/docs/concepts/tpu-ironwood);
        - a multi-host slice's node count is its topology's chips / chips per host, and the pool is atomic
          (kubernetes-engine/docs/concepts/tpus; plan-tpus tables);
        - multi-host TPU7x takes a workload policy (placementPolicy.policyName) and no tpuTopology (tpu-ironwood:
          the policy "replaces the --tpu-topology flag"); the policy must exist in the cluster's region;
        - other multi-host slices: placementPolicy {type COMPACT, tpuTopology} (xpk core/nodepool.py)."""
        cfg = p.get("config") or {}
        machine = cfg.get("machineType", "")
        affinity = cfg.get("reservationAffinity") or {}
        if _name(affinity.get("consumeReservationType"), _AFFINITY) == "SPECIFIC_RESERVATION":
            # "To target a SPECIFIC_RESERVATION by name, specify "compute.googleapis.com/reservation-name" as the key
            # and specify the name of your reservation as its value" (container_v1 ReservationAffinity.key)
            if affinity.get("key") != "compute.googleapis.com/reservation-name" or not affinity.get("values"):
                return "reservationAffinity SPECIFIC_RESERVATION needs key compute.googleapis.com/reservation-name."
        per_host = _chips_per_host(machine)
        if not per_host:
            return ""
        tpu7x = machine.startswith("tpu7x-")
        if tpu7x and _vkey(c["currentMasterVersion"]) < _vkey(TPU7X_MIN):
            return f"Machine type \"{machine}\" requires GKE version {TPU7X_MIN} or later."
        placement = p.get("placementPolicy") or {}
        count = int(p.get("initialNodeCount") or 0)
        if tpu7x and count > 1:
            if placement.get("tpuTopology") or not placement.get("policyName"):
                return ("TPU7x multi-host node pools need a workload policy (placementPolicy.policyName), "
                        "not tpuTopology.")
            region = c["location"].rsplit("-", 1)[0] if c["location"].count("-") == 2 else c["location"]
            if self.policies is not None and not self.policies.exists(project, region, placement["policyName"]):
                return f"Resource policy \"{placement['policyName']}\" was not found in region {region}."
            return ""
        topology = placement.get("tpuTopology", "")
        if count > 1 and (not topology or _name(placement.get("type"), _PLACEMENT) != "COMPACT"):
            return "A multi-host TPU node pool needs placementPolicy {type: COMPACT, tpuTopology}."
        if topology:
            chips = 1
            for d in topology.split("x"):
                chips *= int(d)
            if chips // per_host != count:
                return f"Node count {count} does not match TPU topology {topology} for {machine}."
        return ""

    def _pool(self, c, name):
        return next((p for p in c["nodePools"] if p["name"] == name), None)

    def do_list_pools(self, body, project, location, cluster):
        c = self._cluster(project, location, cluster)
        return (200, {"nodePools": c["nodePools"]}) if c is not None else self._missing(project, location, cluster)

    def do_get_pool(self, body, project, location, cluster, pool):
        c = self._cluster(project, location, cluster)
        p = self._pool(c, pool) if c is not None else None
        if p is None:
            return 404, ("NOT_FOUND", f"Not found: projects/{project}/locations/{location}/clusters/{cluster}/"
                                      f"nodePools/{pool}.")
        return 200, p

    def do_delete_pool(self, body, project, location, cluster, pool):
        code, p = self.do_get_pool(body, project, location, cluster, pool)
        if code != 200:
            return code, p
        busy = self._busy(project, location, cluster, pool)
        if busy:
            return busy
        p["status"] = "STOPPING"
        c = self._cluster(project, location, cluster)

        def finish(error):
            if not error:
                c["nodePools"] = [q for q in c["nodePools"] if q is not p]
        return self._op(project, location, cluster, "DELETE_NODE_POOL", f"{cluster}/nodePools/{pool}", finish,
                        "delete_pool", pool=pool)


class FakePolicies(FakeCompute):
    """FakeCompute, whose regional resource policies and operations (fakes/compute_tpu.py: one fake of them for
    the Compute Engine TPU path and GKE alike) learn of GKE's node pools: a policy a node pool still names cannot be
    deleted, Compute answering 400 `resourceInUseByAnotherResource` (compute/docs/reference/rest/v1 errors; "The
    resource_policy resource ... is already being used by ...")."""

    def __init__(self, gke: FakeGke):
        super().__init__()
        self.gke = gke
        gke.policies = self

    def exists(self, project, region, name):
        return (project, region, name) in self.policies

    def _in_use(self, project, link):
        name = link.rsplit("/", 1)[-1]
        pool = next((p["name"] for _, p in self.gke.pools()
                     if "/resourcePolicies/" in link and (p.get("placementPolicy") or {}).get("policyName") == name),
                    None)
        return pool or super()._in_use(project, link)
