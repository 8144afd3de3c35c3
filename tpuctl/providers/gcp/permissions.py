"""What the caller may do in the project, asked before `up` asks to confirm, through Resource Manager's
projects.testIamPermissions: `POST https://cloudresourcemanager.googleapis.com/v1/projects/{id}:testIamPermissions`
with `{"permissions": [...]}` answers the subset the caller holds; the call itself needs no permission
(cloud.google.com/resource-manager/reference/rest/v1/projects/testIamPermissions).

It sees grants on the project (and what the project inherits), not those on one bucket or one service account.
So a missing TPU or Compute permission, always granted at project level, stops `up` with the role that carries
it; a missing Storage or actAs permission is only a warning, since a grant on the bucket or on the service
account itself would do. When the API cannot be asked (disabled, offline), `up` goes on and says so.
"""
from __future__ import annotations

import json
import os
from typing import Any

from ...core.errors import ErrorKind, TpuctlError
from ...core.models import Arch, ClusterSpec

# permission -> the predefined role that carries it (cloud.google.com/iam/docs/understanding-roles)
_HARD = {"tpu.nodes.create": "roles/tpu.admin", "tpu.nodes.delete": "roles/tpu.admin",
         "tpu.nodes.get": "roles/tpu.admin", "tpu.operations.get": "roles/tpu.admin"}
_NODE = {"compute.instances.create": "roles/compute.instanceAdmin.v1",
         "compute.instances.delete": "roles/compute.instanceAdmin.v1"}
_SOFT = {"storage.buckets.create": "roles/storage.admin", "storage.buckets.setIamPolicy": "roles/storage.admin",
         "iam.serviceAccounts.actAs": "roles/iam.serviceAccountUser"}


def _endpoint() -> str | None:
    """Resource Manager's base URL; None when other APIs are emulated and this one is not (nothing to ask)."""
    host = os.environ.get("RESOURCE_MANAGER_EMULATOR_HOST")
    if host:
        return host.rstrip("/")
    if os.environ.get("TPU_EMULATOR_HOST"):
        return None
    return "https://cloudresourcemanager.googleapis.com"


def _ask(base: str, project: str, wanted: list[str]) -> set[str]:
    from google.auth.transport.requests import AuthorizedSession
    from google.auth.credentials import AnonymousCredentials

    from . import clients
    creds: Any = AnonymousCredentials() if os.environ.get("RESOURCE_MANAGER_EMULATOR_HOST") else clients.credentials()
    r = AuthorizedSession(creds).post(f"{base}/v1/projects/{project}:testIamPermissions",
                                      json={"permissions": wanted}, timeout=20)
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
    return set(json.loads(r.text or "{}").get("permissions", []))


def check(spec: ClusterSpec) -> list[str]:
    """Raise TpuctlError(PERMISSION) when a project-level permission `up` needs is missing; return warnings."""
    base = _endpoint()
    if base is None:
        return []
    needed = {**_HARD, **(_NODE if spec.arch is Arch.NODE else {}), **_SOFT}
    try:
        held = _ask(base, spec.project, sorted(needed))
    except Exception as e:  # noqa: BLE001 - a check that cannot be made must not stop a user who may have the rights
        return [f"could not check your permissions in project {spec.project} ({type(e).__name__}: {e})"]
    missing = [p for p in needed if p not in held]
    hard = [p for p in missing if p not in _SOFT]
    if hard:
        roles = sorted({needed[p] for p in hard})
        raise TpuctlError(ErrorKind.PERMISSION, f"you lack {', '.join(sorted(hard))} in project {spec.project}",
                          f"ask for {' and '.join(roles)} on the project (gcloud projects add-iam-policy-binding "
                          f"{spec.project} --member=user:YOU --role={roles[0]})")
    return [f"no project-level {p} ({_SOFT[p]}): fine only if it is granted on the bucket or service account "
            "itself" for p in sorted(missing)]
