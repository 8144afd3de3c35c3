"""The cluster's bucket: in the TPU's region, uniform bucket-level access, public access prevention enforced."""
from __future__ import annotations

import json
from typing import Any

from ...core import layout
from ...core.errors import ErrorKind, Scope, TpuctlError
from ...core.models import LABEL, NONCE_LABEL, ClusterSpec, require_owned
from ..base import Progress
from . import clients
from .operations import call


def bucket_of(spec: ClusterSpec) -> str:
    return spec.store[len("gs://"):]


def find(project: str, name: str) -> Any:
    try:
        return call(clients.storage(project).get_bucket, name, what=f"read bucket {name}")
    except TpuctlError as e:
        if e.kind is ErrorKind.NOT_FOUND:
            return None
        if e.kind is ErrorKind.PERMISSION:
            raise TpuctlError(ErrorKind.PERMISSION, f"bucket {name} exists but this account cannot read it",
                              "bucket names are global: pass another --bucket, or get access to this one")
        raise


def list_labelled(project: str) -> list[Any]:
    """Every bucket of the project carrying the tpuctl label."""
    client = clients.storage(project)
    return [b for b in call(lambda: list(client.list_buckets(project=project)), what="list buckets")
            if LABEL in (b.labels or {})]


def ensure(project: str, spec: ClusterSpec, name: str, region: str, nonce: str, progress: Progress) -> bool:
    b = find(project, name)
    if b is not None:
        where = (b.location or "").lower()
        if where != region:
            # REGION: with zones in several regions, the ones where this bucket is may still work.
            raise TpuctlError(ErrorKind.INPUT, f"bucket {name} is in {where or 'an unknown location'}, not in {region} "
                              "where the TPU runs (cross-region reads are slow and billed as egress)",
                              "pass --bucket with a bucket in that region, or omit it to get a new one", Scope.REGION)
        progress("adopted")
        return False
    client = clients.storage(project)
    b = client.bucket(name)
    b.iam_configuration.uniform_bucket_level_access_enabled = True
    b.iam_configuration.public_access_prevention = "enforced"
    b.labels = {**spec.labels, NONCE_LABEL: nonce}
    progress("creating")
    try:
        call(client.create_bucket, b, location=region, what=f"create bucket {name}")
    except TpuctlError as e:
        from google.api_core.exceptions import Conflict
        if not isinstance(e.__cause__, Conflict):
            raise
        # 409: the name is held. By this run when a first try applied and its answer was lost (our nonce), by
        # another machine's `up` of this cluster (our label), or else by someone else: names are global.
        there = find(project, name)
        labels = (there.labels or {}) if there is not None else {}
        if labels.get(LABEL) != spec.name:
            raise TpuctlError(ErrorKind.INPUT, f"bucket name {name} is already taken by another project",
                              "bucket names are global: pass another --bucket")
        if labels.get(NONCE_LABEL) != nonce:
            progress("made by another `up`: adopted")
            return False
    progress("ready")
    return True


def write_record(project: str, name: str, record: dict[str, Any], with_agent: bool) -> None:
    """`tpuctl/cluster.json` for the hosts, and with it (ahead of creation: hosts install it at boot) the agent
    package."""
    from .. import agent_package
    b = clients.storage(project).bucket(name)
    call(b.blob(layout.CLUSTER_RECORD).upload_from_string, json.dumps(record, indent=2),
         content_type="application/json", what="write cluster record")
    if with_agent:
        call(b.blob(agent_package.key()).upload_from_string, agent_package.build(),
             content_type="application/gzip", what="upload the agent package")


def delete(project: str, name: str, cluster: str, progress: Progress) -> None:
    b = find(project, name)
    if b is None:
        return
    require_owned(b.labels, cluster, f"bucket {name}")
    progress("deleting")
    client = clients.storage(project)
    blobs = call(lambda: list(client.list_blobs(name)), what=f"list bucket {name}")
    for blob in blobs:
        call(blob.delete, what=f"delete gs://{name}/{blob.name}")
    call(b.delete, what=f"delete bucket {name}")
