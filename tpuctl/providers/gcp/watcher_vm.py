"""The recovery watcher's VM (`up --recover --watcher vm`): an e2-micro that runs `python -m tpuctl.watcher` as a
systemd service (templates/startup.sh, role watcher-vm), installed from the watcher package in the store
(agent_package.build(WATCHER)), as the same identity as the TPU, so the bucket grants the TPU has serve it too.

Where (zone_for): it only talks to Google's APIs, so it need not sit beside the TPU. It goes in the TPU's zone when
that is an ordinary zone of a free-tier region, else in an ordinary zone of a free-tier region: never in an AI zone
(`...-ai1a`: Google advises against general workloads there, and each must be enabled per project) nor in
us-central2-b (v4's restricted region), where a plain VM may be refused. Its network is the TPU's (`up --network`,
else `default`, whose auto-mode subnets cover every region); with `up --subnetwork`, which is regional, it stays in
the TPU's region, so that region must be a free-tier one (else --watcher vm is refused). It keeps an external address, because at boot it
installs python3-venv from Debian's mirrors and the watcher's clients from PyPI, which Private Google Access (Google
APIs only) does not reach.

Price: e2-micro $0.0084/h in us-central1 plus its external IPv4 address $0.005/h. Google's free tier covers one
non-preemptible e2-micro's hours a month, across the whole billing account (not per project: another e2-micro in
the account uses them up), in us-west1, us-central1 and us-east1, with 30 GB-months of standard disk
(cloud.google.com/free/docs/free-cloud-features#compute); whether it covers the external address is not stated
there, so tpuctl does not call it free.

What that identity must hold in the project to re-create the TPU (roles in cloud.google.com/iam/docs/
understanding-roles), checked from the project's IAM policy before anything is made, as for autostop
(permissions.check_self_teardown).
"""
from __future__ import annotations

from ...core.catalog import region_of
from ...core.errors import ErrorKind, TpuctlError, bad_input
from ...core.models import Arch, ClusterSpec, ClusterState
from ..base import Progress, Reporter, progress_of
from ..google import permissions, vms
from ..google.iam import BucketIam
from ..google.vms import ROLE_LABEL

MACHINE_TYPE = "e2-micro"
HOURLY = 0.0084 + 0.005
# The free tier's regions and their ordinary zones (cloud.google.com/compute/docs/regions-zones: us-east1 has no -a).
FREE_TIER_ZONES = {"us-central1": ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"),
                   "us-west1": ("us-west1-a", "us-west1-b", "us-west1-c"),
                   "us-east1": ("us-east1-b", "us-east1-c", "us-east1-d")}
FREE_TIER_REGIONS = tuple(FREE_TIER_ZONES)

# permission -> the role that carries it, and every predefined role known to carry it
# A queued request is checked by tpu.nodes.create and tpu.nodes.delete like a node (teardown.QUEUED_DELETE: no
# queued-resource permission is listed among TPU Admin's).
_TPU = {"roles/owner", "roles/editor", "roles/tpu.admin", "roles/tpu.editor"}
NEEDS = {"tpu.nodes.create": ("roles/tpu.admin", _TPU), "tpu.nodes.delete": ("roles/tpu.admin", _TPU),
         "iam.serviceAccounts.actAs": ("roles/iam.serviceAccountUser",
                                       {"roles/owner", "roles/editor", "roles/iam.serviceAccountUser"})}
NODE_NEEDS = {"compute.instances.create": ("roles/compute.instanceAdmin.v1",
                                           {"roles/owner", "roles/editor", "roles/compute.admin",
                                            "roles/compute.instanceAdmin", "roles/compute.instanceAdmin.v1"})}
DEFAULT_SA_NEEDS = {"compute.projects.get": ("roles/compute.viewer",
                                             {"roles/owner", "roles/editor", "roles/viewer", "roles/compute.viewer",
                                              "roles/compute.admin", "roles/compute.instanceAdmin.v1"})}


def name(spec: ClusterSpec) -> str:
    return f"tpuctl-{spec.name}-watch"


def needs(spec: ClusterSpec) -> dict[str, tuple[str, set[str]]]:
    return {**NEEDS, **(NODE_NEEDS if spec.arch is Arch.NODE else {}),
            **({} if spec.service_account else DEFAULT_SA_NEEDS)}


def zone_for(tpu_zone: str, subnetwork: str = "") -> str:
    """The watcher VM's zone for a TPU in `tpu_zone` (see the module's docstring). On a named subnetwork, which
    is regional, it must stay in the TPU's region: refused where that region has no free-tier zone."""
    region = region_of(tpu_zone)
    if subnetwork and region not in FREE_TIER_ZONES:
        raise bad_input(f"--watcher vm with --subnetwork {subnetwork}: the watcher VM would have to sit in "
                        f"{region}, the subnetwork's region, and tpuctl puts it only in {', '.join(FREE_TIER_REGIONS)}",
                        "use --watcher local (tpuctl watch on a machine that stays on), or leave --subnetwork out")
    ordinary = FREE_TIER_ZONES.get(region, FREE_TIER_ZONES["us-central1"])
    return tpu_zone if tpu_zone in ordinary else ordinary[0]


def price_text(zone: str) -> str:
    free = region_of(zone) in FREE_TIER_REGIONS
    return (f"watcher VM {MACHINE_TYPE} ~${HOURLY:.3f}/h (${0.005:.3f}/h of it for its external address"
            + (f"; the free tier may cover its {MACHINE_TYPE} hours in {region_of(zone)}: one e2-micro's a month "
               f"across your billing account)" if free else
               f"; the free tier covers {MACHINE_TYPE} only in {', '.join(FREE_TIER_REGIONS)})"))


def shape(spec: ClusterSpec) -> vms.VmShape:
    return vms.VmShape(name(spec), MACHINE_TYPE, 10, f"tpuctl cluster {spec.name}: its recovery watcher",
                           {**spec.labels, ROLE_LABEL: "watcher"})


def ensure(st: ClusterState, zone: str, script: str, nonce: str, progress: Progress) -> bool:
    spec = st.spec
    vm = vms.find(spec.project, name(spec), zone)
    if vm is not None:
        if vm.labels.get(ROLE_LABEL) != "watcher":
            raise TpuctlError(ErrorKind.INPUT, f"VM {name(spec)} in {zone} is not tpuctl's watcher; not touching it",
                              "delete or rename it, or use another -c NAME")
        progress(vm.status)
        return False
    return vms.create(spec.project, spec, zone, script, nonce, progress, shape(spec))


def delete(st: ClusterState, zone: str, progress: Progress) -> None:
    vms.delete(st.spec.project, name(st.spec), zone, st.spec.name, progress)


def state(st: ClusterState, zone: str) -> str:
    vm = vms.find(st.spec.project, name(st.spec), zone)
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

    def zone(self, spec: ClusterSpec, tpu_zone: str) -> str:
        return zone_for(tpu_zone, spec.subnetwork)

    def ensure(self, st: ClusterState, zone: str, reporter: Reporter) -> bool:
        from .. import agent_package
        from ..google.gcs_store import GcsStore
        from .startup import render
        GcsStore(st.spec.store, st.spec.project).write(agent_package.key(agent_package.WATCHER),
                                                       agent_package.build(agent_package.WATCHER))
        script = render(st.spec.store, st.spec.name, "watcher-vm", "")
        return ensure(st, zone, script, self.nonce, progress_of(reporter, "vm", name(st.spec)))

    def delete(self, st: ClusterState, zone: str, reporter: Reporter) -> None:
        delete(st, zone, progress_of(reporter, "vm", name(st.spec)))

    def state(self, st: ClusterState, zone: str) -> str:
        return state(st, zone)
