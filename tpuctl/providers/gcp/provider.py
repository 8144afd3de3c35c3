"""GcpProvider: the Provider contract (../base.py) over the TPU, Compute and Storage APIs.

Two topologies: `--arch vm`, a TPU VM that runs the job itself (tpu v2 API), and `--arch node`, a legacy TPU Node
(tpu v1) with a companion Compute Engine VM that runs the job against grpc://IP:8470. What `up` asks for is
planning.py; making and removing the compute, topology.py; how the cluster is doing, health.py; what carries the
cluster's label, inventory.py; the bucket, storage.py and its grants iam.py.
"""
from __future__ import annotations

import secrets

from ...core.catalog import region_of, tpu_type
from ...core.errors import ErrorKind, Scope, TpuctlError
from ...core.models import Arch, ClusterSpec, ClusterState, Framework, ProviderName, cluster_record
from ..base import Compute, Enforcement, Placement, PlanRow, Price, Progress, Reporter, UpFlags, progress_of
from ..google import clients, permissions, storage
from ..google.gcs_store import GcsStore
from ..google.iam import BucketIam
from . import firewall, planning, teardown
from .compute import gce, gce_requests
from .health import Health
from .inventory import GcpInventory
from .topology import Topology
from .watcher_vm import GcpWatcherHost
from .tpuapi.tpu import pick_base_runtime, pick_runtime, pick_tf_base_runtime, pick_tf_version, tensorflow_from


class GcpProvider:
    name = ProviderName.GCP
    store_noun = "bucket"
    remote_runs = None
    self_recovery = ""

    def __init__(self) -> None:
        self.grants = BucketIam()
        self.nonce = secrets.token_hex(4)   # labels what this process creates (TpuApi.create)
        self.topology = Topology(self.grants, self.nonce)
        self.health = Health(self.store)
        self.inventory = GcpInventory(self.store)
        self.watcher_host = GcpWatcherHost(self.grants, self.nonce)
        self._checked: dict[str, list[str]] = {}   # project -> permission warnings, asked once per process

    # -- planning (offline) ------------------------------------------------------------------------------
    def make_spec(self, name: str, flags: UpFlags) -> ClusterSpec:
        return planning.make_spec(name, flags)

    def plan(self, spec: ClusterSpec) -> list[PlanRow]:
        if spec.api:   # --max-duration is read after make_spec: checked here, by `up` and its dry run alike
            gce_requests.check_capacity_flags(spec)
        return planning.plan(spec)

    def price(self, spec: ClusterSpec) -> Price:
        return planning.price(spec)

    def placements(self, spec: ClusterSpec) -> list[Placement]:
        return [Placement(z, region_of(z)) for z in spec.zones]

    # -- making and removing -----------------------------------------------------------------------------
    def preflight(self, spec: ClusterSpec) -> list[str]:
        if spec.api:
            gce_requests.check_capacity_flags(spec)   # --max-duration is known only once the CLI has read it
        clients.preflight()
        firewall.check(spec, tpu_type(spec.tpu_type).hosts)   # read-only; refused before anything is made
        if spec.project not in self._checked:   # the CLI asks before its prompt, `up` again: ask Google once
            warnings = permissions.check(spec, gce_requests.permissions_needed(spec) if spec.api else None)
            if spec.autostop or spec.max_duration:   # refused now rather than found out after the TPU exists
                warnings += permissions.check_self_teardown(spec, self.grants.workload_accounts(spec)[0],
                                                            teardown.needed(spec))
            self._checked[spec.project] = warnings
            return warnings
        return []

    def ensure_store(self, spec: ClusterSpec, region: str, progress: Progress) -> bool:
        return storage.ensure(spec.project, spec, storage.bucket_of(spec), region, self.nonce, progress)

    def delete_store(self, st: ClusterState, progress: Progress) -> None:
        storage.delete(st.spec.project, storage.bucket_of(st.spec), st.name, progress)

    def choose_runtime(self, spec: ClusterSpec, placement: Placement) -> str:
        """The runtime for this zone, asked of the zone before its bucket or grants are made."""
        t = tpu_type(spec.tpu_type)
        if spec.api:   # no TPU runtime: Google's TPU-optimised Ubuntu image family, the agent installs the stack
            return gce_requests.IMAGE_FAMILIES[t.family]
        versions = Topology.tpu(spec).versions(placement.zone)
        if spec.runtime:
            if versions and spec.runtime not in versions:
                raise TpuctlError(ErrorKind.INPUT, f"--runtime {spec.runtime} is not offered in {placement.zone} "
                                  f"(offered: {', '.join(sorted(versions)[:8])}{', ...' if len(versions) > 8 else ''})",
                                  "pass one of those, or leave --runtime out to have one chosen", Scope.ZONE)
            return spec.runtime
        if spec.arch is Arch.NODE:
            chosen = pick_tf_version(versions)
        elif spec.framework is Framework.TENSORFLOW:
            # as Google's TF release tests run it (tpu.TF_BASE_RUNTIMES); a tpu-vm-tf image where the base is not
            # offered
            chosen = pick_tf_base_runtime(versions, t.family) or pick_runtime(versions, t.family, t.multi_host)
        else:
            chosen = pick_base_runtime(versions, t.family)
        if not chosen:
            raise TpuctlError(ErrorKind.INPUT, f"no {spec.framework.value} runtime for {spec.tpu_type} in "
                              f"{placement.zone} (offered: {', '.join(versions[:6]) or 'none'})",
                              "pass --runtime VERSION", Scope.ZONE)
        return chosen

    def ensure_compute(self, st: ClusterState, reporter: Reporter) -> Compute:
        firewall.ensure(st.spec, tpu_type(st.spec.tpu_type).hosts, progress_of(reporter, "firewall", firewall.rule_name(st.spec)))
        return self.topology.ensure(st, reporter)

    def delete_compute(self, st: ClusterState, reporter: Reporter) -> None:
        self.topology.delete(st, reporter)
        firewall.delete(st.spec, progress_of(reporter, "firewall", firewall.rule_name(st.spec)))

    def write_cluster_record(self, st: ClusterState, confirmed: bool) -> None:
        """What the agent on the host needs (the node VM reads the TPU's address, and waits while it is empty),
        and, ahead of creation (the hosts install it at boot), the agent package."""
        if st.spec.arch is Arch.VM:
            address = "local"   # the job runs on the TPU host itself
        else:
            address = f"grpc://{st.host.ip}:8470" if st.host.ip and confirmed else ""
        record = cluster_record(st, address, teardown="gcp", delete=teardown.targets(st))
        record["api"] = st.spec.api or "tpu"   # the host gives JAX its cluster itself on Compute Engine (jaxcluster)
        if st.spec.arch is Arch.VM and st.spec.framework is Framework.TENSORFLOW:
            record["tensorflow_from"] = tensorflow_from(st.runtime)
        storage.write_record(st.spec.project, storage.bucket_of(st.spec), record, with_agent=not confirmed)

    # -- using -------------------------------------------------------------------------------------------
    def store(self, st: ClusterState) -> GcsStore:
        return GcsStore(st.spec.store, st.spec.project)

    def revive(self, st: ClusterState, reporter: Reporter) -> ClusterState:
        return st   # the hosts' systemd restarts their agents; a lost TPU is `up`'s or the watcher's

    def check_ready(self, st: ClusterState) -> None:
        self.health.check_ready(st)

    def host_state(self, st: ClusterState) -> tuple[bool, str]:
        return self.health.host_state(st)

    def problem(self, st: ClusterState) -> tuple[str, str] | None:
        return self.health.problem(st)

    def compute_lost(self, st: ClusterState) -> str | None:
        return self.health.compute_lost(st)

    def describe(self, st: ClusterState) -> dict[str, dict[str, object]]:
        return self.health.describe(st)

    def location(self, st: ClusterState) -> str:
        return f"{st.spec.tpu_type} in {st.zone}"

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
        if s.api:   # a Compute Engine VM: the slice's VMs in worker order (gce.worker_of: Google's TPU_WORKER_ID)
            argv = ["gcloud", "compute", "ssh", self._vm_of_worker(st, worker), *where]
        elif s.arch is Arch.NODE:
            argv = ["gcloud", "compute", "ssh", s.vm_name, *where]
        else:
            argv = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", s.tpu_name, *where, f"--worker={worker}"]
        return argv + ([f"--command={command}"] if command else [])

    @staticmethod
    def _vm_of_worker(st: ClusterState, worker: int) -> str:
        hosts = max(1, st.host.hosts)
        node = st.spec.node_names[min(worker // hosts, len(st.spec.node_names) - 1)]
        found = gce.ComputeTpus(st.spec.project).find(node, st.zone)
        vms = list(found.instances) if found else []
        if not vms:
            raise TpuctlError(ErrorKind.NOT_FOUND, f"cluster {st.name} has no VM for worker {worker}",
                              f"tpuctl status -c {st.name}")
        return vms[min(worker % hosts, len(vms) - 1)]

    def summary(self, st: ClusterState) -> dict[str, object]:
        s = st.spec
        return {"project": s.project, "type": s.tpu_type, "arch": s.arch.value, "zone": st.zone, "runtime": st.runtime,
                "framework": s.framework.value, "workers": st.host.hosts, "spot": s.spot,
                "api": s.api or "tpu"}

    def teardown_list(self, st: ClusterState) -> list[str]:
        if st.spec.api:
            return gce_requests.teardown_list(st.spec)
        return ([f"queued resource {st.spec.qr_name}"] if st.spec.queued else []) + [f"TPU {st.spec.tpu_name}"] \
            + ([f"VM {st.spec.vm_name}"] if st.spec.arch is Arch.NODE else [])
