"""The contract between the orchestrator and a cloud. Every provider follows these rules:

- `ensure_*` creates or adopts and is idempotent: calling it again after success (or after an interruption)
  returns the same resource and creates nothing twice. It returns True when THIS call created the resource,
  so the orchestrator knows what a failed `up` must remove.
- `delete_*` succeeds when the resource is already gone, and refuses (TpuctlError "input") to delete a resource
  that does not carry the `tpuctl-cluster=<name>` label.
- Every call blocks until the resource is usable or gone, with a deadline, reporting state changes through
  `progress(state_text)`; it raises TpuctlError, whose `scope` ("zone", "region", "global") says whether the
  next zone may succeed.
"""
from __future__ import annotations

from typing import Callable, Protocol

from ..models import ClusterSpec, ClusterState, Grant

Progress = Callable[[str], None]


class Reporter(Protocol):
    def info(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...
    def resource(self, kind: str, name: str, state: str, final: bool | None = None) -> None:
        """A resource changed state ("creating", "READY", "deleted", ...); the reporter times it until a final
        state (`final`, or by default READY, RUNNING, DELETED, GRANTED, REVOKED, ADOPTED)."""
    def transfer(self, total: int):
        """Start a byte progress display for an upload of `total` bytes; returns advance(n_bytes)."""


class Provider(Protocol):
    """The cloud provider implements all of it. The local provider has no zones, TPU, VM or grants: `up` takes a
    shorter path (orchestrator._up_local) through ensure_bucket and `ensure_host(st, progress)`, which starts the
    agent; its delete_tpu stops that agent and its delete_vm and revoke do nothing."""
    name: str

    def runtime_for(self, spec: ClusterSpec, zone: str) -> str:
        """The runtime (vm) or TensorFlow version (node) to use: spec.runtime, or the newest that fits."""

    def workload_accounts(self, spec: ClusterSpec) -> list[str]:
        """Identities known before creation that must read and write the bucket."""

    def ensure_bucket(self, spec: ClusterSpec, bucket: str, region: str, progress: Progress) -> bool: ...
    def delete_bucket(self, bucket: str, progress: Progress) -> None: ...
    def grant(self, bucket: str, accounts: list[str]) -> list[Grant]:
        """Add the object roles for each account on the bucket only; returns the grants this call added."""
    def revoke(self, bucket: str, grants: list[Grant]) -> None: ...

    def ensure_tpu(self, spec: ClusterSpec, zone: str, runtime: str, script: str, progress: Progress) -> tuple[bool, dict]:
        """Returns (created, facts) where facts has `ip` and, for the legacy node, `service_account`."""
    def delete_tpu(self, st: ClusterState, progress: Progress) -> None: ...
    def ensure_vm(self, spec: ClusterSpec, zone: str, script: str, progress: Progress) -> bool: ...
    def delete_vm(self, st: ClusterState, progress: Progress) -> None: ...

    def write_cluster_record(self, bucket: str, record: dict) -> None:
        """tpuctl/cluster.json in the store (and, on a cloud, the agent package the hosts install)."""
    def store(self, st: ClusterState):
        """The cluster's BlobStore (tpuctl/store.py)."""
    def check_ready(self, st: ClusterState) -> None:
        """Raise TpuctlError unless runs can be submitted now (TPU READY; local agent alive)."""

    def describe(self, st: ClusterState) -> dict:
        """Live state of each resource of the cluster: {"tpu": ..., "vm": ..., "bucket": ...}."""
    def list_labelled(self) -> list[dict]:
        """Every TPU in the project carrying the tpuctl label: name, cluster, zone, type, state."""
