"""GcpProvider: the Provider contract (../base.py) over the TPU, Compute and Storage APIs.

Two topologies, both owned here: `--arch vm`, a TPU VM that runs the job itself (tpu v2 API), and `--arch node`,
a legacy TPU Node (tpu v1) with a companion Compute Engine VM that runs the job against grpc://IP:8470.
"""
from __future__ import annotations

import json
import secrets
import time

from ...core import layout, runs
from ...core.background import Background
from ...core.catalog import region_of, tpu_type
from ...core.errors import ErrorKind, Scope, TpuctlError
from ...core.models import (LABEL, Arch, ClusterSpec, ClusterState, Framework, Grant, HostFacts, Phase, ProviderName,
                            cluster_record, default_bucket, require_owned)
from ..base import Compute, Created, Enforcement, Placement, PlanRow, Price, Progress, Reporter, UpFlags, progress_of
from . import clients, compute, permissions, planning, storage, teardown
from .gcs_store import GcsStore
from .iam import BucketIam
from .operations import call
from .queued import QueuedApi
from .startup import render
from .tpu import TpuApi, facts, pick_base_runtime, pick_runtime, pick_tf_version


class GcpProvider:
    name = ProviderName.GCP
    store_noun = "bucket"

    def __init__(self) -> None:
        self.grants = BucketIam()
        self.inventory = self
        self.nonce = secrets.token_hex(4)   # labels what this process creates (TpuApi.create)
        self._checked: dict[str, list[str]] = {}   # project -> permission warnings, asked once per process

    # -- planning (offline) ------------------------------------------------------------------------------
    def make_spec(self, name: str, flags: UpFlags) -> ClusterSpec:
        return planning.make_spec(name, flags)

    def plan(self, spec: ClusterSpec) -> list[PlanRow]:
        return planning.plan(spec)

    def price(self, spec: ClusterSpec) -> Price:
        return planning.price(spec)

    def placements(self, spec: ClusterSpec) -> list[Placement]:
        return [Placement(z, region_of(z)) for z in spec.zones]

    # -- making and removing -----------------------------------------------------------------------------
    def preflight(self, spec: ClusterSpec) -> list[str]:
        clients.preflight()
        if spec.project not in self._checked:   # the CLI asks before its prompt, `up` again: ask Google once
            self._checked[spec.project] = permissions.check(spec)
            return self._checked[spec.project]
        return []

    def ensure_store(self, spec: ClusterSpec, region: str, progress: Progress) -> bool:
        return storage.ensure(spec.project, spec, planning.bucket_of(spec), region, self.nonce, progress)

    def delete_store(self, st: ClusterState, progress: Progress) -> None:
        storage.delete(st.spec.project, planning.bucket_of(st.spec), st.name, progress)

    def choose_runtime(self, spec: ClusterSpec, placement: Placement) -> str:
        if spec.runtime:
            return spec.runtime
        t = tpu_type(spec.tpu_type)
        versions = self._tpu(spec).versions(placement.zone)
        if spec.arch is Arch.NODE:
            chosen = pick_tf_version(versions)
        elif spec.framework is Framework.TENSORFLOW:
            chosen = pick_runtime(versions, t.family, t.multi_host)
        else:
            chosen = pick_base_runtime(versions, t.family)
        if not chosen:
            raise TpuctlError(ErrorKind.INPUT, f"no {spec.framework.value} runtime for {spec.tpu_type} in "
                              f"{placement.zone} (offered: {', '.join(versions[:6]) or 'none'})",
                              "pass --runtime VERSION", Scope.ZONE)
        return chosen

    def ensure_compute(self, st: ClusterState, reporter: Reporter) -> Compute:
        if st.spec.arch is Arch.VM:
            script = render(st.spec.store, st.name, "tpu-vm", st.spec.tpu_type, "local")
            created, tpu_facts = self._ensure_tpu(st, script, progress_of(reporter, "tpu", st.spec.tpu_name))
            return Compute([self._created_tpu(st, reporter)] if created else [], tpu_facts)
        return self._ensure_node_and_vm(st, reporter)

    def _ensure_node_and_vm(self, st: ClusterState, reporter: Reporter) -> Compute:
        """TPU Node and companion VM at once; if either fails, the other is removed before the error goes up."""
        spec = st.spec
        script = render(spec.store, spec.name, "node-vm", spec.tpu_type, "", st.runtime)
        vm = Background(lambda: self._ensure_vm(st, script, progress_of(reporter, "vm", spec.vm_name)))
        made: list[Created] = []
        tpu_facts = HostFacts()
        errors: list[TpuctlError] = []
        try:
            created, tpu_facts = self._ensure_tpu(st, "", progress_of(reporter, "tpu", spec.tpu_name))
            if created:
                made.append(self._created_tpu(st, reporter))
        except TpuctlError as e:
            errors.append(e)
        try:
            if vm.result():
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
        if spec.queued:
            QueuedApi(spec.project).delete(spec, zone, progress_of(reporter, "queued", spec.qr_name))
        self._tpu(spec).delete(spec.tpu_name, zone, spec.name, progress)

    def _ensure_tpu(self, st: ClusterState, script: str, progress: Progress) -> tuple[bool, HostFacts]:
        spec, zone = st.spec, st.zone
        api = self._tpu(spec)
        sa = spec.service_account or (self.grants.default_service_account(spec.project) if spec.arch is Arch.VM
                                      else "")
        if spec.queued:
            created = QueuedApi(spec.project).request(spec, zone, st.runtime, script, sa, self.nonce, progress)
            return created, facts(api.get(spec.tpu_name, zone))
        node = api.find(spec.tpu_name, zone)
        if node is not None:
            require_owned(node.labels, spec.name, f"TPU {spec.tpu_name} in {zone}")
            state = api.state(node)
            if state in ("PREEMPTED", "TERMINATED"):
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
                api.wait_state(spec.tpu_name, zone, {"READY"}, 1800, progress)
                return False, facts(api.get(spec.tpu_name, zone))
        created = api.create(spec, zone, st.runtime, script, sa, self.nonce, progress)
        return created, facts(api.get(spec.tpu_name, zone))

    def _ensure_vm(self, st: ClusterState, script: str, progress: Progress) -> bool:
        spec = st.spec
        vm = compute.find(spec.project, spec.vm_name, st.zone)
        if vm is not None:
            require_owned(vm.labels, spec.name, f"VM {spec.vm_name} in {st.zone}")
            progress(vm.status)
            return False
        return compute.create(spec.project, spec, st.zone, script, self.nonce, progress)

    def _delete_vm(self, spec: ClusterSpec, zone: str, progress: Progress) -> None:
        compute.delete(spec.project, spec.vm_name, zone, spec.name, progress)

    def delete_compute(self, st: ClusterState, reporter: Reporter) -> None:
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

    def write_cluster_record(self, st: ClusterState, confirmed: bool) -> None:
        """What the agent on the host needs (the node VM reads the TPU's address, and waits while it is empty),
        and, ahead of creation (the hosts install it at boot), the agent package."""
        from .. import agent_package
        if st.spec.arch is Arch.VM:
            address = "local"   # the job runs on the TPU host itself
        else:
            address = f"grpc://{st.host.ip}:8470" if st.host.ip and confirmed else ""
        b = clients.storage(st.spec.project).bucket(planning.bucket_of(st.spec))
        record = cluster_record(st, address, teardown="gcp", delete=teardown.targets(st))
        call(b.blob(layout.CLUSTER_RECORD).upload_from_string, json.dumps(record, indent=2),
             content_type="application/json", what="write cluster record")
        if not confirmed:
            call(b.blob(agent_package.key()).upload_from_string, agent_package.build(),
                 content_type="application/gzip", what="upload the agent package")

    # -- using -------------------------------------------------------------------------------------------
    def _tpu(self, spec: ClusterSpec) -> TpuApi:
        return TpuApi(spec.project, spec.arch)

    def store(self, st: ClusterState) -> GcsStore:
        return GcsStore(st.spec.store, st.spec.project)

    def _tpu_state(self, st: ClusterState) -> str:
        """The cluster's TPU state as the API reports it now; MISSING when there is none."""
        node = self._tpu(st.spec).find(st.spec.tpu_name, st.zone) if st.zone else None
        return self._tpu(st.spec).state(node) if node is not None else "MISSING"

    def check_ready(self, st: ClusterState) -> None:
        state = self._tpu_state(st)
        if state != "READY":
            raise TpuctlError(ErrorKind.PREEMPTED if state in ("PREEMPTED", "TERMINATED") else ErrorKind.NOT_FOUND,
                              f"the TPU of cluster {st.name} is {state}",
                              f"run `tpuctl up -c {st.name} ...` again to (re)create it")

    def location(self, st: ClusterState) -> str:
        return f"{st.spec.tpu_type} in {st.zone}"

    def host_state(self, st: ClusterState) -> tuple[bool, str]:
        state = self._tpu_state(st)
        if state in ("CREATING", "STARTING", "RESTARTING", "REPAIRING"):
            return True, f"the TPU is {state}: its host will resume the run once it has booted"
        boot = "; ".join(f"{h}: {line}" for h, line in self._boot_logs(st).items())
        if state == "READY":
            return True, "the TPU is READY but its agent is silent" + (f" (boot log: {boot})" if boot else "")
        return False, f"the TPU is {state}" + (f" (last boot log lines: {boot})" if boot else "")

    def problem(self, st: ClusterState) -> tuple[str, str] | None:
        state = self._tpu_state(st)
        again = f"tpuctl up -c {st.name}"
        if state in ("CREATING", "STARTING", "RESTARTING", "REPAIRING"):
            return (f"the TPU is {state}; runs start once its hosts have booted",
                    f"wait, or watch: tpuctl status -c {st.name}")
        if state != "READY":
            return f"the TPU is {state}: submitted runs wait and running ones resume once it is back", again
        beats = {who: age for who, (age, _) in self._beats(st).items()}
        if not beats:
            boot = "; ".join(f"{h}: {line}" for h, line in self._boot_logs(st).items())
            return ("the TPU is READY but no agent has reported yet" + (f" (boot log: {boot})" if boot else ""),
                    f"look at the host: tpuctl ssh -c {st.name} -- sudo journalctl -u tpuctl-agent")
        silent = sorted(w for w, age in beats.items() if age > runs.stale_seconds())
        if silent:
            return (f"agent {', '.join(silent)} silent for over {runs.stale_seconds():.0f}s",
                    f"tpuctl ssh -c {st.name} -- sudo systemctl restart tpuctl-agent")
        return None

    def enforcement(self, st: ClusterState) -> Enforcement:
        return teardown.enforcement(self.store(st), st)

    def ssh_argv(self, st: ClusterState, worker: int, command: str) -> list[str]:
        """gcloud's own ssh, which manages keys (OS Login or metadata) and IAP: `gcloud compute tpus tpu-vm ssh TPU
        --zone Z --project P --worker N [--command CMD]` (cloud.google.com/sdk/gcloud/reference/compute/tpus/tpu-vm/
        ssh); beside a legacy node, `gcloud compute ssh VM` (the node itself has no shell)."""
        s = st.spec
        if not st.zone:
            raise TpuctlError(ErrorKind.NOT_FOUND, f"cluster {st.name} has no host yet", f"tpuctl up -c {st.name}")
        where = [f"--zone={st.zone}", f"--project={s.project}"]
        if s.arch is Arch.NODE:
            argv = ["gcloud", "compute", "ssh", s.vm_name, *where]
        else:
            argv = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", s.tpu_name, *where, f"--worker={worker}"]
        return argv + ([f"--command={command}"] if command else [])

    def summary(self, st: ClusterState) -> dict[str, object]:
        s = st.spec
        return {"project": s.project, "type": s.tpu_type, "arch": s.arch.value, "zone": st.zone, "runtime": st.runtime,
                "framework": s.framework.value, "workers": st.host.hosts, "spot": s.spot}

    def teardown_list(self, st: ClusterState) -> list[str]:
        return ([f"queued resource {st.spec.qr_name}"] if st.spec.queued else []) + [f"TPU {st.spec.tpu_name}"] \
            + ([f"VM {st.spec.vm_name}"] if st.spec.arch is Arch.NODE else [])

    def describe(self, st: ClusterState) -> dict[str, dict[str, object]]:
        spec = st.spec
        out: dict[str, dict[str, object]] = {}
        if st.zone and spec.queued:
            qr = QueuedApi(spec.project).find(spec.qr_name, st.zone)
            out["queued"] = {"state": QueuedApi.state(qr) if qr else "MISSING"}
        if st.zone:
            node = self._tpu(spec).find(spec.tpu_name, st.zone)
            if node is None:
                out["tpu"] = {"state": "MISSING"}
            else:
                f = facts(node)
                out["tpu"] = {"ip": f.ip, "service_account": f.service_account, "hosts": f.hosts,
                              "state": self._tpu(spec).state(node), "health": type(node).Health(node.health).name}
            if spec.arch is Arch.NODE:
                vm = compute.find(spec.project, spec.vm_name, st.zone)
                out["vm"] = {"state": vm.status if vm else "MISSING"}
        b = storage.find(spec.project, planning.bucket_of(spec))
        out["bucket"] = {"state": "READY" if b else "MISSING", "location": (b.location or "").lower() if b else ""}
        if b is not None:
            out["boot_logs"] = self._boot_logs(st)
            out["workers"] = self._workers(st)
        return out

    def _workers(self, st: ClusterState) -> dict[str, object]:
        """Each agent's last heartbeat: its role (a TensorFlow slice's workers > 0 serve the TPU runtime) and age."""
        found: dict[str, object] = {}
        for who, (age, role) in self._beats(st).items():
            found[who] = f"{role}, heartbeat {age:.0f}s ago" + (" (STALE)" if age > runs.stale_seconds() else "")
        return found

    def _beats(self, st: ClusterState) -> dict[str, tuple[float, str]]:
        """'wN host' -> (seconds since its agent's last heartbeat, its role)."""
        return {f"w{beat.get('worker', '?')} {beat.get('host', '')}":
                (time.time() - float(beat.get("time", 0)), str(beat.get("role", "agent")))
                for beat in runs.heartbeats(self.store(st))}

    def _boot_logs(self, st: ClusterState) -> dict[str, object]:
        """The last line each host's start-up script wrote into the store: how a failed boot becomes visible."""
        store = self.store(st)
        logs: dict[str, object] = {}
        for key, _ in store.list(layout.BOOT_PREFIX):
            lines = (store.read(key) or b"").decode(errors="replace").strip().splitlines()
            logs[key[len(layout.BOOT_PREFIX):].removesuffix(".log")] = lines[-1] if lines else ""
        return logs

    # -- inventory ---------------------------------------------------------------------------------------
    def state_from(self, name: str, project: str, found: list[dict[str, str]]) -> ClusterState:
        tpu = next((n for n in found if n["kind"] == "tpu"), None) or next(
            (n for n in found if n["kind"] == "queued"), None)
        vm = next((n for n in found if n["kind"] == "vm"), None)
        bucket = next((n for n in found if n["kind"] == "bucket"), None)
        arch = Arch.NODE if (tpu and tpu["arch"] == "node") or vm else Arch.VM
        zone = (tpu or vm or {"zone": ""})["zone"]
        spec = ClusterSpec(name=name, provider=ProviderName.GCP, project=project,
                           store=f"gs://{bucket['name'] if bucket else default_bucket(project, name)}",
                           tpu_type=tpu["type"] if tpu else "", zones=[zone] if zone else [], arch=arch,
                           queued=any(n["kind"] == "queued" for n in found))
        st = ClusterState(spec=spec, zone=zone, phase=Phase.READY, created_at=time.time())
        record = runs.read_object(self.store(st), layout.CLUSTER_RECORD) if bucket else {}
        st.grants = [Grant(str(g["member"]), str(g["role"])) for g in record.get("grants") or []]
        return st

    def list_labelled(self, project: str) -> list[dict[str, str]]:
        out, seen = [], set()
        for arch in Arch:
            for n in TpuApi(project, arch).list_labelled():
                parts = n.name.split("/")
                if (parts[3], parts[-1]) in seen:   # both API versions may list the same node
                    continue
                seen.add((parts[3], parts[-1]))
                out.append({"cluster": n.labels[LABEL], "kind": "tpu", "name": parts[-1], "zone": parts[3],
                            "arch": arch.value, "type": n.accelerator_type, "state": type(n).State(n.state).name})
        for q in QueuedApi(project).list_labelled():
            parts = q.name.split("/")
            out.append({"cluster": QueuedApi.labels(q)[LABEL], "kind": "queued", "name": parts[-1], "zone": parts[3],
                        "arch": "vm", "type": q.tpu.node_spec[0].node.accelerator_type, "state": QueuedApi.state(q)})
        for zone, vm in compute.list_labelled(project):
            out.append({"cluster": vm.labels[LABEL], "kind": "vm", "name": vm.name, "zone": zone, "arch": "node",
                        "type": vm.machine_type.rsplit("/", 1)[-1], "state": vm.status})
        for b in storage.list_labelled(project):
            out.append({"cluster": b.labels[LABEL], "kind": "bucket", "name": b.name,
                        "zone": (b.location or "").lower(), "arch": "", "type": "", "state": "READY"})
        return out
