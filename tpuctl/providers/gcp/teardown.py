"""A Google Cloud host ending its own compute (autostop, --max-duration, submit --down): what it deletes, and
whether its identity may, as the host itself reported it (host/autostop.py, host/google_api.py).

Why no narrow grant: IAM Conditions can scope a role to one resource by `resource.name` only for the services
listed at cloud.google.com/iam/docs/conditions-resource-attributes ("Other services and resource types do not
recognize resource attributes"); tpu.googleapis.com is not among them. So tpu.nodes.delete can be held only for
the whole project, and tpuctl does not grant it: the host reports what its identity holds and `up --autostop`
refuses to call autostop armed when the report says no, naming the grant and how far it reaches.
"""
from __future__ import annotations

from ...core import layout, runs
from ...core.models import Arch, ClusterSpec, ClusterState
from ...core.store import BlobStore
from ..base import Enforcement
from ..google.permissions import REACH, ROLE
from .compute import gce_requests

# Which permission Google checks for a queued resource's create and delete is not documented (the REST reference
# shows none that could be read here). Google's Cloud TPU roles page (cloud.google.com/iam/docs/roles-permissions/
# tpu) expands TPU Admin's `tpu.*` to accelerator types, locations, nodes, operations, runtime versions and TensorFlow
# versions: no tpu.queuedResources.* (nor tpu.queuedresources.*) permission exists to hold. A queued resource makes
# and deletes nodes, so tpuctl checks tpu.nodes.create / tpu.nodes.delete for it (watcher_vm.NEEDS), which every role able to manage
# TPUs carries; asking testIamPermissions about a name IAM does not know may be refused outright (400 INVALID_ARGUMENT,
# as googleapis/google-cloud-python#1776 reports of another backend).
QUEUED_DELETE = "tpu.nodes.delete"


def _steps(spec: ClusterSpec) -> list[tuple[str, str]]:
    """(what, the permission checked for it) of each deletion, in order; known before anything exists."""
    if spec.api:   # Compute Engine (gce.py): the TPU VM, or each slice's MIG, which deletes its VMs
        return [("mig", "compute.instanceGroupManagers.delete")] if gce_requests.is_mig(spec) \
            else [("vm", "compute.instances.delete")]
    return ([("queued", QUEUED_DELETE)] if spec.queued else []) + [("node", "tpu.nodes.delete")] \
        + ([("vm", "compute.instances.delete")] if spec.arch is Arch.NODE else [])


def needed(spec: ClusterSpec) -> list[str]:
    """The permissions the host's identity needs to end the compute, each once."""
    return list(dict.fromkeys(p for _, p in _steps(spec)))


def targets(st: ClusterState) -> list[dict[str, str]]:
    """What the host deletes, in order: its queued request with force, which deletes its nodes first
    (cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/delete), then each TPU node by
    its own name (v2 for a TPU VM, v1 for a legacy node): the one node, or every slice's `<prefix>-K` of a
    Multislice (ClusterSpec.node_names), then the legacy node's VM, which is the host asking and so goes last (REST
    paths: cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/delete,
    compute/docs/reference/rest/v1/instances/delete). `kind` tells the host which is which (host/google_api.py)."""
    s = st.spec
    if s.api:   # the host's own slice (slice 0: worker 0 asks) last; a MIG's template and policy are left to `down`
        zonal = f"compute/v1/projects/{s.project}/zones/{st.zone}"
        if not gce_requests.is_mig(s):
            return [{"api": "compute", "path": f"{zonal}/instances/{s.tpu_name}",
                     "permission": "compute.instances.delete", "kind": "vm"}]
        return [{"api": "compute", "path": f"{zonal}/instanceGroupManagers/{name}",
                 "permission": "compute.instanceGroupManagers.delete", "kind": "mig"}
                for name in reversed(s.node_names)]
    tpu = f"{'v2' if s.arch is Arch.VM else 'v1'}/projects/{s.project}/locations/{st.zone}"
    where = {"queued": [("tpu", f"v2/projects/{s.project}/locations/{st.zone}/queuedResources/{s.qr_name}"
                                "?force=true")],
             "node": [("tpu", f"{tpu}/nodes/{node}") for node in s.node_names],
             "vm": [("compute", f"compute/v1/projects/{s.project}/zones/{st.zone}/instances/{s.vm_name}")]}
    return [{"api": api, "path": path, "permission": p, "kind": what}
            for what, p in _steps(s) for api, path in where[what]]


def enforcement(store: BlobStore, st: ClusterState) -> Enforcement:
    record = runs.read_object(store, layout.CLUSTER_RECORD)
    report = runs.read_object(store, layout.TEARDOWN_CHECK)
    if not record or not report or report.get("for") != record.get("written"):
        return Enforcement(None, "the host has not yet reported whether it may delete its own compute")
    who = str(report.get("identity") or "the host's service account")
    if report.get("able"):
        return Enforcement(True, f"the host, as {who}")
    if report.get("disabled_api"):
        api = str(report["disabled_api"])
        return Enforcement(False, f"the host cannot check what its identity {who} may delete: the {api} API is "
                                  f"disabled in project {st.spec.project}",
                           f"gcloud services enable {api} --project {st.spec.project}; then run `tpuctl up -c "
                           f"{st.name}` again, or `tpuctl down -c {st.name}` when done")
    missing = [str(p) for p in report.get("missing") or []]
    roles = sorted({ROLE.get(p, "a role with " + p) for p in missing})
    text = f"the host's identity {who} lacks {', '.join(missing)} in project {st.spec.project}"
    if report.get("error"):
        text += f" (its check failed: {report['error']})"
    grants = "; ".join(f"gcloud projects add-iam-policy-binding {st.spec.project} --member=serviceAccount:{who} "
                       f"--role={r}" for r in roles)
    reach = "; ".join(f"{r} lets anything running on the host {REACH[r]}" for r in roles if r in REACH)
    hint = (f"grant it ({grants}; {reach}, since IAM conditions cannot narrow TPU permissions to one TPU), or "
            f"make the cluster with --service-account ACCOUNT that holds it; then run `tpuctl up -c {st.name}` "
            f"again, or `tpuctl down -c {st.name}` when done")
    return Enforcement(False, text, hint)

