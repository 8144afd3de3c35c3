"""The recovery watcher's VM (`up --recover --watcher vm`): an e2-micro in the cluster's zone that runs
`python -m tpuctl.watcher` as a systemd service (templates/startup.sh, role watcher-vm), installed from the
watcher package in the store (agent_package.build(WATCHER)), as the same identity as the TPU, so the bucket
grants the TPU has serve it too.

Price: e2-micro $0.0084/h in us-central1 plus its external IPv4 address $0.005/h; Google's free tier covers one
non-preemptible e2-micro a month in us-west1, us-central1 and us-east1, with 30 GB-months of standard disk
(cloud.google.com/free/docs/free-cloud-features#compute).

What that identity must hold in the project to re-create the TPU (roles in cloud.google.com/iam/docs/
understanding-roles), checked from the project's IAM policy before anything is made, as for autostop
(permissions.check_self_teardown).
"""
from __future__ import annotations

from ...core.catalog import region_of
from ...core.errors import ErrorKind, TpuctlError
from ...core.models import Arch, ClusterSpec, ClusterState
from ..base import Progress, Reporter, progress_of
from . import compute, permissions
from .iam import BucketIam

MACHINE_TYPE = "e2-micro"
HOURLY = 0.0084 + 0.005
FREE_TIER_REGIONS = ("us-west1", "us-central1", "us-east1")
ROLE_LABEL = "tpuctl-role"

# permission -> the role that carries it, and every predefined role known to carry it
NEEDS = {"tpu.nodes.create": ("roles/tpu.admin", {"roles/owner", "roles/editor", "roles/tpu.admin"}),
         "tpu.nodes.delete": ("roles/tpu.admin", {"roles/owner", "roles/editor", "roles/tpu.admin"}),
         "iam.serviceAccounts.actAs": ("roles/iam.serviceAccountUser",
                                       {"roles/owner", "roles/editor", "roles/iam.serviceAccountUser"})}
QUEUED_NEEDS = {"tpu.queuedResources.create": ("roles/tpu.admin", {"roles/owner", "roles/editor",
                                                                   "roles/tpu.admin"})}
NODE_NEEDS = {"compute.instances.create": ("roles/compute.instanceAdmin.v1",
                                           {"roles/owner", "roles/editor", "roles/compute.admin",
                                            "roles/compute.instanceAdmin", "roles/compute.instanceAdmin.v1"})}
DEFAULT_SA_NEEDS = {"compute.projects.get": ("roles/compute.viewer",
                                             {"roles/owner", "roles/editor", "roles/viewer", "roles/compute.viewer",
                                              "roles/compute.admin", "roles/compute.instanceAdmin.v1"})}


def name(spec: ClusterSpec) -> str:
    return f"tpuctl-{spec.name}-watch"


def needs(spec: ClusterSpec) -> dict[str, tuple[str, set[str]]]:
    return {**NEEDS, **(QUEUED_NEEDS if spec.queued else {}), **(NODE_NEEDS if spec.arch is Arch.NODE else {}),
            **({} if spec.service_account else DEFAULT_SA_NEEDS)}


def price_text(zone: str) -> str:
    free = region_of(zone) in FREE_TIER_REGIONS
    return (f"watcher VM {MACHINE_TYPE} ~${HOURLY:.3f}/h (${0.005:.3f}/h for its address"
            + (f"; its {MACHINE_TYPE} hours fall under the free tier in {region_of(zone)})" if free else
               f"; the free tier covers {MACHINE_TYPE} only in {', '.join(FREE_TIER_REGIONS)})"))


def shape(spec: ClusterSpec) -> compute.VmShape:
    return compute.VmShape(name(spec), MACHINE_TYPE, 10, f"tpuctl cluster {spec.name}: its recovery watcher",
                           {**spec.labels, ROLE_LABEL: "watcher"})


def ensure(st: ClusterState, zone: str, script: str, nonce: str, progress: Progress) -> bool:
    spec = st.spec
    vm = compute.find(spec.project, name(spec), zone)
    if vm is not None:
        if vm.labels.get(ROLE_LABEL) != "watcher":
            raise TpuctlError(ErrorKind.INPUT, f"VM {name(spec)} in {zone} is not tpuctl's watcher; not touching it",
                              "delete or rename it, or use another -c NAME")
        progress(vm.status)
        return False
    return compute.create(spec.project, spec, zone, script, nonce, progress, shape(spec))


def delete(st: ClusterState, zone: str, progress: Progress) -> None:
    compute.delete(st.spec.project, name(st.spec), zone, st.spec.name, progress)


def state(st: ClusterState, zone: str) -> str:
    vm = compute.find(st.spec.project, name(st.spec), zone)
    return vm.status if vm is not None else "MISSING"


class GcpWatcherHost:
    """providers/base.py WatcherHost over Compute Engine."""

    hourly = HOURLY

    def __init__(self, grants: BucketIam, nonce: str) -> None:
        self.grants, self.nonce = grants, nonce

    def account(self, spec: ClusterSpec) -> str:
        return spec.service_account or self.grants.default_service_account(spec.project)

    def check(self, spec: ClusterSpec) -> list[str]:
        return permissions.check_watcher(spec, self.account(spec), needs(spec))

    def name(self, spec: ClusterSpec) -> str:
        return name(spec)

    def price(self, zone: str) -> str:
        return price_text(zone)

    def ensure(self, st: ClusterState, zone: str, reporter: Reporter) -> bool:
        from .. import agent_package
        from .gcs_store import GcsStore
        from .startup import render
        GcsStore(st.spec.store, st.spec.project).write(agent_package.key(agent_package.WATCHER),
                                                       agent_package.build(agent_package.WATCHER))
        script = render(st.spec.store, st.spec.name, "watcher-vm", "")
        return ensure(st, zone, script, self.nonce, progress_of(reporter, "vm", name(st.spec)))

    def delete(self, st: ClusterState, zone: str, reporter: Reporter) -> None:
        delete(st, zone, progress_of(reporter, "vm", name(st.spec)))

    def state(self, st: ClusterState, zone: str) -> str:
        return state(st, zone)
