"""A wire-level fake of Resource Manager's projects.testIamPermissions (v1) over a project IAM policy with
conditions, which the fake TPU and Compute APIs also ask before a host's own deletion.

Documented behaviours modelled:
- POST /v1/projects/{resource}:testIamPermissions with {"permissions": [...]} answers {"permissions": [the subset
  held]}; the field is omitted when none is held, as proto3 JSON omits empty lists
  (cloud.google.com/resource-manager/reference/rest/v1/projects/testIamPermissions).
- The caller is whoever the bearer token names: a host's metadata token is `token-of-EMAIL` (tpu_host.py), so a
  host is `serviceAccount:EMAIL`; a call without a token is the test's user, whose permissions are `held` (None:
  every one asked).
- A binding grants its role's permissions (a few predefined roles, from cloud.google.com/iam/docs/
  understanding-roles) to its members; a binding with a condition grants only when the condition holds for the
  resource asked about. `resource.name` and `resource.service` are known only to the services listed at
  cloud.google.com/iam/docs/conditions-resource-attributes ("Other services and resource types do not recognize
  resource attributes"): tpu.googleapis.com is not one, so a condition on a TPU's name never grants a TPU
  permission. A project-level testIamPermissions is about the project (projects/P, cloudresourcemanager).
- POST /v1/projects/{resource}:getIamPolicy answers the policy {"version", "etag", "bindings"}; the caller needs
  resourcemanager.projects.getIamPolicy (cloud.google.com/resource-manager/reference/rest/v1/projects/getIamPolicy).
- `disabled` answers every call as Google does in a project that has not enabled the API: 403 PERMISSION_DENIED
  "Cloud Resource Manager API has not been used in project N before or it is disabled. Enable it by visiting
  https://console.developers.google.com/apis/api/cloudresourcemanager.googleapis.com/overview?project=N then retry.
  ..." (googleapis/python-resource-manager#129) with an ErrorInfo, reason SERVICE_DISABLED, naming the service
  (cloud.google.com/apis/design/errors).
- `status` makes every call fail with that HTTP status, for any other reason.
- testIamPermissions about a permission Google's role pages do not list: see `unknown_permissions`.
- `withhold_default_editor()`: the project as an organisation enforcing
  iam.managed.preventPrivilegedBasicRolesForDefaultServiceAccounts leaves it: the default account holds no role.
"""
from __future__ import annotations

import json
import os
import re

from fakes.wire import QuietHandler, send_error, send_json, serve

_ROUTE = re.compile(r"^/v1/projects/(?P<project>[^/:]+):(?P<method>testIamPermissions|getIamPolicy)$")
# Every tpu.* permission, as Google's Cloud TPU roles page lists TPU Admin's `tpu.*`
# (cloud.google.com/iam/docs/roles-permissions/tpu): no permission for queued resources exists there.
TPU_PERMISSIONS = tuple(f"tpu.{p}" for p in (
    "acceleratortypes.get", "acceleratortypes.list", "locations.get", "locations.list", "nodes.create",
    "nodes.createTagBinding", "nodes.delete", "nodes.deleteTagBinding", "nodes.get", "nodes.list",
    "nodes.listEffectiveTags", "nodes.listTagBindings", "nodes.performMaintenance", "nodes.reimage", "nodes.reset",
    "nodes.simulateMaintenanceEvent", "nodes.start", "nodes.stop", "nodes.update", "operations.get", "operations.list",
    "runtimeversions.get", "runtimeversions.list", "tensorflowversions.get", "tensorflowversions.list"))
# The other permissions tpuctl and its hosts ask about, each named on Google's role pages.
OTHER_PERMISSIONS = ("compute.instances.create", "compute.instances.delete", "compute.instances.get",
                     "compute.projects.get", "storage.buckets.create", "storage.buckets.get",
                     "storage.buckets.setIamPolicy", "iam.serviceAccounts.actAs", "resourcemanager.projects.get",
                     "resourcemanager.projects.getIamPolicy",
                     # GKE (kubernetes-engine/docs/how-to/iam: container.clusters.*, container.operations.*) and the
                     # TPU7x workload policy (compute/docs/access/iam: compute.resourcePolicies.*)
                     "container.clusters.create", "container.clusters.delete", "container.clusters.get",
                     "container.clusters.update", "container.operations.get", "compute.resourcePolicies.create",
                     "compute.resourcePolicies.delete",
                     # Compute Engine TPUs' templates and MIGs (compute/docs/access/iam; A4/A3U MIG page names
                     # compute.instanceGroupManagers.create, GCE_TPU_FACTS §7)
                     "compute.instanceTemplates.create", "compute.instanceTemplates.delete",
                     "compute.instanceGroupManagers.create", "compute.instanceGroupManagers.delete",
                     # a MIG reads its template (compute/docs/access/iam: instanceTemplates.useReadOnly), and a
                     # reservation is read to tell its kind (issue 59)
                     "compute.instanceTemplates.useReadOnly", "compute.reservations.get")
# Predefined roles as prefixes of the permissions they carry (a subset: what tpuctl and its hosts ask).
ROLES = {
    "roles/owner": ("",),
    "roles/editor": ("tpu.", "compute.", "storage.", "iam.serviceAccounts.actAs", "container."),
    "roles/container.admin": ("container.",),
    "roles/tpu.admin": TPU_PERMISSIONS,
    "roles/tpu.editor": ("tpu.nodes.create", "tpu.nodes.delete", "tpu.nodes.get", "tpu.operations.get"),
    "roles/viewer": ("resourcemanager.projects.get", "tpu.nodes.get", "tpu.nodes.list"),
    "roles/tpu.viewer": ("tpu.nodes.get", "tpu.nodes.list", "tpu.operations.get"),
    # Compute Instance Admin (v1) also carries templates, MIGs and resource policies: the multi-host slice quickstart
    # asks for it alone (compute/docs/tpus/quickstart-create-tpu-multi-host-slice, GCE_TPU_FACTS §7)
    "roles/compute.instanceAdmin.v1": ("compute.instances.", "compute.instanceTemplates.",
                                       "compute.instanceGroupManagers.", "compute.resourcePolicies.",
                                       "compute.reservations."),
    "roles/iam.serviceAccountUser": ("iam.serviceAccounts.actAs",),
}
ATTRIBUTE_SERVICES = {"cloudresourcemanager.googleapis.com", "compute.googleapis.com", "storage.googleapis.com"}
_COND = re.compile(r'^resource\.name\s*(==\s*"(?P<eq>[^"]*)"|\.startsWith\("(?P<prefix>[^"]*)"\))$')


def member_of(authorization: str | None) -> str | None:
    """The principal a request's Authorization header names; None for no token (the test's user)."""
    if not authorization:
        return None
    token = authorization.removeprefix("Bearer ").strip()
    return f"serviceAccount:{token.removeprefix('token-of-')}" if token.startswith("token-of-") else "invalid"


class FakeResourceManager:
    def __init__(self) -> None:
        self.held: set[str] | None = None
        self.status = 200
        self.disabled = False
        self.project_number = 424242
        self.calls: list[tuple[str, list[str]]] = []
        self.bindings: list[dict] = []   # {"role", "members", ["condition": {"expression"}]} as in an IAM policy
        # A permission IAM does not know: refused with 400 INVALID_ARGUMENT, as a Pub/Sub backend does
        # (googleapis/google-cloud-python#1776), or answered as not held ("not_held"); which one Resource Manager
        # does is not documented, and tpuctl asks only about permissions Google lists.
        self.unknown_permissions = os.environ.get("FAKE_IAM_UNKNOWN_PERMISSIONS", "invalid")

    def reset(self, default_account: str) -> None:
        """A fresh project: its Compute Engine default service account holds roles/editor, as Google grants it on
        projects made before the constraint iam.automaticIamGrantsForDefaultServiceAccounts (May 2024) applies."""
        self.held, self.status, self.calls, self.disabled = None, 200, [], False
        self.default_account = default_account
        self.bindings = [{"role": "roles/editor", "members": [f"serviceAccount:{default_account}"]}]

    def withhold_default_editor(self) -> None:
        self.bindings = [b for b in self.bindings if b["members"] != [f"serviceAccount:{self.default_account}"]]

    def allows(self, member: str | None, permission: str, resource: str, service: str) -> bool:
        if member is None:
            return self.held is None or permission in self.held
        for b in self.bindings:
            if member not in b["members"] or not any(permission.startswith(p) for p in ROLES.get(b["role"], ())):
                continue
            expr = (b.get("condition") or {}).get("expression")
            if expr is None or self._holds(expr, resource, service):
                return True
        return False

    @staticmethod
    def _holds(expression: str, resource: str, service: str) -> bool:
        if service not in ATTRIBUTE_SERVICES:
            return False   # the service knows no resource attributes: the condition cannot be true
        m = _COND.match(expression.strip())
        if not m:
            raise ValueError(f"the fake evaluates only resource.name conditions, not {expression!r}")
        return resource == m["eq"] if m["eq"] is not None else resource.startswith(m["prefix"])

    def start(self) -> str:
        fake = self

        class Handler(QuietHandler):
            def do_POST(self):
                m = _ROUTE.match(self.path.split("?")[0])
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not m:
                    return send_error(self, 404, "NOT_FOUND", "not found")
                member = member_of(self.headers.get("Authorization"))
                if member == "invalid":
                    return send_error(self, 401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
                fake.calls.append((m["project"], body.get("permissions", [m["method"]])))
                if fake.disabled:
                    n = fake.project_number
                    return send_json(self, 403, {"error": {
                        "code": 403, "status": "PERMISSION_DENIED",
                        "message": f"Cloud Resource Manager API has not been used in project {n} before or it is "
                                   "disabled. Enable it by visiting https://console.developers.google.com/apis/api/"
                                   f"cloudresourcemanager.googleapis.com/overview?project={n} then retry. If you "
                                   "enabled this API recently, wait a few minutes for the action to propagate to our "
                                   "systems and retry.",
                        "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "SERVICE_DISABLED",
                                     "domain": "googleapis.com",
                                     "metadata": {"service": "cloudresourcemanager.googleapis.com",
                                                  "consumer": f"projects/{n}"}}]}})
                if fake.status != 200:
                    return send_error(self, fake.status, "PERMISSION_DENIED", "The caller does not have permission")
                if m["method"] == "getIamPolicy":
                    if not fake.allows(member, "resourcemanager.projects.getIamPolicy", f"projects/{m['project']}",
                                       "cloudresourcemanager.googleapis.com"):
                        return send_error(self, 403, "PERMISSION_DENIED", "The caller does not have permission")
                    return send_json(self, 200, {"version": 3, "etag": "BwYfake=", "bindings": fake.bindings})
                unknown = [p for p in body.get("permissions", []) if p not in TPU_PERMISSIONS + OTHER_PERMISSIONS]
                if unknown and fake.unknown_permissions == "invalid":
                    return send_error(self, 400, "INVALID_ARGUMENT", f"Permission {unknown[0]} is not valid.")
                held = [p for p in body.get("permissions", [])
                        if fake.allows(member, p, f"projects/{m['project']}", "cloudresourcemanager.googleapis.com")]
                send_json(self, 200, {"permissions": held} if held else {})

        self.server = serve(Handler)
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
