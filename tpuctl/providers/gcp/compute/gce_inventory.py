"""What `ls` finds of the Compute Engine TPU path besides its labelled VMs (inventory.py lists those): instance
templates labelled as tpuctl's, and workload policies and MIGs whose description names their cluster (neither
resource has labels: gce_requests.description)."""
from __future__ import annotations

from ....core.models import LABEL
from ...google import clients
from ...google.operations import call
from .gce_requests import owner_of, shape_in


def list_labelled(project: str) -> list[dict[str, str]]:
    """Templates, workload policies and MIGs described as tpuctl's (the TPU VMs carry the label: inventory.py)."""
    out = []
    for t in call(lambda: list(clients.compute("InstanceTemplatesClient").list(project=project)),
                  what="list instance templates"):
        if LABEL in t.properties.labels:
            out.append({"cluster": t.properties.labels[LABEL], "kind": "template", "name": t.name, "zone": "",
                        "arch": "vm", "type": t.properties.machine_type, "state": "READY", "api": "compute",
                        "part": "yes"})
    client = clients.compute("ResourcePoliciesClient")
    for region, scoped in call(lambda: list(client.aggregated_list(project=project)),
                               what="list resource policies"):
        for p in scoped.resource_policies:
            if owner_of(p.description):
                out.append({"cluster": owner_of(p.description), "kind": "workload policy", "name": p.name,
                            "zone": region.removeprefix("regions/"), "arch": "vm",
                            "type": p.workload_policy.accelerator_topology, "state": "READY", "api": "compute",
                            "part": "yes"})
    migs = clients.compute("InstanceGroupManagersClient")
    for zone, scoped in call(lambda: list(migs.aggregated_list(project=project)), what="list MIGs"):
        for m in scoped.instance_group_managers:
            if owner_of(m.description):
                tpu, slices = shape_in(m.description)
                out.append({"cluster": owner_of(m.description), "kind": "mig", "name": m.name,
                            "zone": zone.removeprefix("zones/"), "arch": "vm", "type": tpu, "slices": str(slices),
                            "state": "STABLE" if m.status.is_stable else "UPDATING", "api": "compute"})
    return out
