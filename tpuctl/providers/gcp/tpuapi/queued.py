"""TPUs had through a queued resource (`up --queued`): a request Google fills when capacity frees up
(cloud.google.com/tpu/docs/queued-resources). Its states: ACCEPTED, WAITING_FOR_RESOURCES (queued),
PROVISIONING, ACTIVE (its node exists and is used as any TPU VM), FAILED (not met, or its valid-until time passed:
the request stays until deleted), SUSPENDED (a spot request preempted: its node is gone). Deleting with
`force` deletes its node too. A queued resource carries no labels of its own: its node spec's labels say whose it
is, and they are checked before anything is adopted or deleted.
"""
from __future__ import annotations

import time
from typing import Any

from ....core.errors import ErrorKind, Scope, TpuctlError
from ....core.models import LABEL, NONCE_LABEL, Arch, ClusterSpec, require_owned
from ...base import Progress
from ...google import clients
from ...google.operations import call, get_or_none, wait
from . import slices
from .tpu import TpuApi

DELETE_DEADLINE = 900.0
_PENDING = {"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING"}


class QueuedApi:
    def __init__(self, project: str) -> None:
        self.project = project
        self.nodes = TpuApi(project, Arch.VM)

    @property
    def client(self) -> Any:
        return clients.tpu(2)

    def path(self, name: str, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}/queuedResources/{name}"

    def find(self, name: str, zone: str) -> Any:
        return get_or_none(self.client.get_queued_resource, name=self.path(name, zone), what=f"get queued resource {name}")

    @staticmethod
    def state(qr: Any) -> str:
        return type(qr.state).State(qr.state.state).name

    @staticmethod
    def labels(qr: Any) -> dict[str, str]:
        specs = list(qr.tpu.node_spec)
        return dict(specs[0].node.labels) if specs else {}

    def list_labelled(self) -> list[Any]:
        parent = f"projects/{self.project}/locations/-"
        found = call(lambda: list(self.client.list_queued_resources(parent=parent)), what="list queued resources")
        return [q for q in found if LABEL in self.labels(q)]

    def request(self, spec: ClusterSpec, zone: str, runtime: str, script: str, service_account: str, nonce: str,
                progress: Progress) -> bool:
        """Create the request (or adopt the cluster's own) and wait until it is ACTIVE with its node READY; True when
        THIS run created it. FAILED or a preempted (SUSPENDED) spot request is deleted: FAILED moves `up` to the
        next zone, SUSPENDED is asked for again here."""
        from google.cloud import tpu_v2
        from google.protobuf import duration_pb2
        name = spec.qr_name
        ours = False
        qr = self.find(name, zone)
        if qr is not None:
            require_owned(self.labels(qr), spec.name, f"queued resource {name} in {zone}")
            ours = self.labels(qr).get(NONCE_LABEL) == nonce
            lost = self._lost_slice(spec, zone) if self.state(qr) == "ACTIVE" else ""
            if self.state(qr) in ("SUSPENDED", "SUSPENDING", "FAILED") or lost:
                # a Multislice with one slice lost is asked for again whole: then all slices restart together
                progress(f"{lost or self.state(qr)}: asking again")
                self.delete(spec, zone, progress)
                qr = None
        if qr is None:
            node = self.nodes.build_node(spec, runtime, script, service_account, {**spec.labels, NONCE_LABEL: nonce})
            node.scheduling_config = tpu_v2.SchedulingConfig()   # spot is the request's, not the node's
            parent = f"projects/{self.project}/locations/{zone}"
            request = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[
                slices.build_node_spec(parent, spec, node)]))
            if spec.spot:
                request.spot = tpu_v2.QueuedResource.Spot()
            if spec.valid_until:
                request.queueing_policy = tpu_v2.QueuedResource.QueueingPolicy(
                    valid_until_duration=duration_pb2.Duration(seconds=spec.valid_until))
            progress("requesting")
            try:
                op = call(self.client.create_queued_resource, parent=parent, queued_resource_id=name,
                          queued_resource=request, what=f"request {spec.tpu_type} in {zone}")
                self.nodes.wait_operation(op, f"request {spec.tpu_type} in {zone}", 600.0, progress)
                ours = True
            except TpuctlError as e:
                from google.api_core.exceptions import Conflict
                if not isinstance(e.__cause__, Conflict):   # ALREADY_EXISTS (409)
                    raise
                ours = self._adopt(spec, zone, nonce, progress)
        try:
            self._wait_active(spec, zone, progress)
        except TpuctlError:
            if ours:
                self.delete(spec, zone, progress)
            raise
        return ours

    def _adopt(self, spec: ClusterSpec, zone: str, nonce: str, progress: Progress) -> bool:
        """A create that met ALREADY_EXISTS: ours when the request carries this run's nonce (our create whose answer
        was lost), else another machine's `up` of the same cluster got there first: adopted, never deleted by this
        run, as TpuApi.create does for nodes."""
        qr = self.find(spec.qr_name, zone)
        if qr is None:
            raise TpuctlError(ErrorKind.ERROR, f"queued resource {spec.qr_name} answered ALREADY_EXISTS, then vanished",
                              "another `tpuctl up` or `down` of this cluster may be running: run the command again")
        labels = self.labels(qr)
        require_owned(labels, spec.name, f"queued resource {spec.qr_name} in {zone}")
        theirs = labels.get(NONCE_LABEL, "")
        if theirs == nonce:
            progress("requested by this run, answer lost: adopting")
            return True
        progress(f"requested by another `up` of cluster {spec.name} (its nonce {theirs or 'unset'}): adopting; "
                 "this run will not delete it")
        return False

    def _wait_active(self, spec: ClusterSpec, zone: str, progress: Progress) -> None:
        name = spec.qr_name
        started = time.monotonic()
        deadline = (spec.valid_until or 7 * 86400) + 600.0

        def poll() -> tuple[bool, str]:
            qr = self.find(name, zone)
            if qr is None:
                raise TpuctlError(ErrorKind.ERROR, f"queued resource {name} disappeared while waiting",
                                  "run the same command again")
            st = self.state(qr)
            if st == "FAILED":
                why = qr.state.failed_data.error.message if qr.state.failed_data else ""
                raise TpuctlError(ErrorKind.CAPACITY, f"the request for {spec.tpu_type} in {zone} FAILED"
                                  + (f": {why}" if why else " (not met in time)"),
                                  "try other zones (--zone), a longer --valid-until, or later", Scope.ZONE)
            if st in ("SUSPENDED", "SUSPENDING"):
                raise TpuctlError(ErrorKind.PREEMPTED, f"queued resource {name} was preempted ({st})",
                                  f"run `tpuctl up -c {spec.name}` again to ask for it anew")
            elapsed = int(time.monotonic() - started)
            return st == "ACTIVE", f"{st} {elapsed // 60}m{elapsed % 60:02d}s" if st in _PENDING else st
        wait(poll, f"queued resource {name}", deadline, progress)
        for node in spec.node_names:
            self.nodes.wait_state(node, zone, {"READY"}, 1800.0, progress)

    def _lost_slice(self, spec: ClusterSpec, zone: str) -> str:
        """An ACTIVE request one of whose nodes is gone or preempted: which, else ""."""
        node, state = slices.worst(slices.states(self.nodes, spec, zone))
        return f"{node} {state}" if state in slices.LOST else ""

    def delete(self, spec: ClusterSpec, zone: str, progress: Progress) -> None:
        """Delete the request with force (its node with it) and wait until both are gone."""
        name = spec.qr_name
        qr = self.find(name, zone)
        if qr is None:
            return
        require_owned(self.labels(qr), spec.name, f"queued resource {name} in {zone}")
        progress("deleting request")
        if self.state(qr) != "DELETING":
            try:
                op = call(self.client.delete_queued_resource, request={"name": self.path(name, zone), "force": True},
                          what=f"delete queued resource {name}")
                self.nodes.wait_operation(op, f"delete queued resource {name}", DELETE_DEADLINE, progress)
            except TpuctlError as e:
                if e.kind is not ErrorKind.NOT_FOUND:
                    raise

        def gone() -> tuple[bool, str]:
            left = self.find(name, zone)
            return left is None, "deleted" if left is None else self.state(left)
        wait(gone, f"queued resource {name}", DELETE_DEADLINE, progress)

