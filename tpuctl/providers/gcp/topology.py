"""The cluster's compute in one zone, made, adopted and removed: a TPU VM (tpu v2), a queued request for one, or
a legacy TPU Node (tpu v1) with its companion Compute Engine VM, made at once and removed together when either
fails. The Provider contract's rules (../base.py) hold: what is adopted carries the cluster's label, a failed
placement leaves nothing behind, and each creation comes with its undo."""
from __future__ import annotations

from typing import Any, Callable

from ...core.background import Background
from ...core.errors import TpuctlError
from ...core.models import Arch, ClusterSpec, ClusterState, HostFacts, require_owned
from ..base import Compute, Created, Progress, Reporter, progress_of
from ..google import vms
from ..google.iam import BucketIam
from .compute import gce
from .startup import render
from .tpuapi.queued import QueuedApi
from .tpuapi.tpu import LOST, TpuApi, facts


class Topology:
    def __init__(self, grants: BucketIam, nonce: str) -> None:
        self.grants, self.nonce = grants, nonce   # the nonce labels what this process creates (TpuApi.create)

    @staticmethod
    def tpu(spec: ClusterSpec) -> Any:
        """The API the cluster's TPU lives in: the Cloud TPU API's nodes, or Compute Engine's VMs and MIGs read as
        nodes (gce.ComputeTpus, the same find/state/get surface)."""
        return gce.ComputeTpus(spec.project) if spec.api else TpuApi(spec.project, spec.arch)

    def ensure(self, st: ClusterState, reporter: Reporter) -> Compute:
        if st.spec.api:
            script = render(st.spec.store, st.name, "tpu-vm", st.spec.tpu_type, "local")
            created, tpu_facts = self._ensure_gce(st, script, progress_of(reporter, "tpu", st.spec.tpu_name))
            return Compute([self._created_tpu(st, reporter)] if created else [], tpu_facts)
        if st.spec.arch is Arch.VM:
            script = render(st.spec.store, st.name, "tpu-vm", st.spec.tpu_type, "local")
            created, tpu_facts = self._ensure_tpu(st, script, progress_of(reporter, "tpu", st.spec.tpu_name))
            return Compute([self._created_tpu(st, reporter)] if created else [], tpu_facts)
        return self._ensure_node_and_vm(st, reporter)

    def _ensure_node_and_vm(self, st: ClusterState, reporter: Reporter) -> Compute:
        """TPU Node and companion VM at once: the VM is asked for as soon as Google has accepted the node (its create
        answered with an operation, or the node is there already), so a denied node (Google refuses new TPU Nodes to
        most projects: FAILED_PRECONDITION, skypilot-org/skypilot#5593) makes no VM and spends no CPU quota. If either
        fails, the other is removed before the error goes up."""
        spec = st.spec
        script = render(spec.store, spec.name, "node-vm", spec.tpu_type, "", st.runtime)
        vm: list[Background[bool]] = []

        def start_vm() -> None:
            if not vm:
                vm.append(Background(lambda: self._ensure_vm(st, script, progress_of(reporter, "vm", spec.vm_name))))
        made: list[Created] = []
        tpu_facts = HostFacts()
        errors: list[TpuctlError] = []
        try:
            created, tpu_facts = self._ensure_tpu(st, "", progress_of(reporter, "tpu", spec.tpu_name), start_vm)
            if created:
                made.append(self._created_tpu(st, reporter))
        except TpuctlError as e:
            errors.append(e)
        try:
            if vm and vm[0].result():
                zone = st.zone
                made.append(Created("vm", spec.vm_name, lambda: self._delete_vm(
                    spec, zone, progress_of(reporter, "vm", spec.vm_name))))
        except TpuctlError as e:
            errors.append(e)
        if errors:
            for c in reversed(made):
                c.undo()
            raise errors[0]
        return Compute(made, tpu_facts)

    def _created_tpu(self, st: ClusterState, reporter: Reporter) -> Created:
        zone = st.zone   # the undo removes the TPU made in THIS zone, even after failover moved st.zone on
        return Created("tpu", st.spec.tpu_name, lambda: self._delete_tpu(st.spec, zone, reporter))

    def _delete_tpu(self, spec: ClusterSpec, zone: str, reporter: Reporter) -> None:
        """The TPU, and first its queued request (with force: its node goes with it) when it was queued."""
        progress = progress_of(reporter, "tpu", spec.tpu_name)
        if spec.api:
            gce.ComputeTpus(spec.project).delete(spec, zone, progress)
            return
        if spec.queued:
            QueuedApi(spec.project).delete(spec, zone, progress_of(reporter, "queued", spec.qr_name))
        for name in spec.node_names:   # gone with a queued request; one left behind is deleted here
            self.tpu(spec).delete(name, zone, spec.name, progress if name == spec.tpu_name else
                                  progress_of(reporter, "tpu", name))

    def _ensure_tpu(self, st: ClusterState, script: str, progress: Progress,
                    accepted: Callable[[], None] = lambda: None) -> tuple[bool, HostFacts]:
        spec, zone = st.spec, st.zone
        api = self.tpu(spec)
        sa = spec.service_account or (self.grants.default_service_account(spec.project) if spec.arch is Arch.VM
                                      else "")
        if spec.queued:
            created = QueuedApi(spec.project).request(spec, zone, st.runtime, script, sa, self.nonce, progress)
            return created, facts(api.get(spec.node_names[0], zone))   # slice 0: its worker 0 coordinates
        node = api.find(spec.tpu_name, zone)
        if node is not None:
            require_owned(node.labels, spec.name, f"TPU {spec.tpu_name} in {zone}")
            state = api.state(node)
            if state in LOST:
                progress(f"{state}, recreating")
                api.delete(spec.tpu_name, zone, spec.name, progress)
                node = None
            elif state == "DELETING":
                api.wait_state(spec.tpu_name, zone, set(), 900, progress, gone_ok=True)
                node = None
            elif state in ("STOPPED", "STOPPING"):
                if state == "STOPPING":
                    api.wait_state(spec.tpu_name, zone, {"STOPPED"}, 900, progress)
                api.start(spec.tpu_name, zone, progress)
            if node is not None:
                accepted()
                api.wait_state(spec.tpu_name, zone, {"READY"}, 1800, progress)
                return False, facts(api.get(spec.tpu_name, zone))
        created = api.create(spec, zone, st.runtime, script, sa, self.nonce, progress, accepted)
        return created, facts(api.get(spec.tpu_name, zone))

    def _ensure_gce(self, st: ClusterState, script: str, progress: Progress) -> tuple[bool, HostFacts]:
        """Adopt the cluster's slices where all are there and not lost; else remove what is left of them (a lost
        slice, a MIG half made by an interrupted `up`) and make them all again, as a Multislice is asked for whole."""
        spec, zone = st.spec, st.zone
        api = gce.ComputeTpus(spec.project)
        found = {name: api.find(name, zone) for name in spec.node_names}
        for name, s in found.items():
            if s is not None:
                require_owned(s.labels, spec.name, f"TPU {name} in {zone}")
        have = [s for s in found.values() if s is not None]
        if have and len(have) == len(found) and not any(s.state in LOST | {"MISSING"} for s in have):
            api.wait_ready(spec, zone, progress)
            return False, facts(api.get(spec.node_names[0], zone))
        if have:
            progress("recreating: " + ", ".join(f"{s.name} {s.state}" for s in have) if len(have) == len(found)
                     else "recreating: part of it is missing")
        api.delete(spec, zone, progress)   # also what an interrupted `up` left without a MIG (templates, policy)
        sa = spec.service_account or self.grants.default_service_account(spec.project)
        created = api.create(spec, zone, script, sa, self.nonce, progress)
        return created, facts(api.get(spec.node_names[0], zone))

    def _ensure_vm(self, st: ClusterState, script: str, progress: Progress) -> bool:
        spec = st.spec
        vm = vms.find(spec.project, spec.vm_name, st.zone)
        if vm is not None:
            require_owned(vm.labels, spec.name, f"VM {spec.vm_name} in {st.zone}")
            progress(vm.status)
            return False
        return vms.create(spec.project, spec, st.zone, script, self.nonce, progress)

    def _delete_vm(self, spec: ClusterSpec, zone: str, progress: Progress) -> None:
        vms.delete(spec.project, spec.vm_name, zone, spec.name, progress)

    def delete(self, st: ClusterState, reporter: Reporter) -> None:
        if not st.zone:
            return   # `up` never got as far as a zone: nothing was created
        spec = st.spec
        work = [Background(lambda: self._delete_tpu(spec, st.zone, reporter))]
        if spec.arch is Arch.NODE:
            work.append(Background(lambda: self._delete_vm(spec, st.zone, progress_of(reporter, "vm", spec.vm_name))))
        errors = []
        for w in work:
            try:
                w.result()
            except TpuctlError as e:
                errors.append(e)
        if errors:
            raise errors[0]
