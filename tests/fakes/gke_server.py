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
Operations finish after `delay` seconds (0: at once, on the next read).
`one_op_per_cluster`: no source settles whether GKE runs two node pool operations of one cluster at once (old
clusters answered FAILED_PRECONDITION "cluster is running incompatible operation": kubernetes-engine/docs/
troubleshooting; newer ones queue them), so the fake answers either way and the tests pass under both.
"""
from __future__ import annotations

import base64
import collections
import itertools
import json
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
]
MUTATING = {"create_cluster", "delete_cluster", "create_pool", "delete_pool"}
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
            self.calls.clear()
            self.delay, self.one_op_per_cluster, self.versions = 0.0, False, list(VERSIONS)
            self.on_pool_ready = []

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
            return getattr(self, "do_" + action)(body, **m.groupdict())

    # -- operations ------------------------------------------------------------------------------------
    def _advance(self):
        now = time.monotonic()
        for op in self.ops.values():
            if op["status"] != "DONE" and op["at"] <= now:
                op["status"] = "DONE"
                op.pop("finish")()

    def _busy(self, project, location, cluster):
        return any(o["status"] != "DONE" and o["key"] == (project, location, cluster) for o in self.ops.values())

    def _op(self, project, location, cluster, kind, target, finish, action):
        """An Operation as container_v1 returns it (types `Operation`: name, operationType, status, selfLink,
        targetLink, location; `error` a google.rpc.Status once DONE with a failure)."""
        name = f"operation-{next(self._ids)}"
        error = self.op_faults[action].pop(0) if self.op_faults[action] else None
        op = {"name": name, "operationType": kind, "status": "RUNNING", "location": location, "zone": location,
              "selfLink": f"projects/{project}/locations/{location}/operations/{name}",
              "targetLink": target, "at": time.monotonic() + self.delay, "key": (project, location, cluster)}
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
        return {k: v for k, v in op.items() if k not in ("at", "finish", "key")}

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
        if self.one_op_per_cluster and self._busy(project, c["location"], cluster):
            return 400, ("FAILED_PRECONDITION", f"Cluster is running incompatible operation.")
        c["status"] = "STOPPING"

        def finish(error):
            if not error:   # its node pools go with it
                self.clusters.pop((project, c["location"], cluster), None)
        return self._op(project, c["location"], cluster, "DELETE_CLUSTER", cluster, finish, "delete_cluster")

    # -- node pools -------------------------------------------------------------------------------------
    def do_create_pool(self, body, project, location, cluster):
        c = self._cluster(project, location, cluster)
        if c is None:
            return self._missing(project, location, cluster)
        p = dict(body.get("nodePool") or {})
        if any(q["name"] == p.get("name") for q in c["nodePools"]):
            return 409, ("ALREADY_EXISTS", f"Already exists: node pool \"{p.get('name')}\".")
        if self.one_op_per_cluster and self._busy(project, location, cluster):
            return 400, ("FAILED_PRECONDITION", "Cluster is running incompatible operation.")
        refused = self._refuse_tpu_pool(project, c, p)
        if refused:
            return 400, ("INVALID_ARGUMENT", refused)
        p.update(status="PROVISIONING", locations=p.get("locations") or [location])
        c["nodePools"].append(p)

        def finish(error):
            p["status"] = "ERROR" if error else "RUNNING"
            for hook in [] if error else self.on_pool_ready:
                hook(cluster, p)
        return self._op(project, location, cluster, "CREATE_NODE_POOL", f"{cluster}/nodePools/{p['name']}", finish,
                        "create_pool")

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
        if self.one_op_per_cluster and self._busy(project, location, cluster):
            return 400, ("FAILED_PRECONDITION", "Cluster is running incompatible operation.")
        p["status"] = "STOPPING"
        c = self._cluster(project, location, cluster)

        def finish(error):
            if not error:
                c["nodePools"] = [q for q in c["nodePools"] if q is not p]
        return self._op(project, location, cluster, "DELETE_NODE_POOL", f"{cluster}/nodePools/{pool}", finish,
                        "delete_pool")


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
