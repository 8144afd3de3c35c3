"""The queued resource's node spec for one slice or a Multislice (core/multislice.py has the facts and sources),
and which of a cluster's slices are lost."""
from __future__ import annotations

from typing import Any

from ....core.models import ClusterSpec
from .tpu import LOST as NODE_LOST, TpuApi

LOST = NODE_LOST | {"MISSING"}   # a slice that only a re-create brings back (tpu.py: every state's meaning)


def build_node_spec(parent: str, spec: ClusterSpec, node: Any) -> Any:
    """`node_id` for one slice; for N slices, `multislice_params {node_count: N, node_id_prefix: tpu_name}` in its
    place (a oneof, `name_strategy`: google-cloud-tpu 1.28 QueuedResource.Tpu.NodeSpec), so Google names the nodes
    tpu_name-0 ... tpu_name-(N-1), as spec.node_names does."""
    from google.cloud import tpu_v2
    NodeSpec = tpu_v2.QueuedResource.Tpu.NodeSpec
    if spec.slices <= 1:
        return NodeSpec(parent=parent, node_id=spec.tpu_name, node=node)
    return NodeSpec(parent=parent, node=node, multislice_params=NodeSpec.MultisliceParams(
        node_count=spec.slices, node_id_prefix=spec.tpu_name))


def states(api: TpuApi, spec: ClusterSpec, zone: str) -> dict[str, str]:
    """Each node of the cluster -> its state (MISSING when the API has none)."""
    out = {}
    for name in spec.node_names:
        node = api.find(name, zone)
        out[name] = api.state(node) if node is not None else "MISSING"
    return out


def worst(found: dict[str, str]) -> tuple[str, str]:
    """(node, state) the cluster is as good as: a lost slice first, then one not READY, else the first node."""
    for name, state in found.items():
        if state in LOST:
            return name, state
    for name, state in found.items():
        if state != "READY":
            return name, state
    name = next(iter(found))
    return name, found[name]
