"""GcpProvider: the Provider contract (../base.py) over the TPU, Compute and Storage APIs."""
from __future__ import annotations

import json

from ...errors import TpuctlError
from ...models import LABEL, ClusterSpec, ClusterState, Grant
from . import clients, compute, iam, storage
from .operations import call
from .tpu import TpuApi, facts, pick_runtime, pick_tf_version


class GcpProvider:
    name = "gcp"

    def __init__(self, project: str):
        self.project = project
        self._default_sa = None
        clients.preflight()

    def _tpu(self, arch: str) -> TpuApi:
        return TpuApi(self.project, arch)

    def default_service_account(self) -> str:
        if self._default_sa is None:
            self._default_sa = compute.default_service_account(self.project)
        return self._default_sa

    def runtime_for(self, spec: ClusterSpec, zone: str) -> str:
        if spec.runtime:
            return spec.runtime
        from ...catalog import tpu_type
        t = tpu_type(spec.tpu_type)
        api = self._tpu(spec.arch)
        versions = api.versions(zone)
        chosen = pick_runtime(versions, t.family, t.multi_host) if spec.arch == "vm" else pick_tf_version(versions)
        if not chosen:
            raise TpuctlError("input", f"no TensorFlow runtime for {spec.tpu_type} in {zone} "
                              f"(offered: {', '.join(versions[:6]) or 'none'})", "pass --runtime VERSION")
        return chosen

    def workload_accounts(self, spec: ClusterSpec) -> list[str]:
        return [spec.service_account or self.default_service_account()]

    def ensure_bucket(self, spec, bucket, region, progress) -> bool:
        return storage.ensure(self.project, spec, bucket, region, progress)

    def delete_bucket(self, bucket: str, cluster: str, progress) -> None:
        storage.delete(self.project, bucket, cluster, progress)

    def grant(self, bucket: str, accounts: list[str]) -> list[Grant]:
        return iam.grant(self.project, bucket, accounts)

    def revoke(self, bucket: str, grants: list[Grant]) -> None:
        iam.revoke(self.project, bucket, grants)

    def write_cluster_record(self, bucket: str, record: dict) -> None:
        """tpuctl/cluster.json in the store: what the agent on the host needs (the node VM reads the TPU's IP),
        and the agent package the host's startup script installs."""
        from ... import agent_package
        b = clients.storage(self.project).bucket(bucket)
        call(b.blob("tpuctl/cluster.json").upload_from_string, json.dumps(record, indent=2),
             content_type="application/json", what="write cluster record")
        call(b.blob(agent_package.key()).upload_from_string, agent_package.build(),
             content_type="application/gzip", what="upload the agent package")

    def store(self, st: ClusterState):
        from .gcs_store import GcsStore
        return GcsStore(st.store_uri, self.project)

    def check_ready(self, st: ClusterState) -> None:
        node = self._tpu(st.arch).find(st.tpu_name, st.zone) if st.zone else None
        state = self._tpu(st.arch).state(node) if node else "MISSING"
        if state != "READY":
            raise TpuctlError("preempted" if state in ("PREEMPTED", "TERMINATED") else "not_found",
                              f"the TPU of cluster {st.name} is {state}",
                              f"run `tpuctl up -c {st.name} ...` again to (re)create it")

    def ensure_tpu(self, spec: ClusterSpec, zone: str, runtime: str, script: str, progress) -> tuple[bool, dict]:
        api = self._tpu(spec.arch)
        node = api.find(spec.tpu_name, zone)
        if node is not None:
            if node.labels.get(LABEL) != spec.name:
                raise TpuctlError("input", f"a TPU named {spec.tpu_name} already exists in {zone} without the "
                                  f"label {LABEL}={spec.name}", "pick another cluster name with -c")
            st = api.state(node)
            if st in ("PREEMPTED", "TERMINATED"):
                progress(f"{st}, recreating")
                api.delete(spec.tpu_name, zone, spec.name, progress)
                node = None
            elif st == "DELETING":
                api.wait_state(spec.tpu_name, zone, set(), 900, progress, gone_ok=True)
                node = None
            elif st in ("STOPPED", "STOPPING"):
                if st == "STOPPING":
                    api.wait_state(spec.tpu_name, zone, {"STOPPED"}, 900, progress)
                api.start(spec.tpu_name, zone, progress)
            if node is not None:
                api.wait_state(spec.tpu_name, zone, {"READY"}, 1800, progress)
                return False, facts(api.find(spec.tpu_name, zone))
        sa = spec.service_account or (self.default_service_account() if spec.arch == "vm" else "")
        api.create(spec, zone, runtime, script, sa, progress)
        return True, facts(api.find(spec.tpu_name, zone))

    def delete_tpu(self, st: ClusterState, progress) -> None:
        if st.zone:
            self._tpu(st.arch).delete(st.tpu_name, st.zone, st.name, progress)

    def ensure_vm(self, spec: ClusterSpec, zone: str, script: str, progress) -> bool:
        vm = compute.find(self.project, spec.vm_name, zone)
        if vm is not None:
            if vm.labels.get(LABEL) != spec.name:
                raise TpuctlError("input", f"a VM named {spec.vm_name} already exists in {zone} without the "
                                  f"label {LABEL}={spec.name}", "pick another cluster name with -c")
            progress(vm.status)
            return False
        compute.create(self.project, spec, zone, script, progress)
        return True

    def delete_vm(self, st: ClusterState, progress) -> None:
        if st.zone and st.vm_name:
            compute.delete(self.project, st.vm_name, st.zone, st.name, progress)

    def describe(self, st: ClusterState) -> dict:
        out = {}
        if st.zone:
            node = self._tpu(st.arch).find(st.tpu_name, st.zone)
            out["tpu"] = facts(node) if node else {"state": "MISSING"}
            if node is not None:
                out["tpu"]["health"] = type(node).Health(node.health).name
        if st.vm_name and st.zone:
            vm = compute.find(self.project, st.vm_name, st.zone)
            out["vm"] = {"state": vm.status if vm else "MISSING"}
        if st.bucket:
            b = storage.find(self.project, st.bucket)
            out["bucket"] = {"state": "READY" if b else "MISSING", "location": (b.location or "").lower() if b else ""}
            if b is not None:
                out["boot_logs"] = self._boot_logs(st.bucket)
        return out

    def _boot_logs(self, bucket: str) -> dict:
        """The last line each host's startup script wrote into the store: how a failed boot becomes visible."""
        client = clients.storage(self.project)
        logs = {}
        for blob in call(lambda: list(client.list_blobs(bucket, prefix="tpuctl/boot/")), what="list boot logs"):
            lines = call(blob.download_as_text, what="read boot log").strip().splitlines()
            logs[blob.name.rsplit("/", 1)[-1].removesuffix(".log")] = lines[-1] if lines else ""
        return logs

    def list_labelled(self) -> list[dict]:
        out, seen = [], set()
        for arch in ("vm", "node"):
            for n in self._tpu(arch).list_labelled():
                parts = n.name.split("/")
                if (parts[3], parts[-1]) in seen:   # both API versions may list the same node
                    continue
                seen.add((parts[3], parts[-1]))
                out.append({"cluster": n.labels[LABEL], "name": parts[-1], "zone": parts[3], "arch": arch,
                            "type": n.accelerator_type, "state": type(n).State(n.state).name})
        return out
