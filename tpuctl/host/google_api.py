"""Google APIs called by the agent ON a Google Cloud host, as the host's own identity: whether that identity may
delete the cluster's compute, and the deletion itself (autostop, --max-duration, submit --down; lifecycle.py).

Plain REST over urllib with the token of the host's service account from the metadata server
(`GET http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token` with
`Metadata-Flavor: Google`; cloud.google.com/compute/docs/access/authenticate-workloads), so the host needs no
google-cloud-tpu or google-cloud-compute package and a host that cannot reach an API fails one call, not its boot.
Endpoints (emulators in tests, as STORAGE_EMULATOR_HOST is for Storage):
  TPU_REST_EMULATOR_HOST          else https://tpu.googleapis.com
  COMPUTE_EMULATOR_HOST           else https://compute.googleapis.com
  RESOURCE_MANAGER_EMULATOR_HOST  else https://cloudresourcemanager.googleapis.com
"""
from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from ..core.errors import disabled_api

_BASES = {"tpu": ("TPU_REST_EMULATOR_HOST", "https://tpu.googleapis.com"),
          "compute": ("COMPUTE_EMULATOR_HOST", "https://compute.googleapis.com"),
          "resourcemanager": ("RESOURCE_MANAGER_EMULATOR_HOST", "https://cloudresourcemanager.googleapis.com")}
TIMEOUT = 30.0


class ApiError(Exception):
    def __init__(self, status: int, message: str, disabled: str = "") -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.disabled = disabled   # the API the project has not enabled, when that is why (core.errors.disabled_api)


def _metadata(path: str) -> str:
    host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    req = urllib.request.Request(f"http://{host}/computeMetadata/v1/{path}", headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()


def identity() -> str:
    """The email of the service account the host runs as."""
    return _metadata("instance/service-accounts/default/email").strip()


def attribute(name: str) -> str:
    """One of the instance's metadata attributes (`instance/attributes/<name>`), as the metadata server serves it."""
    return _metadata(f"instance/attributes/{name}")


def _token() -> str:
    return str(json.loads(_metadata("instance/service-accounts/default/token"))["access_token"])


def call(api: str, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One REST call as the host; the decoded JSON answer, or ApiError carrying Google's error message."""
    env, default = _BASES[api]
    base = os.environ.get(env, default).rstrip("/")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{base}/{path}", data=data, method=method,
                                 headers={"Authorization": f"Bearer {_token()}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        try:
            message = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = text[:300]
        raise ApiError(e.code, message, disabled_api(e.code, text)) from None
    return json.loads(raw) if raw.strip() else {}


@dataclass
class Target:
    """One thing the host deletes to end the compute, in order (the TPU before the VM that asks)."""
    api: str           # "tpu" or "compute"
    path: str          # the REST path after the API's base URL, query included
    permission: str    # what the host's identity needs for it
    kind: str = ""     # "queued", "node" or "vm" (providers/gcp/teardown.py targets)


def targets(record: dict[str, Any]) -> list[Target]:
    return [Target(str(t["api"]), str(t["path"]), str(t["permission"]), str(t.get("kind", "")))
            for t in record.get("delete") or []]


def held(project: str, permissions: list[str]) -> set[str]:
    """projects.testIamPermissions as the host: the subset of `permissions` its identity holds in the project
    (cloud.google.com/resource-manager/reference/rest/v1/projects/testIamPermissions)."""
    answer = call("resourcemanager", "POST", f"v1/projects/{project}:testIamPermissions",
                  {"permissions": permissions})
    return set(answer.get("permissions", []))


def delete(target: Target) -> bool:
    """Ask for the deletion: True when asked, False when the answer is 404, already gone. The host does not wait
    for the operation: the deletion ends the host itself."""
    try:
        call(target.api, "DELETE", target.path)
    except ApiError as e:
        if e.status != 404:
            raise
        return False
    return True


def delete_all(targets: list[Target]) -> None:
    """Each deletion in order. A queued request deleted with force deletes its nodes first ("all running nodes
    belonging to this queued resource will be deleted first", REST reference of queuedResources.delete), so once
    that is asked, asking for its nodes again only catches one it left; how Google answers a deletion of a node
    already being deleted is not established, so a refusal of such a node is said and is no failure."""
    taken = False   # a queued request's forced deletion was asked: its nodes go with it
    for target in targets:
        try:
            asked = delete(target)
        except ApiError as e:
            if not (taken and target.kind == "node"):
                raise
            print(f"tpuctl agent: left to the queued request's deletion: {target.path}: {e}", file=sys.stderr,
                  flush=True)
            continue
        taken = taken or (asked and target.kind == "queued")
