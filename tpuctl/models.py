"""The records passed between layers: what the user asked for (ClusterSpec) and what exists (ClusterState)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from .errors import TpuctlError, bad_input

LABEL = "tpuctl-cluster"
OBJECT_ROLES = ("roles/storage.objectAdmin", "roles/storage.legacyBucketReader")

_CLUSTER_RE = re.compile(r"^[a-z]([a-z0-9-]{0,22}[a-z0-9])?$")
_PROJECT_RE = re.compile(r"^([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_BUCKET_PART_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*[a-z0-9]$")
_IP_RE = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
_SA_RE = re.compile(r"^[a-z0-9][a-z0-9.@_-]*@[a-z0-9.-]+\.[a-z]+$")


def require_owned(labels, cluster: str, what: str) -> None:
    """Refuse to delete a resource that does not carry our label: its name alone does not prove it is ours."""
    if (labels or {}).get(LABEL) != cluster:
        raise TpuctlError("input", f"{what} is not labelled {LABEL}={cluster}; not deleting it",
                          "delete it yourself if it is yours")


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


def default_bucket(project: str, cluster: str) -> str:
    return re.sub(r"[:.]", "-", project) + "-tpuctl-" + cluster


@dataclass
class ClusterSpec:
    name: str
    project: str = ""
    provider: str = "gcp"
    tpu_type: str = ""
    zones: list = field(default_factory=list)
    arch: str = "vm"
    runtime: str = ""
    spot: bool = False
    service_account: str = ""
    bucket: str = ""
    vm_type: str = ""

    @property
    def tpu_name(self) -> str:
        return f"tpuctl-{self.name}"

    @property
    def vm_name(self) -> str:
        return f"tpuctl-{self.name}-vm"

    @property
    def labels(self) -> dict:
        return {LABEL: self.name}


@dataclass
class Grant:
    member: str
    role: str


@dataclass
class ClusterState:
    """What exists for one cluster. Saved after every step, so an interrupted `up` or any `down` knows it."""
    name: str
    provider: str
    project: str = ""
    arch: str = "vm"
    tpu_type: str = ""
    zones: list = field(default_factory=list)
    zone: str = ""
    runtime: str = ""
    spot: bool = False
    tpu_name: str = ""
    vm_name: str = ""
    vm_type: str = ""
    bucket: str = ""
    bucket_created: bool = False
    service_accounts: list = field(default_factory=list)
    grants: list = field(default_factory=list)
    tpu_ip: str = ""
    host_pid: int = 0              # local provider: the agent process
    phase: str = "creating"        # creating -> ready; a state file left in "creating" means `up` was cut off
    created_at: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "ClusterState":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        st = cls(**known)
        st.grants = [g if isinstance(g, Grant) else Grant(**g) for g in st.grants]
        return st

    @property
    def store_uri(self) -> str:
        return f"gs://{self.bucket}" if self.provider == "gcp" else self.bucket
