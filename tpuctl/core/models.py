"""The records passed between layers: what the user asked for (ClusterSpec), what a host is (HostFacts) and what
exists (ClusterState, which holds the spec it was made from plus what `up` learned)."""
from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .errors import ErrorKind, TpuctlError, bad_input

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

LABEL = "tpuctl-cluster"
NONCE_LABEL = "tpuctl-nonce"   # which `up` run created a resource (see TpuApi.create)
OBJECT_ROLES = ("roles/storage.objectAdmin", "roles/storage.legacyBucketReader")

_CLUSTER_RE = re.compile(r"^[a-z]([a-z0-9-]{0,22}[a-z0-9])?$")
_PROJECT_RE = re.compile(r"^([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_BUCKET_PART_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*[a-z0-9]$")
_IP_RE = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
_SA_RE = re.compile(r"^[a-z0-9][a-z0-9.@_-]*@[a-z0-9.-]+\.[a-z]+$")
# Compute Engine resource names, networks and subnetworks included (RFC 1035: cloud.google.com/compute/docs/naming-
# resources): a lowercase letter, then up to 62 lowercase letters, digits or hyphens, not ending in a hyphen.
_GCE_NAME_RE = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")


class ProviderName(str, Enum):
    GCP = "gcp"
    LOCAL = "local"
    KAGGLE = "kaggle"
    GKE = "gke"


class Arch(str, Enum):
    VM = "vm"        # TPU VM: the job runs on the TPU host (tpu v2 API)
    NODE = "node"    # legacy TPU Node + a companion Compute Engine VM that runs the job (tpu v1 API)


class Framework(str, Enum):
    """How a job uses a multi-host slice (GCP_FACTS §6): TensorFlow runs ONE program, on worker 0, while every host
    serves the TPU runtime; JAX and PyTorch/XLA run the same program on every worker."""
    TENSORFLOW = "tensorflow"
    JAX = "jax"
    PYTORCH = "pytorch"
    # A job's only (tpuctl.toml `framework = "keras"`): Keras 3, whose backend tpuctl picks from the target
    # (core/backends.py); never a cluster's `--framework`, which picks a runtime image.
    KERAS = "keras"


class Phase(str, Enum):
    CREATING = "creating"   # a state file left here means `up` was cut off: the next `up` finishes it
    READY = "ready"
    DOWN = "down"           # compute deleted, store kept: logs, jobs and download still read it; `up` brings it back


def require_owned(labels: Any, cluster: str, what: str) -> None:
    """Refuse to delete or adopt a resource that does not carry our label: its name alone does not prove it is
    ours."""
    if (labels or {}).get(LABEL) != cluster:
        raise TpuctlError(ErrorKind.INPUT, f"{what} is not labelled {LABEL}={cluster}; not touching it",
                          "delete or rename it yourself if it is yours, or pick another cluster name with -c")


def check_cluster_name(name: str) -> str:
    if not _CLUSTER_RE.match(name or ""):
        raise bad_input(f"invalid cluster name {name!r}",
                        "use 1-24 lowercase letters, digits or hyphens, starting with a letter (e.g. -c bert)")
    return name


def check_project(project: str) -> str:
    if not _PROJECT_RE.match(project or ""):
        raise bad_input(f"invalid project id {project!r}",
                        "project ids are 6-30 lowercase letters, digits or hyphens, starting with a letter")
    return project


def check_bucket_name(name: str) -> str:
    """Cloud Storage naming rules (cloud.google.com/storage/docs/buckets#naming)."""
    problem = None
    if not 3 <= len(name) <= (222 if "." in name else 63):
        problem = "must be 3-63 characters (222 with dots)"
    elif not _BUCKET_PART_RE.match(name):
        problem = "may hold only lowercase letters, digits, '-', '_' and '.', and must start and end with a letter or digit"
    elif any(len(p) > 63 or not p for p in name.split(".")):
        problem = "each dot-separated part must be 1-63 characters"
    elif name.startswith("goog") or "google" in name or "g00gle" in name:
        problem = "may not start with 'goog' or contain 'google'"
    elif _IP_RE.match(name):
        problem = "may not look like an IP address"
    if problem:
        raise bad_input(f"invalid bucket name {name!r}: {problem}", "pass another --bucket")
    return name


def check_service_account(email: str) -> str:
    if not _SA_RE.match(email or ""):
        raise bad_input(f"invalid service account {email!r}",
                        "use the account's email, e.g. trainer@PROJECT.iam.gserviceaccount.com")
    return email


def check_gce_name(name: str, flag: str) -> str:
    """--network / --subnetwork: a name (not a URL: tpuctl puts it in the project and the TPU's region)."""
    if not _GCE_NAME_RE.match(name):
        raise bad_input(f"invalid {flag} {name!r}: a Compute Engine name is 1-63 lowercase letters, digits or hyphens, "
                        "starting with a letter and not ending with a hyphen", f"give the name only, e.g. {flag} my-vpc")
    return name


def default_bucket(project: str, cluster: str) -> str:
    return re.sub(r"[:.]", "-", project) + "-tpuctl-" + cluster


R = TypeVar("R", bound="JsonRecord")


class JsonRecord:
    """to_json/from_json for a flat dataclass of JSON values; str enums serialise as their value and are coerced
    back in the class's __post_init__. Unknown keys are ignored, so a newer writer never breaks an older reader."""

    def to_json(self) -> dict[str, Any]:
        return asdict(cast("DataclassInstance", self))   # every subclass is a dataclass

    @classmethod
    def from_json(cls: type[R], d: dict[str, Any]) -> R:
        known = {f.name for f in fields(cast("type[DataclassInstance]", cls))}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class ClusterSpec(JsonRecord):
    """What the user asked for, validated. `store` is the store's URI: gs://BUCKET, or a directory (local)."""
    name: str
    provider: ProviderName
    store: str = ""
    project: str = ""
    tpu_type: str = ""
    zones: list[str] = field(default_factory=list)
    arch: Arch = Arch.VM
    runtime: str = ""               # as asked (--runtime); the one chosen is ClusterState.runtime
    spot: bool = False
    service_account: str = ""
    vm_type: str = ""               # the legacy node's companion VM
    framework: Framework = Framework.TENSORFLOW   # picks the runtime family (TensorFlow or base images)
    autostop: int = 0               # seconds with no active run before the host ends its compute; 0: off
    max_duration: int = 0           # seconds from the compute's creation to its hard end; 0: none
    queued: bool = False            # the TPU is had through a queued resource (providers/gcp/tpuapi/queued.py)
    valid_until: int = 0            # seconds a queued request may wait before it expires; 0: Google's default
    slices: int = 1                 # `up --slices N`: N slices of tpu_type in one queued request (core/multislice.py)
    network: str = ""               # `up --network`: the VPC network of the TPU and tpuctl's VMs; "": default
    subnetwork: str = ""            # `up --subnetwork`: its subnetwork in the TPU's region; "": Google's choice
    create_firewall: bool = False   # `up --create-firewall`: tpuctl makes the hosts' rule, down removes it
    gke_cluster: str = ""           # `up --gke-cluster`: an existing GKE cluster adopted (never deleted by down)
    image: str = ""                 # `up --image`: the container image a GKE run's pods start from; "": the default
    reservation: str = ""           # `up --reservation`: the Compute Engine reservation GKE's TPU nodes consume
    kube_context: str = ""          # `up --kube-context`: reach GKE's Kubernetes API through this kubeconfig context
    kueue: bool = False             # `up --kueue` (GKE): Kueue installed with a queue for the node pools' TPUs
    namespace: str = ""             # `up --namespace` (GKE): the runs' and the LocalQueue's namespace; "": default
    api: str = ""                   # Google Cloud: "compute" makes the TPU as Compute Engine VMs/MIGs; "": TPU API
    flex_start: bool = False        # `up --flex-start` (--api compute): flex-start VMs, ended after max_duration
    flex_wait: int = 0              # `up --flex-wait` (--api compute): seconds a flex-start VM waits for capacity
    disk_size: int = 0              # `up --disk-size` (--api compute): boot disk GB; 0: tpuctl's default
    disk_type: str = ""             # `up --disk-type` (--api compute): boot disk type; "": the TPU family's
    internal_ips: bool = False      # `up --internal-ips` (--api compute): TPU VMs without external addresses
    reservation_bound: bool = False  # --api compute: the reservation is calendar-mode or dense (read at up, gce.py)

    # Fields that name what a cluster IS: `up` refuses to change them on an existing cluster.
    IDENTITY = ("provider", "tpu_type", "arch", "project", "store", "slices", "api")

    @property
    def tpu_name(self) -> str:
        return f"tpuctl-{self.name}"

    @property
    def node_names(self) -> list[str]:
        """Every TPU node of the cluster: tpu_name, or tpu_name-0 ... tpu_name-(N-1) for N slices. On GKE, where
        a slice is a node pool of the GKE cluster tpu_name: tpu_name-np-0 ... tpu_name-np-(N-1)."""
        if self.provider is ProviderName.GKE:
            return [f"{self.tpu_name}-np-{k}" for k in range(self.slices)]
        from .multislice import node_names
        return node_names(self.tpu_name, self.slices)

    @property
    def vm_name(self) -> str:
        return f"tpuctl-{self.name}-vm"

    @property
    def qr_name(self) -> str:
        """The queued resource (`up --queued`) that asks for the TPU."""
        return f"tpuctl-{self.name}-qr"

    def __post_init__(self) -> None:
        self.provider, self.arch = ProviderName(self.provider), Arch(self.arch)
        self.framework = Framework(self.framework)

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL: self.name}


@dataclass
class Grant:
    member: str
    role: str


@dataclass
class HostFacts(JsonRecord):
    """What `up` learned about the compute once it existed."""
    ip: str = ""                   # the TPU's first endpoint (the legacy node's gRPC address)
    service_account: str = ""      # the identity the TPU reports (the legacy node's service agent)
    hosts: int = 1                 # workers in the slice
    pid: int = 0                   # local provider: the agent process


@dataclass
class ClusterState:
    """What exists for one cluster: the spec it was made from and what `up` learned. Saved after every step, so
    an interrupted `up` or any `down` knows it."""
    spec: ClusterSpec
    zone: str = ""
    runtime: str = ""
    grants: list[Grant] = field(default_factory=list)
    host: HostFacts = field(default_factory=HostFacts)
    phase: Phase = Phase.CREATING
    created_at: float = 0.0
    periods: list[list[float]] = field(default_factory=list)   # [start, end] of each time its compute existed;
                                                                # end 0 while it exists (cost so far)
    record: dict[str, Any] = field(default_factory=dict)   # what the provider learned, under its name: {"gke": {...}}

    @property
    def compute_since(self) -> float:
        """When the compute that exists now was created (0 when none is open)."""
        return self.periods[-1][0] if self.periods and not self.periods[-1][1] else 0.0

    @property
    def deadline(self) -> float:
        return self.compute_since + self.spec.max_duration if self.spec.max_duration and self.compute_since else 0.0

    def compute_started(self, now: float) -> None:
        self.compute_ended(now)
        self.periods.append([now, 0.0])

    def compute_ended(self, now: float) -> None:
        if self.periods and not self.periods[-1][1]:
            self.periods[-1][1] = now

    def compute_seconds(self, now: float) -> float:
        return sum((end or now) - start for start, end in self.periods)

    @property
    def name(self) -> str:
        return self.spec.name

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec.to_json(), "zone": self.zone, "runtime": self.runtime,
                "grants": [asdict(g) for g in self.grants], "host": self.host.to_json(),
                "phase": self.phase.value, "created_at": self.created_at, "periods": self.periods,
                "record": self.record}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ClusterState":
        if "spec" not in d:
            d = _from_first_version(d)
        return cls(spec=ClusterSpec.from_json(d["spec"]), zone=d.get("zone", ""), runtime=d.get("runtime", ""),
                   grants=[Grant(**g) for g in d.get("grants", [])], host=HostFacts.from_json(d.get("host", {})),
                   phase=Phase(d.get("phase", Phase.CREATING)), created_at=float(d.get("created_at", 0.0)),
                   periods=[[float(a), float(b)] for a, b in d.get("periods", [])],
                   record=dict(d.get("record") or {}))


def _from_first_version(d: dict[str, Any]) -> dict[str, Any]:
    """State files of tpuctl 0.1 were flat (spec fields copied beside what `up` learned)."""
    provider = d["provider"]
    bucket = d.get("bucket", "")
    spec = {"name": d["name"], "provider": provider, "project": d.get("project", ""),
            "tpu_type": d.get("tpu_type", ""), "zones": d.get("zones", []), "arch": d.get("arch") or "vm",
            "spot": d.get("spot", False), "vm_type": d.get("vm_type", ""),
            "store": f"gs://{bucket}" if provider == "gcp" and bucket else bucket}
    return {"spec": spec, "zone": d.get("zone", ""), "runtime": d.get("runtime", ""), "grants": d.get("grants", []),
            "host": {"ip": d.get("tpu_ip", ""), "pid": d.get("host_pid", 0)}, "phase": d.get("phase", "creating"),
            "created_at": d.get("created_at", 0.0)}


def cluster_record(st: ClusterState, tpu_address: str, teardown: str = "",
                   delete: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """`tpuctl/cluster.json`: what a host's agent reads from the store (the provider decides `tpu_address`:
    "local" on a TPU VM, grpc://IP:8470 beside a legacy node, "" without a TPU; and `teardown`, how worker 0's
    agent ends the compute itself (lifecycle.py): "exit" for the local agent, "gcp" for a host that deletes
    `delete` (host/google_api.Target records, in order) as its own identity). `written` tells one `up` from the next: the
    host answers each with a teardown check. `grants` are those `up` added on the store, so that `down` from the
    labels alone (no local state) revokes exactly them."""
    from .. import __version__
    return {"cluster": st.name, "tpu_type": st.spec.tpu_type, "arch": st.spec.arch.value, "zone": st.zone,
            "runtime": st.runtime, "tpu_address": tpu_address, "tpu_name": st.spec.tpu_name, "hosts": st.host.hosts,
            "framework": st.spec.framework.value, "store": st.spec.store, "tpuctl_version": __version__,
            "project": st.spec.project, "autostop": st.spec.autostop, "deadline": st.deadline,
            "teardown": teardown, "delete": delete or [], "written": time.time(),
            "grants": [asdict(g) for g in st.grants],
            # Multislice (multislice.py): how many slices, and slice 0's worker 0, the MEGASCALE coordinator
            "slices": st.spec.slices, "coordinator": st.host.ip}
