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

from ...core.errors import ErrorKind, TpuctlError, disabled_api
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
    if os.environ.get("TPU_EMULATOR_HOST") or os.environ.get("CONTAINER_EMULATOR_HOST"):
        return None
    return "https://cloudresourcemanager.googleapis.com"


class _Refused(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:200]}")
        self.disabled = disabled_api(status, text)


def _post(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    from google.auth.transport.requests import AuthorizedSession
    from google.auth.credentials import AnonymousCredentials

    from . import clients
    creds: Any = AnonymousCredentials() if os.environ.get("RESOURCE_MANAGER_EMULATOR_HOST") else clients.credentials()
    r = AuthorizedSession(creds).post(f"{base}/{path}", json=body, timeout=20)
    if r.status_code != 200:
        raise _Refused(r.status_code, r.text)
    answer = json.loads(r.text or "{}")
    return answer if isinstance(answer, dict) else {}


def _ask(base: str, project: str, wanted: list[str]) -> set[str]:
    return set(_post(base, f"v1/projects/{project}:testIamPermissions", {"permissions": wanted}).get("permissions", []))


def _cannot_check(project: str, e: Exception) -> str:
    if isinstance(e, _Refused) and e.disabled:
        return (f"could not check permissions in project {project}: the {e.disabled} API is disabled "
                f"(gcloud services enable {e.disabled} --project {project})")
    return f"could not check your permissions in project {project} ({type(e).__name__}: {e})"


def check(spec: ClusterSpec, compute: dict[str, str] | None = None) -> list[str]:
    """Raise TpuctlError(PERMISSION) when a project-level permission `up` needs is missing; return warnings.
    `compute`: the permissions (-> role) another provider's compute needs instead of the TPU API's (GKE's)."""
    base = _endpoint()
    if base is None:
        return []
    needed = {**(compute if compute is not None else {**_HARD, **(_NODE if spec.arch is Arch.NODE else {})}),
              **_SOFT}
    try:
        held = _ask(base, spec.project, sorted(needed))
    except Exception as e:  # noqa: BLE001 - a check that cannot be made must not stop a user who may have the rights
        return [_cannot_check(spec.project, e)]
    missing = [p for p in needed if p not in held]
    hard = [p for p in missing if p not in _SOFT]
    if hard:
        roles = sorted({needed[p] for p in hard})
        raise TpuctlError(ErrorKind.PERMISSION, f"you lack {', '.join(sorted(hard))} in project {spec.project}",
                          f"ask for {' and '.join(roles)} on the project (gcloud projects add-iam-policy-binding "
                          f"{spec.project} --member=user:YOU --role={roles[0]})")
    return [f"no project-level {p} ({_SOFT[p]}): fine only if it is granted on the bucket or service account "
            "itself" for p in sorted(missing)]


# What the host's identity needs to end its own compute (gcp/teardown.needed), and the predefined roles known to carry
# it (cloud.google.com/iam/docs/understanding-roles: Owner and Editor carry tpu.* and compute.* writes, TPU Admin
# tpu.*, TPU Editor tpu.nodes.create/delete (cloud.google.com/iam/docs/roles-permissions/tpu), Compute Admin
# compute.*, Compute Instance Admin compute.instances.*). A queued resource is checked by tpu.nodes.* (gcp/teardown.py).
CARRIES = {"tpu.nodes.delete": {"roles/owner", "roles/editor", "roles/tpu.admin", "roles/tpu.editor"},
           "compute.instances.delete": {"roles/owner", "roles/editor", "roles/compute.admin",
                                        "roles/compute.instanceAdmin", "roles/compute.instanceAdmin.v1"},
           "compute.instanceGroupManagers.delete": {"roles/owner", "roles/editor", "roles/compute.admin",
                                                    "roles/compute.instanceAdmin",
                                                    "roles/compute.instanceAdmin.v1"}}

# permission -> the narrowest predefined role that carries it (cloud.google.com/iam/docs/understanding-roles)
ROLE = {"tpu.nodes.delete": "roles/tpu.admin", "compute.instances.delete": "roles/compute.instanceAdmin.v1",
        "compute.instanceGroupManagers.delete": "roles/compute.instanceAdmin.v1"}
REACH = {"roles/tpu.admin": "create and delete every TPU and queued resource in the project",
         "roles/compute.instanceAdmin.v1": "create and delete every Compute Engine VM in the project"}


def judge(bindings: list[dict[str, Any]], member: str, needed: list[str],
          carries: dict[str, set[str]] | None = None) -> tuple[list[str], list[str]]:
    """(missing, undecided) among `needed` for `member`, from the project's IAM policy. Missing: no role of the
    member can carry it. Undecided: only a role this table cannot read could (a custom role, another role of the
    same service, a conditional binding), so the host's own check decides."""
    roles: set[str] = set()
    conditional: set[str] = set()
    for b in bindings:
        if member in (b.get("members") or []):
            (conditional if b.get("condition") else roles).add(str(b.get("role", "")))
    carries = carries or CARRIES
    missing: list[str] = []
    undecided: list[str] = []
    for perm in needed:
        if roles & carries[perm]:
            continue
        family = "roles/" + perm.split(".")[0] + "."
        unknown = [r for r in roles | conditional
                   if not r.startswith("roles/") or (r.startswith(family) and not r.endswith("viewer"))
                   or (r in conditional and r in carries[perm])]
        (undecided if unknown else missing).append(perm)
    return missing, undecided


def _policy(spec: ClusterSpec, account: str, consequence: str) -> dict[str, Any] | None:
    """The project's IAM policy, read with the user's own credentials (projects.getIamPolicy needs
    resourcemanager.projects.getIamPolicy, which Viewer and Editor hold; testIamPermissions cannot answer for another
    principal); None when it cannot be read for a reason that leaves the decision to the identity's own check.
    Raises when Resource Manager is disabled: then that check could not be made either."""
    try:
        return _post(_endpoint() or "", f"v1/projects/{spec.project}:getIamPolicy",
                     {"options": {"requestedPolicyVersion": 3}})
    except Exception as e:  # noqa: BLE001 - only a disabled API is certain; anything else leaves it to the host
        if isinstance(e, _Refused) and e.disabled:
            raise TpuctlError(ErrorKind.PERMISSION, f"the {e.disabled} API is disabled in project {spec.project}: "
                              f"{consequence}", f"gcloud services enable {e.disabled} --project {spec.project}, then "
                              "run the same `tpuctl up` again") from None
        return None


def _grant_commands(project: str, account: str, roles: list[str], reach: dict[str, str]) -> str:
    return "; ".join(f"gcloud projects add-iam-policy-binding {project} --member=serviceAccount:{account} "
                     f"--role={r}" + (f" (it lets anything on the host {reach[r]})" if r in reach else "")
                     for r in roles)


_UNSEEN = ("A grant on a folder or the organisation does not show in the project's policy: TPUCTL_TRUST_HOST_CHECK=1 "
           "leaves the decision to the host")


def check_self_teardown(spec: ClusterSpec, account: str, needed: list[str]) -> list[str]:
    """Before anything is made for `up --autostop/--max-duration`: can `account`, the identity the TPU's host will
    run as, delete the compute? Raises TpuctlError(PERMISSION) when the project's policy shows it certainly cannot,
    or when Resource Manager is disabled (then the host could not check either); returns warnings when it cannot
    tell. The host's report after boot stays the final word. `needed`: the permissions that takes (gcp/teardown.py)."""
    if _endpoint() is None:
        return []
    policy = _policy(spec, account, "the TPU's host could not check that it may delete its own compute, so "
                     "autostop, --max-duration and --down would not be enforced")
    if policy is None:
        return [f"could not read project {spec.project}'s IAM policy; the host checks {account} once it boots"]
    missing, undecided = judge(policy.get("bindings") or [], f"serviceAccount:{account}", needed)
    if missing and not os.environ.get("TPUCTL_TRUST_HOST_CHECK"):
        roles = sorted({ROLE[p] for p in missing})
        raise TpuctlError(ErrorKind.PERMISSION, f"{account}, the identity the TPU would run as, holds no role with "
                          f"{', '.join(missing)} in project {spec.project}: its host could not end the compute "
                          "(autostop, --max-duration, --down)",
                          f"grant it ({_grant_commands(spec.project, account, roles, REACH)}), or pass "
                          "--service-account ACCOUNT that holds it, or drop --autostop and --max-duration; nothing was "
                          f"created. {_UNSEEN}")
    if missing or undecided:
        return [f"cannot tell from project {spec.project}'s policy whether {account} holds "
                f"{', '.join(missing + undecided)}: the host checks once it boots"]
    return []


def check_watcher(spec: ClusterSpec, account: str, needs: dict[str, tuple[str, set[str]]]) -> list[str]:
    """Before anything is made for `up --recover --watcher vm`: can `account`, the identity the watcher VM runs
    as, re-create the TPU (`needs`: permission -> (the role to grant, the roles that carry it))? As
    check_self_teardown, from the project's policy."""
    if _endpoint() is None:
        return []
    policy = _policy(spec, account, "the watcher could not be checked")
    if policy is None:
        return [f"could not read project {spec.project}'s IAM policy: whether {account} may re-create the TPU is "
                "seen only when it first has to"]
    missing, undecided = judge(policy.get("bindings") or [], f"serviceAccount:{account}", sorted(needs),
                               {p: carriers for p, (_, carriers) in needs.items()})
    if missing and not os.environ.get("TPUCTL_TRUST_HOST_CHECK"):
        roles = sorted({needs[p][0] for p in missing})
        raise TpuctlError(ErrorKind.PERMISSION, f"{account}, the identity the watcher VM would run as, holds no role "
                          f"with {', '.join(missing)} in project {spec.project}: it could not re-create a preempted TPU",
                          f"grant it ({_grant_commands(spec.project, account, roles, REACH)}), or pass "
                          "--service-account ACCOUNT that holds it, or run the watcher on your own machine "
                          f"(--watcher local); nothing was created. {_UNSEEN}")
    if missing or undecided:
        return [f"cannot tell from project {spec.project}'s policy whether {account} holds "
                f"{', '.join(missing + undecided)}"]
    return []
