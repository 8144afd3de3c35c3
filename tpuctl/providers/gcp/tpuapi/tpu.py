"""TPU nodes through tpu_v2 (TPU VM, `--arch vm`) or tpu_v1 (legacy TPU Node, `--arch node`); see base.py for rules."""
from __future__ import annotations

import importlib
import re
from types import ModuleType
from typing import Any, Callable

from ....core.errors import ErrorKind, TpuctlError
from ....core.models import LABEL, NONCE_LABEL, Arch, ClusterSpec, HostFacts, require_owned
from ...base import Progress
from ...google import clients
from ...google.errors import classify
from ...google.operations import call, get_or_none, wait

CREATE_DEADLINE = 1800.0
DELETE_DEADLINE = 900.0
# What each Node.State means for tpuctl (google-cloud-tpu 1.28, tpu_v2.types.Node.State's docstrings; v1 has the
# same names but UNKNOWN). Every state is in exactly one set (tests/test_units.py holds them to the enum):
# Google is bringing the node up or back: wait (status says so, followers keep following, the watcher waits).
COMING = frozenset({"CREATING", "STARTING", "RESTARTING", "REPAIRING", "REIMAGING", "UNHIDING"})
# Only a re-create brings it back: PREEMPTED and TERMINATED can only be deleted (GCP_FACTS §5); UNKNOWN is "unknown
# state after a failed repair", a repair Google gave up on. `up` and the recovery watcher delete and re-create.
LOST = frozenset({"PREEMPTED", "TERMINATED", "UNKNOWN"})
# Going away: someone deletes it (`down`, or by hand); afterwards it is missing, and so lost.
GOING = frozenset({"DELETING"})
# Held by someone's action (a stop: `up` starts it) or in a state Google does not explain (HIDING, HIDDEN: the
# docstrings say only "hiding"/"hidden"; STATE_UNSPECIFIED): nothing tpuctl does by waiting or re-creating is
# known to be right, so it is told to the user; the watcher neither waits silently nor re-creates.
HELD = frozenset({"STOPPING", "STOPPED", "HIDING", "HIDDEN", "STATE_UNSPECIFIED"})
READY = "READY"
# Node.Health while READY: UNHEALTHY_MAINTENANCE "will resume running once rescheduled": wait; TIMEOUT ("the
# resource is unresponsive") and UNHEALTHY_TENSORFLOW ("the in-guest ML stack is unhealthy"): told to the user;
# HEALTHY and HEALTH_UNSPECIFIED: nothing to say (the agents' heartbeats say whether jobs run).
HEALTH_WAIT = frozenset({"UNHEALTHY_MAINTENANCE"})
HEALTH_TOLD = {"TIMEOUT": "unresponsive", "UNHEALTHY_TENSORFLOW": "its in-guest ML stack is unhealthy"}


def health_of(node: Any) -> str:
    """The node's Health name ("" for v1 nodes, whose health field is another enum)."""
    try:
        return type(node).Health(node.health).name
    except (AttributeError, ValueError):
        return ""


class TpuApi:
    """One API version's view of the project's nodes (proto-plus Node objects are typed Any: the v1 and v2
    clients declare different classes for the same shape)."""

    def __init__(self, project: str, arch: Arch) -> None:
        self.project = project
        self.version = 2 if arch is Arch.VM else 1

    @property
    def client(self) -> Any:
        return clients.tpu(self.version)

    @property
    def types(self) -> ModuleType:
        return importlib.import_module(f"google.cloud.tpu_v{self.version}")

    def path(self, name: str, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}/nodes/{name}"

    def find(self, name: str, zone: str) -> Any:
        return get_or_none(self.client.get_node, name=self.path(name, zone), what=f"get TPU {name}")

    def get(self, name: str, zone: str) -> Any:
        """The node, which must exist (it was just made or adopted)."""
        node = self.find(name, zone)
        if node is None:
            raise TpuctlError(ErrorKind.ERROR, f"TPU {name} disappeared in {zone}", "run the same command again")
        return node

    def list_labelled(self) -> list[Any]:
        parent = f"projects/{self.project}/locations/-"
        nodes = call(lambda: list(self.client.list_nodes(parent=parent)), what="list TPUs")
        return [n for n in nodes if LABEL in n.labels]

    def accelerator_types(self, zone: str) -> list[str]:
        """The types the zone offers (read-only; an unknown zone answers INVALID_ARGUMENT: offers nothing)."""
        parent = f"projects/{self.project}/locations/{zone}"
        try:
            found = call(lambda: list(self.client.list_accelerator_types(parent=parent)), what=f"list TPU types in {zone}")
        except TpuctlError as e:
            if e.kind in (ErrorKind.INPUT, ErrorKind.NOT_FOUND):
                return []
            raise
        return [a.type_ for a in found]

    def versions(self, zone: str) -> list[str]:
        parent = f"projects/{self.project}/locations/{zone}"
        if self.version == 2:
            return [v.version for v in call(lambda: list(self.client.list_runtime_versions(parent=parent)),
                                             what="list TPU runtime versions")]
        return [v.version for v in call(lambda: list(self.client.list_tensor_flow_versions(parent=parent)),
                                         what="list TensorFlow versions")]

    def build_node(self, spec: ClusterSpec, runtime: str, script: str, service_account: str,
                   labels: dict[str, str]) -> Any:
        t = self.types
        if self.version == 2:
            return t.Node(
                accelerator_type=spec.tpu_type, runtime_version=runtime, labels=labels,
                metadata={"startup-script": script},
                # tpu_v2 NetworkConfig.network / .subnetwork: "the name of the network [subnetwork] ... If none is
                # provided, "default" will be used" (google/cloud/tpu_v2/types/cloud_tpu.py, google-cloud-tpu 1.x)
                network_config=t.NetworkConfig(network=spec.network, subnetwork=spec.subnetwork,
                                               enable_external_ips=True),
                scheduling_config=t.SchedulingConfig(spot=spec.spot),
                service_account=t.ServiceAccount(email=service_account,
                                                 scope=["https://www.googleapis.com/auth/cloud-platform"]),
                description=f"tpuctl cluster {spec.name}")
        # tpu_v1 Node.network: "the name of a network they wish to peer the TPU node to ... If none is provided,
        # "default" will be used" (google/cloud/tpu_v1/types/cloud_tpu.py); v1 has no subnetwork: its VM has it
        return t.Node(accelerator_type=spec.tpu_type, tensorflow_version=runtime, labels=labels, network=spec.network,
                      scheduling_config=t.SchedulingConfig(preemptible=spec.spot),
                      description=f"tpuctl cluster {spec.name}")

    def state(self, node: Any) -> str:
        return type(node).State(node.state).name

    def wait_operation(self, op: Any, what: str, deadline: float, progress: Progress) -> Any:
        def poll() -> tuple[bool, str]:
            try:
                done = op.done()
            except Exception as e:  # noqa: BLE001
                err = classify(e, what)
                if err.retryable:
                    return False, "waiting"
                raise err from e
            return done, "done" if done else "working"
        wait(poll, what, deadline)
        try:
            return op.result(timeout=0)
        except Exception as e:  # noqa: BLE001 - the operation's own error, e.g. code 8 stockout
            raise classify(e, what) from e

    def wait_state(self, name: str, zone: str, want: set[str], deadline: float, progress: Progress,
                   gone_ok: bool = False) -> str:
        def poll() -> tuple[bool, str]:
            node = self.find(name, zone)
            if node is None:
                if gone_ok:
                    return True, "deleted"
                raise TpuctlError(ErrorKind.ERROR, f"TPU {name} disappeared while waiting", "run the same command again")
            st = self.state(node)
            if st in LOST and READY in want:
                raise TpuctlError(ErrorKind.PREEMPTED, f"TPU {name} is {st}", "run `tpuctl up` again to recreate it")
            if st in HELD - {"STOPPING", "STOPPED"} and READY in want:   # a started node may still say STOPPED
                raise TpuctlError(ErrorKind.ERROR, f"TPU {name} is {st}, which does not become READY by waiting",
                                  f"see `gcloud compute tpus tpu-vm describe {name} --zone {zone}`; `tpuctl down` "
                                  f"and `tpuctl up` replace it")
            return st in want, st
        return wait(poll, f"TPU {name}", deadline, progress)

    def create(self, spec: ClusterSpec, zone: str, runtime: str, script: str, service_account: str,
               nonce: str, progress: Progress, accepted: Callable[[], None] = lambda: None) -> bool:
        """Create and wait until READY; True when THIS run's create made the node. The node carries this run's
        `nonce` label, which tells a create whose answer was lost (its retry meets ALREADY_EXISTS: ours, adopted as
        made by us) from another machine's `up` of the same cluster that got there first (adopted, never deleted).
        On failure only a node with our nonce is removed. `accepted` is called once Google has taken the create (or
        the node exists), before the wait for READY."""
        labels = {**spec.labels, NONCE_LABEL: nonce}
        node = self.build_node(spec, runtime, script, service_account, labels)
        parent = f"projects/{self.project}/locations/{zone}"
        progress("creating")
        try:
            try:
                op = call(self.client.create_node, parent=parent, node_id=spec.tpu_name, node=node,
                          what=f"create TPU {spec.tpu_name} in {zone}")
                accepted()
                self.wait_operation(op, f"create TPU {spec.tpu_name} in {zone}", CREATE_DEADLINE, progress)
                ours = True
            except TpuctlError as e:
                from google.api_core.exceptions import Conflict
                if not isinstance(e.__cause__, Conflict):   # ALREADY_EXISTS (409)
                    raise
                existing = self.get(spec.tpu_name, zone)
                require_owned(existing.labels, spec.name, f"TPU {spec.tpu_name} in {zone}")
                ours = existing.labels.get(NONCE_LABEL) == nonce
                accepted()
                progress("created by this run, answer lost: adopting" if ours else "made by another `up`: adopting")
            self.wait_state(spec.tpu_name, zone, {"READY"}, CREATE_DEADLINE, progress)
            return ours
        except TpuctlError:
            left = self.find(spec.tpu_name, zone)
            if left is not None and left.labels.get(NONCE_LABEL) == nonce:
                self.delete(spec.tpu_name, zone, spec.name, progress)
            raise

    def delete(self, name: str, zone: str, cluster: str, progress: Progress) -> None:
        node = self.find(name, zone)
        if node is None:
            return
        require_owned(node.labels, cluster, f"TPU {name} in {zone}")
        progress("deleting")
        if self.state(node) != "DELETING":
            try:
                op = call(self.client.delete_node, name=self.path(name, zone), what=f"delete TPU {name}")
                self.wait_operation(op, f"delete TPU {name}", DELETE_DEADLINE, progress)
            except TpuctlError as e:
                # v1 DeleteNode's finished operation carries google.protobuf.Empty while the client declares Node,
                # so op.done()/op.result() (or delete_node itself, when the answer is already final) raise TypeError
                # "Could not convert ... Empty ... to Node"
                # (googleapis/google-cloud-go#10951, GoogleCloudPlatform/golang-samples#4422): the node is being
                # deleted; GetNode answering NOT_FOUND below is what confirms it.
                empty_answer = isinstance(e.__cause__, TypeError) and "Empty" in str(e.__cause__)
                if e.kind is not ErrorKind.NOT_FOUND and not empty_answer:
                    raise
        self.wait_state(name, zone, set(), DELETE_DEADLINE, progress, gone_ok=True)

    def start(self, name: str, zone: str, progress: Progress) -> None:
        op = call(self.client.start_node, request={"name": self.path(name, zone)}, what=f"start TPU {name}")
        self.wait_operation(op, f"start TPU {name}", CREATE_DEADLINE, progress)


def facts(node: Any) -> HostFacts:
    """v2 nodes list one endpoint per host; v1 nodes also carry ip_address and their service agent as a string."""
    eps = list(node.network_endpoints)
    ip = eps[0].ip_address if eps else getattr(node, "ip_address", "")
    sa = node.service_account
    return HostFacts(ip=ip, service_account=sa if isinstance(sa, str) else sa.email, hosts=max(1, len(eps)))


_RT = re.compile(r"^tpu-vm-tf-(\d+)\.(\d+)\.(\d+)(-pod)?(?:-(pjrt|se))?(?:-(.+))?$")
_FAMILY_SUFFIX = {"v5e-and-v6": {"v5litepod", "v6e"}, "v5p-and-below": {"v2", "v3", "v4", "v5p"}}


def pick_runtime(versions: list[str], family: str, multi_host: bool) -> str:
    """Newest TensorFlow TPU VM runtime that fits the chip family and single/multi-host shape (GCP_FACTS §2)."""
    best, best_key = "", None
    for v in versions:
        m = _RT.match(v)
        if not m:
            continue
        major, minor, patch, pod, flavor, suffix = m.groups()
        ver = (int(major), int(minor), int(patch))
        if bool(pod) != multi_host:
            continue
        if suffix and family not in _FAMILY_SUFFIX.get(suffix, set()):
            continue
        if family in {"v5litepod", "v5p", "v6e"} and ver < (2, 15, 0):
            continue
        key = (ver, {"pjrt": 2, "se": 1}.get(flavor, 0), bool(suffix))
        if best_key is None or key > best_key:
            best, best_key = v, key
    return best


# The base images Google recommends for JAX and PyTorch, which install the framework themselves
# (cloud.google.com/tpu/docs/runtimes, "PyTorch and JAX": v6e, v5p, v5e, then "v4 and older").
BASE_RUNTIMES = {"v6e": "v2-alpha-tpuv6e", "v5p": "v2-alpha-tpuv5", "v5litepod": "v2-alpha-tpuv5-lite"}
BASE_RUNTIME_OLDER = "tpu-ubuntu2204-base"


def pick_base_runtime(versions: list[str], family: str) -> str:
    """The base (framework-free) runtime for the family, if the zone offers it."""
    want = BASE_RUNTIMES.get(family, BASE_RUNTIME_OLDER)
    return want if want in versions else ""


# Where Google's own TensorFlow release tests run TensorFlow: not on tpu-vm-tf images but on these base runtimes,
# with tensorflow-tpu pip-installed from Google's libtpu TF release index (GoogleCloudPlatform/ml-auto-solutions:
# dags/solutions_team/solutionsteam_tf_release_supported.py creates v2-8, v3-8, v4-8/32 and v5p on
# RuntimeVersion.V2_ALPHA_TPUV5 and v5e on V2_ALPHA_TPUV5_LITE; dags/common/vm_resource.py adds V2_ALPHA_TPUV6
# "v2-alpha-tpuv6e"; configs/tensorflow/common.py install_tf).
TF_BASE_RUNTIMES = {"v5litepod": "v2-alpha-tpuv5-lite", "v6e": "v2-alpha-tpuv6e"}
TF_BASE_RUNTIME_OTHERS = "v2-alpha-tpuv5"


def pick_tf_base_runtime(versions: list[str], family: str) -> str:
    """The base runtime Google's TF release tests use for the family, if the zone offers it."""
    want = TF_BASE_RUNTIMES.get(family, TF_BASE_RUNTIME_OTHERS)
    return want if want in versions else ""


def tensorflow_from(runtime: str) -> str:
    """Where a TPU VM's TensorFlow comes from: "image" on a tpu-vm-tf runtime (TensorFlow and libtpu matched by
    Google), else "pip" (the host installs tensorflow-tpu for each job, at the version its tpuctl.toml asks for)."""
    return "image" if runtime.startswith("tpu-vm-tf") else "pip"


def pick_tf_version(versions: list[str]) -> str:
    parsed = []
    for v in versions:
        m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?$", v)
        if m:
            parsed.append(((int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)), v))
    return max(parsed)[1] if parsed else ""
