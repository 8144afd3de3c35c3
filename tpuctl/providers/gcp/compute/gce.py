"""TPUs as Compute Engine resources (`up --api compute`, and always for TPU7x, which the Cloud TPU API does not
serve: tpu/docs/tpus-in-compute-engine). Facts and sources: ../shared/GCE_TPU_FACTS.md (§ numbers below).

A single-host slice is one VM instance of the type's TPU machine type (§2); a multi-host slice is an instance
template, a workload policy (a regional resource policy, HIGH_THROUGHPUT with the slice's accelerator topology) and a
zonal MIG of `vms` instances naming it (§3); `--slices N` is N MIGs on one template and policy. The MIG's bulk mode
(all-or-nothing) is used where Google offers it: flex-start and reservation-bound templates (§3, about-bulk-mode).

What Compute Engine says is mapped onto the TPU API's node states (tpu.py), so health, status, `watch` and the
recovery rules read one vocabulary: RUNNING is READY; PROVISIONING, STAGING, PENDING (flex-start waiting) and a MIG
re-creating a VM (its repair: Google's doing, which spends no recovery attempt) are CREATING/REPAIRING; TERMINATED
or STOPPED (a Spot VM preempted with the STOP action: it cannot be restarted, only deleted and made again, tpu/docs/
spot-compute) is PREEMPTED; gone is MISSING.

Operations: a Compute operation fails in the Python client only when it carries httpErrorStatusCode and
httpErrorMessage (§9, google-api-core extended_operation.py), so every operation is polled here and its `error` read
by tpuctl itself (vms.wait_operation).
"""
from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ....core.catalog import region_of
from ....core.errors import ErrorKind, Scope, TpuctlError
from ....core.models import LABEL, NONCE_LABEL, ClusterSpec, require_owned
from ....core.together import together
from ...base import Progress
from ...google import clients
from ...google.operations import call, get_or_none, wait
from ...google.vms import wait_operation
from .gce_errors import (REFUSALS, STOCKOUT, enum as _enum, flex_wait, list_errors, mig_errors, minutes as _minutes,
                         no_flex_capacity, refused)
from .gce_requests import (build_instance, build_mig, build_policy, build_template, bulk, is_mig, multi_host,
                           owner_of, policies_to_delete, policy_name, template_name)
from .gce_reservations import resolved

# Deadlines per kind of operation: making a slice (its VMs running), deleting a VM or a MIG (whose operation ends
# only when all its VMs are gone: a TPU VM's shutdown), and any other operation (a template, a policy, an insert).
CREATE_DEADLINE = 1800.0
DELETE_DEADLINE = 900.0
OPERATION_DEADLINE = 600.0   # vms.DEADLINE; a flex-start VM's insert adds its whole wait
# Instance.status -> the TPU API node state it means here (module docstring; Instance.status enum, §6).
_STATE = {"RUNNING": "READY", "PROVISIONING": "CREATING", "STAGING": "CREATING", "PENDING": "CREATING",
          "REPAIRING": "REPAIRING", "TERMINATED": "PREEMPTED", "STOPPED": "PREEMPTED", "STOPPING": "STOPPING",
          "PENDING_STOP": "STOPPING", "SUSPENDING": "STOPPING", "SUSPENDED": "STOPPED", "DEPROVISIONING": "DELETING"}
# ManagedInstance.currentAction values that mean the MIG is bringing the VM (back) up (§3 "States").
_MIG_BUSY = {"CREATING", "CREATING_WITHOUT_RETRIES", "RECREATING", "RESTARTING", "STARTING", "REFRESHING",
             "VERIFYING", "RESUMING"}


@dataclass
class Endpoint:
    ip_address: str


@dataclass
class Slice:
    """One slice as tpuctl reads it: a bare VM, or a MIG and its instances (what tpu.facts() and health read)."""
    name: str
    state: str
    labels: dict[str, str]
    service_account: str = ""
    network_endpoints: list[Endpoint] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)
    # What Google says stands in the way of a MIG's VMs, as (where, code, message): read on every poll (mig_errors)
    errors: list[tuple[str, str, str]] = field(default_factory=list)
    status: str = ""   # a bare VM's own Instance.status (PENDING: a flex-start VM waiting for capacity)


# -- reading ----------------------------------------------------------------------------------------------------------
def worker_of(vm: Any) -> int:
    """The worker id Google gave a MIG's VM: tpu-env's TPU_WORKER_ID (`KEY: 'value'` lines), else agent-worker-number,
    from its metadata items (GCE_TPU_FACTS §5: both are the VM's metadata; JAX and the hosts read the same keys from
    the metadata server, which serves the instance's metadata items). A MIG's VM names end in a random suffix (§3
    "Instance names"), so name order says nothing of which VM is worker 0, the coordinator. A VM with neither key
    sorts last."""
    items = {i.key: i.value for i in (vm.metadata.items if vm.metadata else [])}
    for line in items.get("tpu-env", "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "TPU_WORKER_ID" and value.strip().strip("'").isdigit():
            return int(value.strip().strip("'"))
    number = items.get("agent-worker-number", "")
    return int(number) if number.isdigit() else 1 << 30


class ComputeTpus:
    """The cluster's slices as Compute Engine resources, with the find/state/get/delete surface of tpu.TpuApi."""

    def __init__(self, project: str) -> None:
        self.project = project

    def _c(self, kind: str) -> Any:
        return clients.compute(kind)

    def _instance(self, name: str, zone: str) -> Any:
        return get_or_none(self._c("InstancesClient").get, project=self.project, zone=zone, instance=name,
                           what=f"get VM {name}")

    def _mig(self, name: str, zone: str) -> Any:
        return get_or_none(self._c("InstanceGroupManagersClient").get, project=self.project, zone=zone,
                           instance_group_manager=name, what=f"get MIG {name}")

    def managed(self, name: str, zone: str) -> list[Any]:
        client = self._c("InstanceGroupManagersClient")
        return call(lambda: list(client.list_managed_instances(project=self.project, zone=zone,
                                                               instance_group_manager=name)),
                    what=f"list the VMs of MIG {name}")

    def find(self, name: str, zone: str) -> Slice | None:
        """The slice `name` (a bare VM, else a MIG of that name), or None."""
        vm = self._instance(name, zone)
        if vm is not None:
            return self._slice_of_vm(name, vm)
        mig = self._mig(name, zone)
        if mig is None:
            return None
        return self._slice_of_mig(name, zone, mig)

    def _slice_of_vm(self, name: str, vm: Any) -> Slice:
        eps = [Endpoint(n.network_i_p) for n in vm.network_interfaces]
        sa = vm.service_accounts[0].email if vm.service_accounts else ""
        return Slice(name, _STATE.get(vm.status, "STATE_UNSPECIFIED"), dict(vm.labels), sa, eps[:1], [vm.name],
                     status=_enum(vm.status))

    def _slice_of_mig(self, name: str, zone: str, mig: Any) -> Slice:
        """A MIG is as good as its worst VM: one lost is the slice's loss; a VM the MIG is (re-)creating is
        coming; fewer VMs than the target with nothing in progress is missing ones (§3 "Preemption or repair")."""
        labels = {LABEL: owner_of(mig.description)} if owner_of(mig.description) else {}
        members = self.managed(name, zone)
        errors = mig_errors(mig, members)
        states: list[str] = []
        vms: list[str] = []
        eps: list[Endpoint] = []
        sa = ""
        for m in members:
            action = _enum(m.current_action)
            status = _enum(m.instance_status) if m.instance_status else ""
            vm_name = m.instance.rsplit("/", 1)[-1] if m.instance else m.name
            vms.append(vm_name)
            if action in _MIG_BUSY or (not status and action != "NONE"):
                states.append("REPAIRING" if action in ("RECREATING", "RESTARTING") else "CREATING")
            else:
                states.append(_STATE.get(status, "STATE_UNSPECIFIED") if status else "CREATING")
        if len(members) < mig.target_size:
            states.append("MISSING")
        order = ("PREEMPTED", "MISSING", "STOPPING", "STOPPED", "DELETING", "REPAIRING", "CREATING")
        worst = next((s for s in order if s in states), "READY" if states else "CREATING")
        if worst == "READY":
            found = [(vm_name, vm) for vm_name in sorted(vms) if (vm := self._instance(vm_name, zone)) is not None]
            found.sort(key=lambda f: worker_of(f[1]))   # stable: name order where Google says no worker id
            vms = [vm_name for vm_name, _ in found] + [v for v in vms if v not in {n for n, _ in found}]
            for _, vm in found:
                eps.append(Endpoint(vm.network_interfaces[0].network_i_p if vm.network_interfaces else ""))
                sa = sa or (vm.service_accounts[0].email if vm.service_accounts else "")
                labels = {**labels, **dict(vm.labels)}
        return Slice(name, worst, labels, sa, eps, vms, errors)

    @staticmethod
    def state(node: Slice) -> str:
        return node.state

    def get(self, name: str, zone: str) -> Slice:
        node = self.find(name, zone)
        if node is None:
            raise TpuctlError(ErrorKind.ERROR, f"TPU {name} disappeared in {zone}", "run the same command again")
        return node

    # -- making ---------------------------------------------------------------------------------------------------
    def _insert(self, kind: str, what: str, scope: dict[str, Any], deadline: float = OPERATION_DEADLINE,
                progress: Progress | None = None, describe: Callable[[], str] | None = None, **kwargs: Any) -> bool:
        """Insert and wait for the operation; False when the name is taken (409: adopted by the caller)."""
        try:
            op = call(getattr(self._c(kind), "insert_unary"), project=self.project, **scope, **kwargs, what=what)
        except TpuctlError as e:
            from google.api_core.exceptions import Conflict
            if isinstance(e.__cause__, Conflict):
                return False
            raise
        wait_operation(self.project, op, what, **scope, deadline=deadline, progress=progress, describe=describe)
        return True

    def create(self, spec: ClusterSpec, zone: str, script: str, service_account: str, nonce: str,
               progress: Progress, accepted: Callable[[], None] = lambda: None) -> bool:
        """Make the slices and wait until every VM runs; True when THIS run made them. As tpu.TpuApi.create: what
        carries our nonce is ours (a create whose answer was lost), and on failure only that is removed."""
        spec = resolved(spec, zone)
        labels = {**spec.labels, NONCE_LABEL: nonce}
        try:
            if not is_mig(spec):
                progress("creating VM" + (f", waiting up to {_minutes(flex_wait(spec))} for flex-start capacity"
                                          if spec.flex_start else ""))
                began = time.monotonic()

                def waiting() -> str:
                    return (f"waiting for flex-start capacity, {_minutes(time.monotonic() - began)} of "
                            f"{_minutes(flex_wait(spec))}")
                try:
                    # a flex-start insert may stay RUNNING for the whole wait (UNVERIFIED, §4): never given up
                    # on, nor its VM deleted, at the usual operation deadline
                    ours = self._insert("InstancesClient", f"create VM {spec.tpu_name} in {zone}", {"zone": zone},
                                        deadline=flex_wait(spec) + OPERATION_DEADLINE if spec.flex_start
                                        else OPERATION_DEADLINE,
                                        progress=progress if spec.flex_start else None,
                                        describe=waiting if spec.flex_start else None,
                                        instance_resource=build_instance(spec, zone, script, service_account,
                                                                         labels))
                except TpuctlError as e:
                    if spec.flex_start and e.kind is not ErrorKind.TIMEOUT and self.find(spec.tpu_name, zone) is None:
                        raise no_flex_capacity(spec, zone, e.message) from e
                    if re.search(REFUSALS[0][0], e.message):   # the zone lacks the machine type: try the next
                        raise TpuctlError(e.kind, e.message, REFUSALS[0][3], Scope.ZONE) from e
                    raise
                if not ours:
                    vm = self.get(spec.tpu_name, zone)
                    require_owned(vm.labels, spec.name, f"VM {spec.tpu_name} in {zone}")
                    ours = vm.labels.get(NONCE_LABEL) == nonce
            else:
                ours = _create_migs(self, spec, zone, script, service_account, labels, progress)
            accepted()
            self.wait_ready(spec, zone, progress)
            return ours
        except TpuctlError:
            left = [n for n in spec.node_names if (s := self.find(n, zone)) is not None
                    and s.labels.get(NONCE_LABEL) == nonce]
            if left or any(self._template_is(n, nonce) for n in spec.node_names):
                self.delete(spec, zone, progress)
            raise

    def _template(self, node: str) -> Any:
        return get_or_none(self._c("InstanceTemplatesClient").get, project=self.project,
                           instance_template=template_name(node), what="get instance template")

    def _template_is(self, node: str, nonce: str) -> bool:
        t = self._template(node)
        return t is not None and t.properties.labels.get(NONCE_LABEL) == nonce

    def wait_ready(self, spec: ClusterSpec, zone: str, progress: Progress) -> None:
        """Every slice READY. A MIG that cannot get capacity keeps trying (its VMs' last attempts and listErrors name
        a stockout); that is this zone's failure, so `up` moves on. A flex-start or bulk request waits for capacity
        instead (§9). Any other error Google reports on a MIG ends the wait on the poll that first sees it (refused);
        `create` then removes what this run made."""
        spec = resolved(spec, zone)
        single_flex = spec.flex_start and not is_mig(spec)
        began = time.monotonic()

        def poll() -> tuple[bool, str]:
            states = {}
            for name in spec.node_names:
                s = self.find(name, zone)
                if s is None and single_flex:   # Google deletes a flex-start VM whose wait ended (§4)
                    raise no_flex_capacity(spec, zone, "")
                if s is None:
                    raise TpuctlError(ErrorKind.ERROR, f"TPU {name} disappeared while waiting",
                                      "run the same command again")
                if single_flex and s.status == "PENDING":
                    waited = time.monotonic() - began
                    states[name] = (f"PENDING: waiting for flex-start capacity, {_minutes(waited)} of "
                                    f"{_minutes(flex_wait(spec))}")
                    continue
                if s.state == "PREEMPTED":
                    raise TpuctlError(ErrorKind.PREEMPTED, f"TPU {name} was preempted while being made",
                                      "run `tpuctl up` again to recreate it")
                if s.state in ("CREATING", "MISSING") and s.instances != [name]:
                    found = s.errors + ([] if s.errors or bulk(spec) else list_errors(self.project, name, zone))
                    err = refused(name, zone, found, wait_for_capacity=bulk(spec))
                    if err is not None:
                        raise err
                    short = next((m for _, c, m in found if c in STOCKOUT or "QUOTA" in c), "")
                    if short:   # a bulk MIG waiting for capacity: say so while waiting, and at the deadline
                        states[name] = f"{s.state}, waiting for capacity: {short.splitlines()[0][:160]}"
                        continue
                states[name] = s.state
            worst = next((v for v in states.values() if v != "READY"), "READY")
            return worst == "READY", worst
        deadline = CREATE_DEADLINE if not spec.flex_start else \
            flex_wait(spec) + CREATE_DEADLINE if single_flex else spec.max_duration + 86400.0
        wait(poll, f"TPU {spec.tpu_name}", deadline, progress)

    # -- removing -------------------------------------------------------------------------------------------------
    def _delete(self, kind: str, what: str, scope: dict[str, Any], deadline: float = OPERATION_DEADLINE,
                **kwargs: Any) -> None:
        try:
            op = call(getattr(self._c(kind), "delete_unary"), project=self.project, **scope, **kwargs, what=what)
            wait_operation(self.project, op, what, **scope, deadline=deadline)
        except TpuctlError as e:
            if e.kind is not ErrorKind.NOT_FOUND:
                raise

    def delete(self, spec: ClusterSpec, zone: str, progress: Progress) -> None:
        """MIGs (their VMs with them), the bare VM, then the template and the workload policy, which cannot go while
        a MIG names them (§3 "Delete"); each checked to be the cluster's first."""
        for name in spec.node_names:
            mig = self._mig(name, zone)
            if mig is not None:
                if owner_of(mig.description) != spec.name:
                    raise TpuctlError(ErrorKind.REFUSED, f"MIG {name} in {zone} is not cluster {spec.name}'s "
                                      f"(its description: {mig.description!r})", "delete it yourself if it is yours")
                progress(f"deleting MIG {name}")
                # a MIG's delete operation ends once its VMs are gone (§3 "Delete"): a VM's own deadline
                self._delete("InstanceGroupManagersClient", f"delete MIG {name}", {"zone": zone},
                             deadline=DELETE_DEADLINE, instance_group_manager=name)
            vm = self._instance(name, zone)
            if vm is not None:
                require_owned(dict(vm.labels), spec.name, f"VM {name} in {zone}")
                progress(f"deleting VM {name}")
                self._delete("InstancesClient", f"delete VM {name}", {"zone": zone}, deadline=DELETE_DEADLINE,
                             instance=name)
        for name in spec.node_names:
            t = self._template(name)
            if t is not None:
                require_owned(dict(t.properties.labels), spec.name, f"instance template {template_name(name)}")
                progress(f"deleting instance template {template_name(name)}")
                self._delete("InstanceTemplatesClient", f"delete instance template {template_name(name)}", {},
                             instance_template=template_name(name))
        region = region_of(zone)
        for policy in policies_to_delete(spec):
            p = get_or_none(self._c("ResourcePoliciesClient").get, project=self.project, region=region,
                            resource_policy=policy, what="get workload policy")
            if p is None:
                continue
            if owner_of(p.description) != spec.name:
                raise TpuctlError(ErrorKind.REFUSED, f"workload policy {policy} is not cluster "
                                  f"{spec.name}'s", "delete it yourself if it is yours")
            progress(f"deleting workload policy {policy}")
            self._delete("ResourcePoliciesClient", f"delete workload policy {policy}", {"region": region},
                         resource_policy=policy)


def _create_migs(api: ComputeTpus, spec: ClusterSpec, zone: str, script: str, service_account: str,
                 labels: dict[str, str], progress: Progress) -> bool:
    """Each multi-host slice's workload policy and each slice's template at once, then every slice's MIG at
    once: a MIG names both, so `up` takes two operations' time whatever the number of slices (bench/
    bench_up.py), not 1 + 2N."""
    names = spec.node_names
    policies = [n for n in names if multi_host(spec)]
    progress(("creating workload polic" + ("ies and " if len(policies) > 1 else "y and ") if policies else
              "creating ") + f"instance template{'s' if len(names) > 1 else ''}")
    made = together([functools.partial(
        api._insert, "InstanceTemplatesClient", f"create instance template {template_name(name)}", {},
        instance_template_resource=build_template(spec, name, zone, script, service_account, labels))
        for name in names] + [functools.partial(
            api._insert, "ResourcePoliciesClient", f"create workload policy {policy_name(name)}",
            {"region": region_of(zone)}, resource_policy_resource=build_policy(spec, name)) for name in policies])
    made = made[:len(names)]
    ours = all([m or api._template_is(name, labels[NONCE_LABEL]) for name, m in zip(names, made)])
    progress(f"creating MIG{'s' if len(names) > 1 else ''} {', '.join(names)}")
    together([functools.partial(api._insert, "InstanceGroupManagersClient", f"create MIG {name} in {zone}",
                                 {"zone": zone}, instance_group_manager_resource=build_mig(spec, name, zone))
               for name in names])
    return ours
