"""Bucket-level grants (never project-wide): the TPU workload's identity gets objectAdmin + legacyBucketReader,
because TF's GCS filesystem reads bucket metadata, which objectAdmin alone lacks (GCP_FACTS §4).

set_iam_policy carries the policy's etag; a concurrent edit answers 412 and we re-read and re-apply.
"""
from __future__ import annotations

from typing import Any, Callable

from ...core.errors import ErrorKind, TpuctlError
from ...core.models import OBJECT_ROLES, Arch, ClusterSpec, ClusterState, Grant
from . import clients, vms
from .operations import call
from .storage import bucket_of

_ATTEMPTS = 5


Bindings = list[dict[str, Any]]


def _edit(project: str, bucket: str, change: Callable[[Bindings], list[Grant]],
          before_write: Callable[[list[Grant]], None] = lambda g: None) -> list[Grant]:
    b = clients.storage(project).bucket(bucket)
    for attempt in range(_ATTEMPTS):
        policy = call(b.get_iam_policy, requested_policy_version=3, what=f"read IAM policy of {bucket}")
        policy.version = 3
        changed = change(policy.bindings)
        if not changed:
            return []
        before_write(changed)
        try:
            call(b.set_iam_policy, policy, what=f"set IAM policy of {bucket}")
            return changed
        except TpuctlError as e:
            if "412" not in e.message and "FAILED_PRECONDITION" not in e.message or attempt == _ATTEMPTS - 1:
                raise
    return []


def grant(project: str, bucket: str, accounts: list[str], intend: Callable[[list[Grant]], None]) -> list[Grant]:
    """Add the object roles on the bucket. `intend(grants)` is told what is about to be added (absent from the
    policy just read) BEFORE the write, so a process killed after Google applied it has still recorded it."""
    wanted = [Grant(f"serviceAccount:{a}", r) for a in accounts for r in OBJECT_ROLES]

    def change(bindings: Bindings) -> list[Grant]:
        added: list[Grant] = []
        for g in wanted:
            row = next((b for b in bindings if b["role"] == g.role and not b.get("condition")), None)
            if row is None:
                row = {"role": g.role, "members": set()}
                bindings.append(row)
            members = set(row["members"])
            if g.member not in members:
                row["members"] = members | {g.member}
                added.append(g)
        return added
    return _edit(project, bucket, change, intend)


def revoke(project: str, bucket: str, grants: list[Grant]) -> None:
    def change(bindings: Bindings) -> list[Grant]:
        removed: list[Grant] = []
        for g in grants:
            for row in bindings:
                if row["role"] == g.role and g.member in set(row["members"]) and not row.get("condition"):
                    row["members"] = set(row["members"]) - {g.member}
                    removed.append(g)
        bindings[:] = [b for b in bindings if b["members"]]
        return removed
    try:
        _edit(project, bucket, change)
    except TpuctlError as e:
        if e.kind is not ErrorKind.NOT_FOUND:
            raise


class BucketIam:
    """The BucketGrants capability (providers/base.py) over the bucket's IAM policy."""

    def __init__(self) -> None:
        self._default_sa: dict[str, str] = {}

    def default_service_account(self, project: str) -> str:
        if project not in self._default_sa:
            self._default_sa[project] = vms.default_service_account(project)
        return self._default_sa[project]

    def workload_accounts(self, spec: ClusterSpec) -> list[str]:
        """The TPU VM's identity, or the legacy node's companion VM's (the VM runs the job)."""
        return [spec.service_account or self.default_service_account(spec.project)]

    def host_accounts(self, st: ClusterState) -> list[str]:
        """The legacy node reads and writes the bucket as its TPU service agent, known only once it exists."""
        return [st.host.service_account] if st.spec.arch is Arch.NODE and st.host.service_account else []

    def grant(self, spec: ClusterSpec, accounts: list[str], intend: Callable[[list[Grant]], None]) -> list[Grant]:
        return grant(spec.project, bucket_of(spec), accounts, intend)

    def revoke(self, spec: ClusterSpec, grants: list[Grant]) -> None:
        revoke(spec.project, bucket_of(spec), grants)
