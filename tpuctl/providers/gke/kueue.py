"""Kueue on a GKE cluster (issue 49 items 9-11): the queue a run is submitted to and how Kueue answers.

Kueue's objects and behaviour relied on (kubernetes-sigs/kueue; the version pinned by xpk's core/kueue_manager.py
is in GKE_FACTS.md):
- a JobSet opts in with the label `kueue.x-k8s.io/queue-name` naming a LocalQueue in its namespace (manifest.py
  QUEUE_LABEL); Kueue then makes a Workload for it, owned by the JobSet (ownerReferences), and keeps the JobSet
  suspended (`spec.suspend: true`) until the Workload is admitted (site/content/en/docs/tasks/run/jobsets.md);
- a Workload's conditions (apis/kueue/v1beta1/workload_types.go): `QuotaReserved` (False with reason Pending and
  a message such as "couldn't assign flavors to pod set ...: insufficient unused quota ..." while it waits),
  `Admitted`, `Evicted` (reason Preempted when a higher priority took its quota; the JobSet is suspended again and
  the Workload goes back to the queue), `Finished`;
- LocalQueue and PriorityClass names are DNS-1123 subdomains (Kubernetes object names)."""
from __future__ import annotations

import re
from typing import Any

from ...core.errors import bad_input

API = "kueue.x-k8s.io/v1beta1"
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")


def check_name(name: str | None, flag: str) -> str:
    """A LocalQueue's or PriorityClass's name as given to `flag`, checked offline ("" when not given)."""
    if not name:
        return ""
    if not _NAME_RE.match(name):
        raise bad_input(f"invalid {flag} {name!r}", "a Kubernetes name: lowercase letters, digits, '-' and '.', "
                        "e.g. --queue multislice-queue --priority medium")
    return name


def condition(workload: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in workload.get("status", {}).get("conditions", []) if c.get("type") == kind), None)


def queued_words(workload: dict[str, Any]) -> str:
    """`queued (Kueue: <why>)` for a Workload Kueue has not admitted, "" for one it has (or evicted and admitted
    again)."""
    admitted = condition(workload, "Admitted")
    if admitted is not None and admitted.get("status") == "True":
        return ""
    evicted = condition(workload, "Evicted")
    reserved = condition(workload, "QuotaReserved")
    why = next((str(c.get("message") or c.get("reason") or "") for c in (evicted, reserved)
                if c is not None and c.get("status") in ("True", "False") and (c is reserved or
                                                                               c.get("status") == "True")), "")
    return f"queued (Kueue: {why or 'waiting for admission'})"
