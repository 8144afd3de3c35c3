"""A wire-level fake of the Cloud TPU API (v1 and v2) and its long-running operations, over plaintext gRPC.

The real google-cloud-tpu clients talk to it (TPU_EMULATOR_HOST). State lives in memory; operations finish
`delay` seconds after they start (checked lazily on every request). Faults:
  fake.faults["CreateNode"].append(("RESOURCE_EXHAUSTED", "..."[, "REASON"]))   the next call fails at once
  fake.op_faults["CreateNode"].append((8, "There is no more capacity in the zone ..."[, "REASON"]))  its operation
A REASON travels as a google.rpc.ErrorInfo in the status details (the `grpc-status-details-bin` trailer), as
Google's APIs send it (google/rpc/error_details.proto; AIP-193): google-api-core exposes it as `exc.reason`.
`calls` records every method called, so tests can assert that nothing mutating happened.
Documented behaviours modelled (sources beside each): v1 DeleteNode answers google.protobuf.Empty although the
client declares Node; ListAcceleratorTypes is per zone; a failed create leaves no node.

A REST front (`start_rest`, TPU_REST_EMULATOR_HOST on simulated hosts) serves what a host asks as its own
identity: `DELETE /v{1,2}/projects/P/locations/Z/nodes/N` (cloud.google.com/tpu/docs/reference/rest/v2/
projects.locations.nodes/delete). It authenticates the bearer token (401 without one) and asks the project IAM
(resource_manager.py) for tpu.nodes.delete on that node, answering 403 PERMISSION_DENIED in Google's JSON error
shape when it is not held. gRPC calls come from the CLI, whose test credentials are the project owner's.
"""
from __future__ import annotations

import collections
import itertools
import re
import threading
import time
from concurrent import futures

import grpc
from google.cloud import tpu_v1, tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import any_pb2, empty_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from fakes.tpu_host import tpu_vm_image
from fakes.wire import QuietHandler, serve

MUTATING = {"CreateNode", "DeleteNode", "StartNode", "StopNode", "UpdateNode", "CreateQueuedResource",
            "DeleteQueuedResource"}
# A queued resource's life (cloud.google.com/tpu/docs/queued-resources): ACCEPTED, WAITING_FOR_RESOURCES while it
# waits for capacity, PROVISIONING, then ACTIVE with its node READY; FAILED when it cannot be met (or its
# valid-until time passed first); a spot one goes SUSPENDED when preempted, its node gone.
QR_PLAN = ["ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
RUNTIMES = ["tpu-vm-tf-2.16.1-pjrt", "tpu-vm-tf-2.17.0-pjrt", "tpu-vm-tf-2.17.0-pod-pjrt", "tpu-vm-tf-2.17.0-se",
            "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6", "tpu-vm-tf-2.18.0-pjrt-v5p-and-below", "tpu-vm-base",
            "tpu-vm-tf-2.18.0-pod-pjrt-v5p-and-below", "v2-alpha-tpuv5-lite", "v2-alpha-tpuv5", "v2-alpha-tpuv6e",
            "tpu-ubuntu2204-base", "tpu-vm-tf-2.18.0-pod-pjrt-v5e-and-v6"]
TF_VERSIONS = ["2.10.0", "2.11.0", "2.12.0", "2.9.1"]


def error_status(code: int, message: str, reason: str = "") -> status_pb2.Status:
    """A google.rpc.Status as Google sends it: the reason, when there is one, only in an ErrorInfo detail."""
    status = status_pb2.Status(code=code, message=message)
    if reason:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="googleapis.com"))
        status.details.append(detail)
    return status


NODE_DENIED = ("Your request to provision TPU Node has been denied. Please migrate to TPU VM Architecture or contact "
               "Cloud TPU team to gain TPU Node access.")


class FakeTpu:
    def __init__(self, delay: float = 0.0, project_number: int = 424242):
        self.tpu_nodes_allowed = False   # a project Google still lets make TPU Nodes (tests mark tpu_nodes)
        self.delay = delay
        self.project_number = project_number
        self.nodes = {1: {}, 2: {}}
        self.ops = {}
        self.faults = collections.defaultdict(list)
        self.op_faults = collections.defaultdict(list)
        self.before = collections.defaultdict(list)   # callables run just before the next such call is handled
        self.lost = collections.Counter()              # the next N such calls are applied, then their answer lost
        self.calls = []
        self.zones = None  # None: every zone exists
        self.accelerator_types = {}   # zone -> [type, ...]; a zone not listed offers every type
        self.runtimes = {}            # zone -> [runtime, ...]; a zone not listed offers RUNTIMES
        self.hosts = None             # SimulatedHosts: boots a host per worker while a node is created
        self.queued = {}              # name -> {"qr": QueuedResource, "plan": [state...], "since": t, "valid_until"}
        self.qr_plan = list(QR_PLAN)  # the states each new request goes through (end with FAILED to refuse it)
        self.qr_plans = {}            # zone -> its own plan
        self.qr_step = 0.0            # seconds in each state before the next
        self.repairs = 0              # slices Google repaired (repair()), for fresh addresses
        self.iam = None               # FakeResourceManager: who may delete over the REST front
        self.rest_calls = []          # (method, path, member) of every REST call
        # How the TPU API answers a DELETE of a node already DELETING (for one, under its queued request's forced
        # deletion) is not established: no reference page or issue thread says. None: asked again, as the fake
        # always did; (status, STATUS) such as (400, "FAILED_PRECONDITION") or (409, "ABORTED"): refused so.
        self.redelete = None
        self.lock = threading.RLock()
        self._ids = itertools.count(1)
        self.server = None
        self.port = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> str:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers([self._handlers(1), self._handlers(2), self._ops_handler()])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        return f"127.0.0.1:{self.port}"

    def stop(self):
        self.server.stop(0)
        if getattr(self, "httpd", None):
            self.httpd.shutdown()

    def start_rest(self) -> str:
        fake = self
        route = re.compile(r"^/v(?P<v>[12])/(?P<name>projects/[^/]+/locations/[^/]+/(?P<kind>nodes|queuedResources)"
                           r"/[^/]+)$")

        class Handler(QuietHandler):
            def do_DELETE(self):
                from fakes.resource_manager import member_of
                from fakes.wire import send_error, send_json
                m = route.match(self.path.split("?")[0])
                member = member_of(self.headers.get("Authorization"))
                with fake.lock:
                    fake.rest_calls.append(("DELETE", self.path, member))
                if not m:
                    return send_error(self, 404, "NOT_FOUND", f"no route {self.path}")
                if member in (None, "invalid"):
                    return send_error(self, 401, "UNAUTHENTICATED", "Request is missing required authentication credential.")
                # A queued resource's delete: which permission Google checks is not documented, and none for
                # queued resources is listed among TPU Admin's (resource_manager.TPU_PERMISSIONS): the node's.
                permission = "tpu.nodes.delete"
                if not fake.iam.allows(member, permission, m["name"], "tpu.googleapis.com"):
                    return send_error(self, 403, "PERMISSION_DENIED", f"Permission '{permission}' denied on '{m['name']}'")
                v, name = int(m["v"]), m["name"]
                with fake.lock:
                    fake._advance()
                    fake.calls.append((v, "DeleteNode" if m["kind"] == "nodes" else "DeleteQueuedResource", name))
                    if name not in (fake.nodes[v] if m["kind"] == "nodes" else fake.queued):
                        return send_error(self, 404, "NOT_FOUND", f"Resource '{name}' was not found")
                    if m["kind"] == "nodes":
                        if fake.redelete and fake.nodes[v][name].state.name == "DELETING":
                            return send_error(self, *fake.redelete, f"Node '{name}' is already being deleted")
                        op = fake._delete(v, name)
                    else:
                        refused = []
                        op = fake._delete_qr(name, "force=true" in self.path, lambda code, msg: refused.append(msg))
                        if refused:
                            return send_error(self, 400, "FAILED_PRECONDITION", refused[0])
                send_json(self, 200, {"name": op.name, "done": op.done})

        self.httpd = serve(Handler)
        return f"http://127.0.0.1:{self.httpd.server_port}"

    def mutating_calls(self) -> list:
        return [c for c in self.calls if c[1] in MUTATING]

    # -- machinery ------------------------------------------------------------------------------------
    def _handlers(self, v: int):
        m = tpu_v1 if v == 1 else tpu_v2
        table = {
            "GetNode": (m.GetNodeRequest, m.Node, self.get_node),
            "ListNodes": (m.ListNodesRequest, m.ListNodesResponse, self.list_nodes),
            "CreateNode": (m.CreateNodeRequest, None, self.create_node),
            "DeleteNode": (m.DeleteNodeRequest, None, self.delete_node),
            "StartNode": (m.StartNodeRequest, None, self.start_node),
            "ListAcceleratorTypes": (m.ListAcceleratorTypesRequest, m.ListAcceleratorTypesResponse,
                                     self.list_accelerator_types),
        }
        if v == 2:
            table["ListRuntimeVersions"] = (m.ListRuntimeVersionsRequest, m.ListRuntimeVersionsResponse,
                                            self.list_runtimes)
            table["CreateQueuedResource"] = (m.CreateQueuedResourceRequest, None, self.create_qr)
            table["GetQueuedResource"] = (m.GetQueuedResourceRequest, m.QueuedResource, self.get_qr)
            table["ListQueuedResources"] = (m.ListQueuedResourcesRequest, m.ListQueuedResourcesResponse,
                                            self.list_qrs)
            table["DeleteQueuedResource"] = (m.DeleteQueuedResourceRequest, None, self.delete_qr)
        else:
            table["ListTensorFlowVersions"] = (m.ListTensorFlowVersionsRequest, m.ListTensorFlowVersionsResponse,
                                               self.list_tf)
        handlers = {}
        for name, (req, resp, fn) in table.items():
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                self._wrap(v, name, fn, req),
                request_deserializer=req.deserialize,
                response_serializer=(resp.serialize if resp else operations_pb2.Operation.SerializeToString))
        return grpc.method_handlers_generic_handler(f"google.cloud.tpu.v{v}.Tpu", handlers)

    def _ops_handler(self):
        h = grpc.unary_unary_rpc_method_handler(
            self._wrap(0, "GetOperation", self.get_operation, None),
            request_deserializer=operations_pb2.GetOperationRequest.FromString,
            response_serializer=operations_pb2.Operation.SerializeToString)
        return grpc.method_handlers_generic_handler("google.longrunning.Operations", {"GetOperation": h})

    def _wrap(self, v, name, fn, req_type):
        def handler(request, context):
            with self.lock:
                self.calls.append((v, name, getattr(request, "name", "") or getattr(request, "parent", "")))
                if self.before[name]:
                    self.before[name].pop(0)()
                if self.faults[name]:
                    code, message, *reason = self.faults[name].pop(0)
                    status = error_status(grpc.StatusCode[code].value[0], message, *reason)
                    context.abort_with_status(rpc_status.to_status(status))
                self._advance()
                answer = fn(v, request, context)
                if self.lost[name]:
                    self.lost[name] -= 1   # applied, but the connection dropped before the answer arrived
                    context.abort(grpc.StatusCode.UNAVAILABLE, "Connection reset by peer")
                return answer
        return handler

    def _advance(self):
        now = time.monotonic()
        for name, q in list(self.queued.items()):
            self._step_qr(name, q, now)
        for op in self.ops.values():
            if not op["done"] and op["at"] <= now:
                op["done"] = True
                op["finish"]()

    def _op(self, v, zone_parent, finish, error=None, response=None):
        name = f"{zone_parent}/operations/operation-{next(self._ids)}"
        op = {"name": name, "v": v, "at": time.monotonic() + self.delay, "done": False, "error": error,
              "response": response, "finish": finish}
        self.ops[name] = op
        if self.delay == 0:
            self._advance()
        return self._op_pb(op)

    def _op_pb(self, op):
        pb = operations_pb2.Operation(name=op["name"], done=op["done"])
        if op["done"]:
            if op["error"]:
                pb.error.CopyFrom(error_status(*op["error"]))
            else:
                resp = op["response"]() if callable(op["response"]) else op["response"]
                a = any_pb2.Any()
                a.Pack(resp if resp is not None else empty_pb2.Empty())
                pb.response.CopyFrom(a)
        return pb

    def _zone(self, parent, context):
        zone = parent.split("/")[3]
        if self.zones is not None and zone not in self.zones and zone != "-":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid location {zone}")
        return zone

    def _node_or_404(self, v, name, context):
        node = self.nodes[v].get(name)
        if node is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Resource '{name}' was not found")
        return node

    # -- methods --------------------------------------------------------------------------------------
    def get_node(self, v, req, context):
        return self._node_or_404(v, req.name, context)

    def list_nodes(self, v, req, context):
        zone = self._zone(req.parent, context)
        m = tpu_v1 if v == 1 else tpu_v2
        nodes = [n for name, n in self.nodes[v].items() if zone == "-" or name.split("/")[3] == zone]
        return m.ListNodesResponse(nodes=nodes)

    def list_runtimes(self, v, req, context):
        zone = self._zone(req.parent, context)
        return tpu_v2.ListRuntimeVersionsResponse(runtime_versions=[
            tpu_v2.RuntimeVersion(name=f"{req.parent}/runtimeVersions/{r}", version=r)
            for r in self.runtimes.get(zone, RUNTIMES)])

    def list_accelerator_types(self, v, req, context):
        zone = self._zone(req.parent, context)
        m = tpu_v1 if v == 1 else tpu_v2
        names = self.accelerator_types.get(zone, [])
        return m.ListAcceleratorTypesResponse(accelerator_types=[
            m.AcceleratorType(name=f"{req.parent}/acceleratorTypes/{t}", type_=t) for t in names])

    def list_tf(self, v, req, context):
        self._zone(req.parent, context)
        return tpu_v1.ListTensorFlowVersionsResponse(tensorflow_versions=[
            tpu_v1.TensorFlowVersion(name=f"{req.parent}/tensorFlowVersions/{t}", version=t) for t in TF_VERSIONS])

    def create_node(self, v, req, context):
        self._zone(req.parent, context)
        if v == 1 and not self.tpu_nodes_allowed:
            # What Google answers a project without TPU Node access, HTTP 400 (skypilot-org/skypilot#5593; GCP_FACTS
            # §1, §5): the architecture is retired for new creates.
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, NODE_DENIED)
        name = f"{req.parent}/nodes/{req.node_id}"
        if name in self.nodes[v]:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, f"Resource '{name}' already exists")
        m = tpu_v1 if v == 1 else tpu_v2
        # kept as sent (network_config.network/.subnetwork included: tpu_v2 Node echoes the create request's fields
        # in get_node; tests read what tpuctl asked for here)
        node = m.Node(req.node)
        node.name = name
        node.state = m.Node.State.CREATING
        self.nodes[v][name] = node
        error = tuple(self.op_faults["CreateNode"].pop(0)) if self.op_faults["CreateNode"] else None
        ip = f"10.0.0.{len(self.nodes[v]) + 1}"
        if self.hosts is not None and v == 2 and not error:
            # The start-up script runs on every worker while the node is still CREATING (GCP_FACTS §6).
            from tpuctl.core.catalog import tpu_type
            self.hosts.boot(name, node.metadata.get("startup-script", ""), tpu_type(node.accelerator_type).hosts,
                            node.service_account.email, node.accelerator_type,
                            image=tpu_vm_image(node.runtime_version))

        def finish():
            n = self.nodes[v].get(name)
            if n is None:
                return
            if error:
                del self.nodes[v][name]  # a failed create leaves nothing, as the real API does
                return
            n.state = m.Node.State.READY
            # one endpoint per worker of the slice (Node.network_endpoints, tpu v2 API reference)
            from tpuctl.core.catalog import tpu_type
            workers = tpu_type(n.accelerator_type).hosts if v == 2 else 1
            n.network_endpoints = [m.NetworkEndpoint(ip_address=f"{ip}{'' if w == 0 else f'.{w}'}", port=8470)
                                   for w in range(workers)]
            if v == 1:
                n.ip_address, n.port = ip, "8470"
                n.service_account = f"service-{self.project_number}@cloud-tpu.iam.gserviceaccount.com"
        return self._op(v, req.parent, finish, error, lambda: m.Node.pb(self.nodes[v].get(name) or node))

    def delete_node(self, v, req, context):
        self._node_or_404(v, req.name, context)
        return self._delete(v, req.name)

    def _delete(self, v, name):
        m = tpu_v1 if v == 1 else tpu_v2
        self.nodes[v][name].state = m.Node.State.DELETING
        parent = "/".join(name.split("/")[:4])
        # Both versions answer Empty, though tpu_v1's client declares Node: its op.result()/done() then raise
        # TypeError (googleapis/google-cloud-go#10951, GoogleCloudPlatform/golang-samples#4422).
        def finish():
            self.nodes[v].pop(name, None)
            if self.hosts is not None:
                self.hosts.power_off(name)
        return self._op(v, parent, finish, None, empty_pb2.Empty())

    def start_node(self, v, req, context):
        m = tpu_v1 if v == 1 else tpu_v2
        node = self._node_or_404(v, req.name, context)
        node.state = m.Node.State.STARTING
        parent = "/".join(req.name.split("/")[:4])

        def finish():
            node.state = m.Node.State.READY
        return self._op(v, parent, finish, None, lambda: m.Node.pb(node))

    def get_operation(self, v, req, context):
        op = self.ops.get(req.name)
        if op is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"operation {req.name} not found")
        return self._op_pb(op)

    # -- queued resources (v2) ------------------------------------------------------------------------
    def create_qr(self, v, req, context):
        self._zone(req.parent, context)
        name = f"{req.parent}/queuedResources/{req.queued_resource_id}"
        if name in self.queued:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, f"Resource '{name}' already exists")
        qr = tpu_v2.QueuedResource(req.queued_resource)
        qr.name = name
        policy = qr.queueing_policy.valid_until_duration
        valid = policy.total_seconds() if policy else 0.0
        plan = list(self.qr_plans.get(name.split("/")[3], self.qr_plan))
        self.queued[name] = {"qr": qr, "plan": plan, "since": time.monotonic(), "i": 0,
                             "valid_until": time.monotonic() + valid if valid else 0.0}
        self._set_qr(name, plan[0])
        return self._op(v, req.parent, lambda: None, None, lambda: tpu_v2.QueuedResource.pb(qr))

    @staticmethod
    def _qr_nodes(qr):
        """The nodes a request makes: its node_id, or for a Multislice (`multislice_params`, the other member of the
        `name_strategy` oneof) node_count nodes named `<node_id_prefix>-0 ... -(N-1)`, the prefix defaulting to the
        request's id (google-cloud-tpu 1.28 QueuedResource.Tpu.NodeSpec.MultisliceParams docstring)."""
        spec = qr.tpu.node_spec[0]
        if "multislice_params" not in spec:
            return [f"{spec.parent}/nodes/{spec.node_id}"]
        prefix = spec.multislice_params.node_id_prefix or qr.name.rsplit("/", 1)[-1]
        return [f"{spec.parent}/nodes/{prefix}-{k}" for k in range(spec.multislice_params.node_count)]

    def _set_qr(self, name, state):
        q = self.queued[name]
        q["qr"].state = tpu_v2.QueuedResourceState(state=tpu_v2.QueuedResourceState.State[state])
        q["since"] = time.monotonic()
        if state != "ACTIVE":
            return
        # its nodes, made as the request's node spec says, READY with their hosts booted
        nodes = self._qr_nodes(q["qr"])
        for k, node_name in enumerate(nodes):
            node = tpu_v2.Node(q["qr"].tpu.node_spec[0].node)
            node.name = node_name
            node.state = tpu_v2.Node.State.READY
            node.queued_resource = name
            node.multislice_node = len(nodes) > 1 and "multislice_params" in q["qr"].tpu.node_spec[0]
            from tpuctl.core.catalog import tpu_type
            workers = tpu_type(node.accelerator_type).hosts
            # one endpoint per host (Node.network_endpoints); each slice its own addresses
            node.network_endpoints = [tpu_v2.NetworkEndpoint(ip_address=f"10.1.{k}.{w + 1}", port=8470)
                                      for w in range(workers)]
            self.nodes[2][node.name] = node
            self._boot_slice(node, k, len(nodes))

    def _boot_slice(self, node, k: int, slices: int, same_disk: bool = False):
        if self.hosts is None:
            return
        from tpuctl.core.catalog import tpu_type
        # A Multislice node's tpu-env carries `MEGASCALE_SLICE_ID: 'K'` lines beside WORKER_ID and NODE_ID (MaxText
        # multihost_job.py greps them; JAX's cloud_tpu_cluster.py `get_tpu_env_value` parses "Typical line is
        # MEGASCALE_NUM_SLICES: '2'"), and MEGASCALE_COORDINATOR_ADDRESS, "set as the host with process id = 0"
        # on "GCE via QueuedResources" (JAX cloud_tpu_cluster.py `get_coordinator_address`, which keeps what is
        # before a ':'; "the MXLA coordinator ... is set to 8080 in multislice GCE": served as ip:8080).
        tpu_env = {"NODE_ID": node.name.rsplit("/", 1)[-1]}
        if node.multislice_node:
            tpu_env.update(MEGASCALE_SLICE_ID=str(k), MEGASCALE_NUM_SLICES=str(slices),
                           MEGASCALE_COORDINATOR_ADDRESS=f"{self._coordinator(node)}:8080")
        self.hosts.boot(node.name, node.metadata.get("startup-script", ""), tpu_type(node.accelerator_type).hosts,
                        node.service_account.email, node.accelerator_type, tpu_env=tpu_env, same_disk=same_disk,
                        image=tpu_vm_image(node.runtime_version))

    def _coordinator(self, node) -> str:
        """Slice 0's worker 0, as its node reports it now (a slice Google re-made may have new addresses)."""
        first = self._qr_nodes(self.queued[node.queued_resource]["qr"])[0]
        return self.nodes[2][first].network_endpoints[0].ip_address

    def _step_qr(self, name, q, now):
        state = tpu_v2.QueuedResourceState.State(q["qr"].state.state).name
        if state in ("ACTIVE", "FAILED", "SUSPENDED", "DELETING") or now - q["since"] < self.qr_step:
            return
        if q["valid_until"] and now >= q["valid_until"]:
            return self._set_qr(name, "FAILED")   # not met in time: the request expired
        q["i"] += 1
        self._set_qr(name, q["plan"][min(q["i"], len(q["plan"]) - 1)])
        if self.qr_step == 0:
            self._step_qr(name, q, now)

    def get_qr(self, v, req, context):
        q = self.queued.get(req.name)
        if q is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Resource '{req.name}' was not found")
        return q["qr"]

    def list_qrs(self, v, req, context):
        zone = self._zone(req.parent, context)
        return tpu_v2.ListQueuedResourcesResponse(queued_resources=[
            q["qr"] for name, q in self.queued.items() if zone == "-" or name.split("/")[3] == zone])

    def delete_qr(self, v, req, context):
        q = self.queued.get(req.name)
        if q is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Resource '{req.name}' was not found")
        return self._delete_qr(req.name, req.force, context.abort)

    def _delete_qr(self, name, force, abort):
        """Without force, a request whose node still exists is refused (gcloud's `queued-resources delete
        --force` "deletes the TPUs of the queued resource as well"); with force, "all running nodes belonging to
        this queued resource will be deleted first" (REST reference of queuedResources.delete): they go DELETING."""
        nodes = self._qr_nodes(self.queued[name]["qr"])
        if any(node in self.nodes[2] for node in nodes) and not force:
            return abort(grpc.StatusCode.FAILED_PRECONDITION,
                         f"Queued resource {name} has nodes; delete them first or use force")
        self._set_qr(name, "DELETING")
        for node in nodes:
            if node in self.nodes[2]:
                self.nodes[2][node].state = tpu_v2.Node.State.DELETING

        def finish():
            self.queued.pop(name, None)
            for node in nodes:
                if self.nodes[2].pop(node, None) is not None and self.hosts is not None:
                    self.hosts.power_off(node)
        return self._op(2, "/".join(name.split("/")[:4]), finish, None, empty_pb2.Empty())

    # -- test helpers ---------------------------------------------------------------------------------
    def suspend(self, name: str):
        """A spot queued resource preempted: SUSPENDED, its node gone with its hosts."""
        with self.lock:
            for node in self._qr_nodes(self.queued[name]["qr"]):
                self.nodes[2].pop(node, None)
                if self.hosts is not None:
                    self.hosts.power_off(node)
            self._set_qr(name, "SUSPENDED")

    def repair(self, name: str, fresh_disk: bool, seconds: float = 1.0, new_address: bool = False):
        """Google repairing one slice of a request that stays ACTIVE: "Compute Engine automatically recovers TPU
        instances and slices by restarting them on healthy hardware", every host of the slice together ("you can't
        reschedule individual instances within a slice"; cloud.google.com/tpu/docs/failure-recovery). The node is
        REPAIRING meanwhile (tpu_v2 Node.State: "being repaired and may be unusable"). On a Multislice, once the
        slice is back Cloud TPU restarts every other slice too (cloud.google.com/tpu/docs/multislice-introduction,
        "Autorepair", as issue 39 quotes it): their hosts reboot from their own disks. Whether a repaired host comes
        back with its boot disk is not documented (`fresh_disk` picks), nor whether with its address (`new_address`
        gives the slice new ones: on healthy hardware elsewhere)."""
        with self.lock:
            node = self.nodes[2][name]
            node.state = tpu_v2.Node.State.REPAIRING
            nodes = self._qr_nodes(self.queued[node.queued_resource]["qr"]) if node.queued_resource else [name]
            if self.hosts is not None:
                self.hosts.power_off(name)
        time.sleep(seconds)
        with self.lock:
            self.repairs += 1
            if new_address:
                node.network_endpoints = [tpu_v2.NetworkEndpoint(ip_address=f"10.{100 + self.repairs}.{k}.{w + 1}",
                                                                 port=8470)
                                          for k in [nodes.index(name)] for w in range(len(node.network_endpoints))]
            node.state = tpu_v2.Node.State.READY
            self._boot_slice(node, nodes.index(name), len(nodes), same_disk=not fresh_disk)
            for other in nodes:
                if other != name and other in self.nodes[2] and self.hosts is not None:
                    self.hosts.power_off(other)
                    self._boot_slice(self.nodes[2][other], nodes.index(other), len(nodes), same_disk=True)

    def set_health(self, name: str, health: str):
        """Node.health as Google's health monitor reports it (tpu_v2 Node.Health)."""
        with self.lock:
            self.nodes[2][name].health = tpu_v2.Node.Health[health]

    def set_state(self, v: int, name: str, state: str):
        with self.lock:
            m = tpu_v1 if v == 1 else tpu_v2
            self.nodes[v][name].state = m.Node.State[state]
            if state in ("PREEMPTED", "TERMINATED", "STOPPED") and self.hosts is not None:
                self.hosts.power_off(name)   # a preempted TPU VM's hosts are gone with their processes
