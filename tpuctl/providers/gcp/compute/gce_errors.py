"""What Google says stands in the way of a Compute Engine TPU slice (gce.py waits on it): a MIG's errors, read where
compute_v1 1.57 puts them, sorted into capacity (this zone cannot give the slice now: `up` tries the next) and
refusals (waiting cannot mend them: `up` ends with Google's words and a hint); and a flex-start VM Google deleted
after its wait. Facts and sources: ../shared/GCE_TPU_FACTS.md (§ numbers)."""
from __future__ import annotations

import re
from typing import Any

from ....core.errors import ErrorKind, Scope, TpuctlError
from ....core.models import ClusterSpec
from ...google import clients
from ...google.operations import call
from .gce_requests import FLEX_WAIT_DEFAULT

STOCKOUT = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "QUOTA_EXCEEDED")


def enum(value: Any) -> str:
    return value if isinstance(value, str) else getattr(value, "name", str(value))


def flex_wait(spec: ClusterSpec) -> int:
    return spec.flex_wait or FLEX_WAIT_DEFAULT


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def no_flex_capacity(spec: ClusterSpec, zone: str, said: str) -> TpuctlError:
    """A flex-start VM gone after waiting: "when the wait ends without capacity ... Compute Engine deletes the
    Flex-start VM" (compute/docs/instances/instance-lifecycle, §4). That is this zone's answer: `up` tries the next."""
    return TpuctlError(ErrorKind.CAPACITY, f"no flex-start capacity for {spec.tpu_type} in {zone} within "
                       f"{minutes(flex_wait(spec))}: Google deleted the waiting VM" + (f" ({said})" if said else ""),
                       "add more --zone values, a longer --flex-wait (at most 2h), or try later", Scope.ZONE)


def _errors(where: str, error: Any) -> list[tuple[str, str, str]]:
    """(where, code, message) of a compute_v1 Error (or ManagedInstanceLastAttemptErrors): both carry `errors[]`
    of Errors{code, message}."""
    return [(where, e.code, e.message) for e in (error.errors if error else [])]


def mig_errors(mig: Any, members: list[Any]) -> list[tuple[str, str, str]]:
    """Every error Google reports on a MIG still making its VMs, from the three places compute_v1 1.57 has for
    them (GCE_TPU_FACTS §3 "States you can observe"): each ManagedInstance.last_attempt.errors (the last try at
    that VM); a bulk MIG's InstanceGroupManagerStatus.bulk_instance_operation.last_progress_check.error (a bulk
    MIG makes no VM until all can be made, so its members may say nothing); and each
    status.applied_accelerator_topologies[] whose state is FAILED or INCOMPLETE, with state_details.error (the
    workload policy's topology). A MIG retries all of these itself: without reading them, a refused MIG reads
    CREATING until our deadline. INCOMPLETE is also what a slice short of VMs reads ("insufficient number of running
    VMs", compute_v1's enum), perhaps while they are still being made: only a capacity error of its counts, never a
    reason to end `up`; FAILED's errors all count."""
    out: list[tuple[str, str, str]] = []
    for m in members:
        if m.last_attempt and m.last_attempt.errors:
            out += _errors(f"VM {m.name}'s last attempt", m.last_attempt.errors)
    status = mig.status
    if status and status.bulk_instance_operation and status.bulk_instance_operation.last_progress_check:
        out += _errors("the bulk creation's last progress check",
                       status.bulk_instance_operation.last_progress_check.error)
    for t in (status.applied_accelerator_topologies if status else []):
        if enum(t.state) in ("FAILED", "INCOMPLETE") and t.state_details:
            said = _errors(f"accelerator topology {t.accelerator_topology} {enum(t.state)}", t.state_details.error)
            out += [e for e in said if enum(t.state) == "FAILED" or e[1] in STOCKOUT]
    return list(dict.fromkeys(out))


# Errors a MIG reports that are not capacity: each -> (kind, scope, hint). The codes Google uses in lastAttempt
# and progress checks are not documented for TPU MIGs, so the message is matched as well (GCE_TPU_FACTS §9: the
# machine-type text is gcloud's own regex in surface/compute/instances/create.py).
REFUSALS: list[tuple[str, ErrorKind, Scope, str]] = [
    (r"[Mm]achine type .*does not exist in zone|not available in zone|not supported in zone", ErrorKind.INPUT,
     Scope.ZONE, "this zone does not offer the slice's machine type: give --zone values where `gcloud compute "
                 "machine-types list --filter=name=MACHINE` lists it"),
    (r"[Rr]eservation", ErrorKind.INPUT, Scope.GLOBAL,
     "check --reservation: it must exist in this zone (or be shared, projects/P/reservations/R), match the machine "
     "type and have room: `gcloud compute reservations describe R --zone ZONE`"),
    (r"[Ss]ervice ?[Aa]ccount|actAs|serviceAccountUser|PERMISSION|[Pp]ermission", ErrorKind.PERMISSION,
     Scope.GLOBAL, "you need roles/iam.serviceAccountUser (iam.serviceAccounts.actAs) on the VMs' service account, "
                   "which must exist: grant it, or pass --service-account ACCOUNT that you may use"),
    (r"[Tt]opology|[Ww]orkload policy|resourcePolicies", ErrorKind.INPUT, Scope.GLOBAL,
     "the workload policy's accelerator topology does not fit this machine type or zone: check `gcloud compute "
     "resource-policies describe POLICY --region REGION`, or try another --zone"),
]


def refused(name: str, zone: str, errors: list[tuple[str, str, str]], wait_for_capacity: bool) -> TpuctlError | None:
    """What `up` does with a MIG's errors: a stockout or quota moves to the next zone as a failed VM insert does
    (a bulk MIG, which waits for all its capacity by design, keeps waiting); anything else Google keeps retrying
    is said at once, Google's own words and a hint, since waiting cannot mend it."""
    from ...google.errors import classify_text
    for where, code, message in errors:
        if code in STOCKOUT or "QUOTA" in code:
            if wait_for_capacity:
                continue
            return classify_text(code, message, f"create {name} in {zone}")
        text = f"{code}: {message}"
        kind, scope, hint = next(((k, sc, h) for rx, k, sc, h in REFUSALS if re.search(rx, text)),
                                 (ErrorKind.ERROR, Scope.GLOBAL,
                                  "fix what Google names, then run `tpuctl up` again (what this run made is removed)"))
        return TpuctlError(kind, f"Google refused the VMs of MIG {name} in {zone} ({where}): {code}: {message}",
                           hint, scope)
    return None


def list_errors(project: str, name: str, zone: str) -> list[tuple[str, str, str]]:
    """A MIG's creation errors (listErrors: InstanceManagedByIgmError), which outlive a VM's last attempt."""
    client = clients.compute("InstanceGroupManagersClient")
    errors = call(lambda: list(client.list_errors(project=project, zone=zone, instance_group_manager=name)),
                  what=f"list the errors of MIG {name}")
    return [(f"listErrors ({enum(e.instance_action_details.action)} {e.instance_action_details.instance})"
             if e.instance_action_details else "listErrors", e.error.code, e.error.message) for e in errors]
