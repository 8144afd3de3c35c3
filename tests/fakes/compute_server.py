"""A wire-level fake of the Compute Engine REST API: projects.get, zonal instances and zone operations, firewall
rules and global operations.

The real google-cloud-compute clients talk to it (COMPUTE_EMULATOR_HOST=http://127.0.0.1:PORT). Operations finish
`delay` seconds after they start. Faults:
  fake.faults["insert"].append((503, "backendError", "..."))          the next HTTP call fails at once
  fake.op_faults["insert"].append(("ZONE_RESOURCE_POOL_EXHAUSTED", "..."))  its operation ends with this error
A request with a bearer token is the identity it names (a host deleting itself: the project IAM in
resource_manager.py decides, 403 otherwise, as instances.delete needs compute.instances.delete); one without is the
test's user (the CLI's anonymous client).
"""
from __future__ import annotations

import collections
import itertools
import json
import re
import threading
import time

from fakes import compute_tpu
from fakes.compute_tpu import TpuCompute
from fakes.wire import QuietHandler, serve

MUTATING = {"insert", "delete", "fw_insert", "fw_delete"} | compute_tpu.MUTATING
_ROUTES = [
    ("GET", r"^/compute/v1/projects/(?P<project>[^/]+)$", "project"),
    ("POST", r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances$", "insert"),
    ("GET", r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances$", "list"),
    ("GET", r"^/compute/v1/projects/(?P<project>[^/]+)/aggregated/instances$", "aggregated"),
    ("GET", r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$", "get"),
    ("DELETE", r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$", "delete"),
    ("GET", r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)$", "operation"),
    ("POST", r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)/wait$",
     "operation"),
    # firewalls.list / get / insert / delete and globalOperations.get
    # (cloud.google.com/compute/docs/reference/rest/v1/firewalls, .../globalOperations/get)
    ("GET", r"^/compute/v1/projects/(?P<project>[^/]+)/global/firewalls$", "fw_list"),
    ("POST", r"^/compute/v1/projects/(?P<project>[^/]+)/global/firewalls$", "fw_insert"),
    ("GET", r"^/compute/v1/projects/(?P<project>[^/]+)/global/firewalls/(?P<name>[^/]+)$", "fw_get"),
    ("DELETE", r"^/compute/v1/projects/(?P<project>[^/]+)/global/firewalls/(?P<name>[^/]+)$", "fw_delete"),
    ("GET", r"^/compute/v1/projects/(?P<project>[^/]+)/global/operations/(?P<op>[^/]+)$", "global_operation"),
    *compute_tpu.ROUTES,
]
NETWORK_URL = "https://www.googleapis.com/compute/v1/projects/{project}/global/networks/{network}"


class FakeCompute(TpuCompute):
    def __init__(self, delay: float = 0.0, project_number: int = 424242):
        self.reset_tpu()
        self.delay = delay
        self.project_number = project_number
        self.instances = {}
        self.firewalls = {}   # (project, name) -> Firewall as the API returns it
        self.hosts = None   # SimulatedHosts: boots the VM's start-up script while it is created
        self.ops = {}
        self.faults = collections.defaultdict(list)
        self.op_faults = collections.defaultdict(list)
        self.before = collections.defaultdict(list)   # callables run just before the next such call is handled
        self.lost = collections.Counter()              # the next N such calls are applied, then answered 503
        self.calls = []
        self.lock = threading.RLock()
        self._ids = itertools.count(1)
        self.httpd = None
        self.iam = None   # FakeResourceManager

    def start(self) -> str:
        fake = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def _go(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                from fakes.resource_manager import member_of
                from fakes.wire import send_json
                code, payload = fake.handle(self.command, self.path.split("?")[0], body,
                                            member_of(self.headers.get("Authorization")))
                send_json(self, code, payload)
            do_GET = do_POST = do_DELETE = _go

        self.httpd = serve(Handler)
        return f"http://127.0.0.1:{self.httpd.server_port}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def mutating_calls(self):
        return [c for c in self.calls if c[0] in MUTATING]

    @staticmethod
    def _error(code, reason, message):
        return code, {"error": {"code": code, "message": message, "errors": [{"reason": reason, "message": message}]}}

    def handle(self, method, path, body, member=None):
        for verb, rx, action in _ROUTES:
            m = re.match(rx, path)
            if verb == method and m:
                break
        else:
            return self._error(404, "notFound", f"no route {method} {path}")
        if member is not None:
            target = path.removeprefix("/compute/v1/")
            if member == "invalid":
                return self._error(401, "authError", "Invalid Credentials")
            # a host deletes its VM, or its MIG (compute/docs/access/iam: compute.instanceGroupManagers.delete)
            needs = {"delete": "compute.instances.delete", "mig_delete": "compute.instanceGroupManagers.delete"}
            if action not in needs or not self.iam.allows(member, needs[action], target, "compute.googleapis.com"):
                return self._error(403, "forbidden", f"Required 'compute.instances.{action}' permission for "
                                                     f"'{target}'")
        with self.lock:
            self.calls.append((action, path))
            if body:
                self.bodies.append((action, body))
            if self.before[action]:
                self.before[action].pop(0)()
            if self.faults[action]:
                return self._error(*self.faults[action].pop(0))
            self._advance()
            answer = getattr(self, "do_" + action)(body, **m.groupdict())
            if self.lost[action]:
                self.lost[action] -= 1
                return self._error(503, "backendError", "The service is currently unavailable.")
            return answer

    def _advance(self):
        now = time.monotonic()
        for op in self.ops.values():
            if op["status"] != "DONE" and op["at"] <= now:
                op["status"] = "DONE"
                op.pop("finish")()

    def _op(self, project, zone, kind, target, finish, error=None):
        name = f"operation-{next(self._ids)}"
        op = {"kind": "compute#operation", "name": name, "operationType": kind, "status": "RUNNING",
              "zone": f"projects/{project}/zones/{zone}", "targetLink": target, "at": time.monotonic() + self.delay,
              "finish": finish}
        if error:
            self._failed(op, error[0], error[1])
        self.ops[name] = op
        if self.delay == 0:
            self._advance()
        return 200, {k: v for k, v in op.items() if k not in ("at", "finish")}

    def do_project(self, body, project):
        return 200, {"kind": "compute#project", "name": project, "id": str(self.project_number),
                     "defaultServiceAccount": f"{self.project_number}-compute@developer.gserviceaccount.com"}

    def do_insert(self, body, project, zone):
        key = (project, zone, body["name"])
        if key in self.instances:
            return self._error(409, "alreadyExists", f"The resource '{body['name']}' already exists")
        refused = self.check_tpu_instance(body, zone, project)
        if refused:
            return refused
        if body["machineType"].rsplit("/", 1)[-1] in compute_tpu.TPU_MACHINES:
            return self._insert_tpu_vm(body, project, zone)
        # kept as sent (networkInterfaces[].network/.subnetwork as the partial URLs given: tests read them here); no
        # network is checked to exist, as no test names one that does not
        inst = dict(body, status="PROVISIONING", zone=zone, id=str(next(self._ids)))
        self.instances[key] = inst
        error = self.op_faults["insert"].pop(0) if self.op_faults["insert"] else None
        script = next((i["value"] for i in body.get("metadata", {}).get("items", []) if i["key"] == "startup-script"), "")
        if self.hosts is not None and not error:
            # "default" is the project's Compute Engine default service account (the API resolves it).
            sa = body.get("serviceAccounts", [{}])[0].get("email", "default")
            sa = f"{self.project_number}-compute@developer.gserviceaccount.com" if sa == "default" else sa
            # the boot disk's image decides what the simulated host looks like (only Debian 12 is modelled)
            image = body.get("disks", [{}])[0].get("initializeParams", {}).get("sourceImage", "")
            assert "debian-12" in image, f"no simulated host for image {image!r}"
            self.hosts.boot(f"{project}/{zone}/{body['name']}", script, 1, sa, "", kind="node-vm", image="debian-12")

        def finish():
            if error:
                self.instances.pop(key, None)
            elif key in self.instances:
                self.instances[key]["status"] = "RUNNING"
        return self._op(project, zone, "insert", body["name"], finish, error)

    def _insert_tpu_vm(self, body, project, zone):
        """A TPU VM: it boots its host while PROVISIONING; a stockout ends the operation with the error and no VM
        (§9). A flex-start VM with a wait (params.requestValidForDuration) of 90 s or more is PENDING first
        (instance-lifecycle, §4): compute_tpu.flex_vm says for how long and how it ends."""
        key = (project, zone, body["name"])
        error = self.op_faults["insert"].pop(0) if self.op_faults["insert"] else None
        if zone in self.stockout_zones:
            error = (compute_tpu.STOCKOUT[0], compute_tpu.STOCKOUT[1].format(project=project, zone=zone))
        inst = dict(body, status="PROVISIONING", zone=zone, id=str(next(self._ids)),
                    networkInterfaces=[dict(n, networkIP=f"10.0.{len(self.instances) % 250}.2")
                                       for n in body.get("networkInterfaces", [])])
        if not error and self.flex_pending(body):
            return self.flex_vm(key, inst)
        if not error:
            self.instances[key] = inst
            self.boot_tpu_vm(project, zone, body["name"], body, 0, [body["name"]])

        def finish():
            if key in self.instances:
                self.instances[key]["status"] = "RUNNING"
        return self._op(project, zone, "insert", body["name"], finish, error)

    def do_get(self, body, project, zone, name):
        self.flex_tick((project, zone, name))
        inst = self.instances.get((project, zone, name))
        if inst is None:
            return self._error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                                                "was not found")
        return 200, inst

    def do_list(self, body, project, zone):
        return 200, {"items": [i for (p, z, _), i in self.instances.items() if p == project and z == zone]}

    def do_aggregated(self, body, project):
        """instances.aggregatedList (cloud.google.com/compute/docs/reference/rest/v1/instances/aggregatedList):
        `items` maps "zones/ZONE" to {"instances": [...]}; a zone without instances carries a warning instead."""
        items = {}
        for (p, z, _), inst in self.instances.items():
            if p == project:
                items.setdefault(f"zones/{z}", {"instances": []})["instances"].append(inst)
        items.setdefault("zones/europe-west4-a", {"warning": {"code": "NO_RESULTS_ON_PAGE",
                                                              "message": "There are no results for scope"}})
        return 200, {"kind": "compute#instanceAggregatedList", "id": f"projects/{project}/aggregated/instances",
                     "items": items}

    def do_delete(self, body, project, zone, name):
        key = (project, zone, name)
        if key not in self.instances:
            return self.do_get(body, project, zone, name)
        self.instances[key]["status"] = "STOPPING"

        def finish():
            self.instances.pop(key, None)
            if self.hosts is not None:
                self.hosts.power_off(f"{project}/{zone}/{name}")
        return self._op(project, zone, "delete", name, finish)

    def do_operation(self, body, project, zone, op):
        self.flex_tick_op(op)
        o = self.ops.get(op)
        if o is None:
            return self._error(404, "notFound", f"operation {op} not found")
        return 200, {k: v for k, v in o.items() if k not in ("at", "finish")}

    # -- firewall rules ---------------------------------------------------------------------------------------
    def add_network(self, project, network, default_allow_internal=False):
        """A VPC network as Google makes it: only the implied rules, which deny all ingress and are not listed
        (cloud.google.com/vpc/docs/firewalls, "Implied rules"); the default network comes with
        default-allow-internal: "allows ingress connections for all protocols and ports among instances in the
        network", source 10.128.0.0/9 ("Pre-populated rules in the default network")."""
        if default_allow_internal:
            self.firewalls[(project, f"{network}-allow-internal")] = {
                "kind": "compute#firewall", "name": f"{network}-allow-internal", "direction": "INGRESS",
                "priority": 65534, "network": NETWORK_URL.format(project=project, network=network),
                "sourceRanges": ["10.128.0.0/9"], "disabled": False,
                "allowed": [{"IPProtocol": "tcp", "ports": ["0-65535"]}, {"IPProtocol": "udp", "ports": ["0-65535"]},
                            {"IPProtocol": "icmp"}]}

    def do_fw_list(self, body, project):
        return 200, {"kind": "compute#firewallList",
                     "items": [f for (p, _), f in self.firewalls.items() if p == project]}

    def do_fw_get(self, body, project, name):
        fw = self.firewalls.get((project, name))
        if fw is None:
            return self._error(404, "notFound", f"The resource 'projects/{project}/global/firewalls/{name}' was "
                                                "not found")
        return 200, fw

    def do_fw_insert(self, body, project):
        if (project, body["name"]) in self.firewalls:
            return self._error(409, "alreadyExists", f"The resource 'projects/{project}/global/firewalls/"
                                                     f"{body['name']}' already exists")
        # the network as sent ("projects/P/global/networks/N") comes back as its full URL, as for every reference
        network = body.get("network", "global/networks/default").rsplit("/", 1)[-1]
        fw = dict(body, kind="compute#firewall", id=str(next(self._ids)), direction=body.get("direction", "INGRESS"),
                  network=NETWORK_URL.format(project=project, network=network), disabled=body.get("disabled", False))
        self.firewalls[(project, body["name"])] = fw
        return self._global_op(project, "insert", body["name"], lambda: None)

    def do_fw_delete(self, body, project, name):
        if (project, name) not in self.firewalls:
            return self.do_fw_get(body, project, name)
        return self._global_op(project, "delete", name, lambda: self.firewalls.pop((project, name), None))

    def _global_op(self, project, kind, target, finish):
        code, op = self._op(project, "-", kind, target, finish)
        op.pop("zone", None)
        self.ops[op["name"]].pop("zone", None)
        return code, op

    def do_global_operation(self, body, project, op):
        return self.do_operation(body, project, "-", op)
