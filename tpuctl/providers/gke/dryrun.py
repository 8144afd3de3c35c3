"""`submit --dry-run --provider gke --type T [--slices N] [--max-restarts N] --manifest FILE`: the Kubernetes
objects a run would create, written without a cluster or credentials; with a GKE cluster's record, for that
cluster (its store, image, slices and workload policy). They are what `submit` applies, in its order: the pods'
ServiceAccount and its role to cordon a sick host's node (cordoning.py), then the JobSet, whose pods run as that
account (`kubectl apply -f` creates them in the file's order)."""
from __future__ import annotations

import sys
from typing import Any, Mapping

from ... import __version__
from ...core.catalog import google_name
from ...core.errors import bad_input
from ...core.models import ClusterState, ProviderName
from . import cordoning, kueue, manifest, tputypes

# Stands for the id submit gives the run, at its real length (core/runs.new_id: 24 characters), so that every name
# and label derived from it is as long as a submit's (issue 57: a 7-character "dry-run" hid a 73-character label).
DRY_RUN_ID = "19700101-000000-000-0000"
NO_STORE = "gs://BUCKET"        # no cluster: where the cluster's bucket would be named
NO_CLUSTER = "CLUSTER"          # no cluster: where its name would be (no local cluster is looked up for --type)
STDOUT = "-"                    # --manifest -: the objects on stdout (for `| kubectl apply -f -`), no file


def workload_policy_name(cluster: str) -> str:
    """The TPU7x workload policy's name when no cluster record names it (up records the one it made)."""
    return f"tpuctl-{cluster}-wp"


def objects(cluster: str, tpu_type: str | None, slices: int | None, max_restarts: int,
            record: Mapping[str, Any] | None = None, store_uri: str = "", queue: str = "",
            priority: str = "", namespace: str = "") -> list[dict[str, Any]]:
    """The run's objects; `record`: the cluster's `gke` record (contract in providers/gke), None without one."""
    rec = record or {}
    if rec and tpu_type and google_name(tpu_type) != rec.get("tpu_type"):
        raise bad_input(f"--type {tpu_type}: cluster {cluster} runs {rec.get('tpu_type')}",
                        "leave --type out to use the cluster's, or name another cluster")
    tpu_type = tpu_type or str(rec.get("tpu_type") or "")
    if not tpu_type:
        raise bad_input("--manifest without a GKE cluster needs --type", "e.g. --provider gke --type v6e-16")
    shape = tputypes.shape(tpu_type)
    n = slices if slices is not None else int(rec.get("slices") or 1)
    if rec and n != int(rec.get("slices") or 1):
        raise bad_input(f"--slices {n}: cluster {cluster} has {rec.get('slices')} (one node pool each)",
                        "leave --slices out, or `tpuctl up` a cluster with that many")
    namespace = namespace or manifest.DEFAULT_NAMESPACE
    run = manifest.RunObjects(
        cluster=cluster, run_id=DRY_RUN_ID, shape=shape, slices=n, max_restarts=max_restarts,
        image=str(rec.get("image") or manifest.DEFAULT_IMAGE), store_uri=store_uri or NO_STORE,
        agent_version=__version__, queue=queue, priority=priority,
        namespace=namespace, service_account=cordoning.account(cluster),
        workload_policy=str(rec.get("workload_policy") or
                            (workload_policy_name(cluster) if shape.needs_workload_policy else "")))
    return [obj for _, obj in cordoning.objects(cluster, namespace)] + [manifest.build_jobset(run)]


def write(path: str, name: str, st: ClusterState | None, named: bool, provider: str | None, tpu_type: str | None,
          slices: int | None, max_restarts: int, queue: str = "", priority: str = "", namespace: str = "") -> int:
    """`submit --dry-run --manifest PATH`: the objects for cluster `name` (its state `st`, if any; `named`: the
    user named it with -c) or, without a GKE cluster, for `--provider gke --type T`; returns how many were written.
    PATH "-" writes them to stdout."""
    gke = st is not None and st.spec.provider is ProviderName.GKE
    if st is not None and not gke and named:
        raise bad_input(f"--manifest: cluster {name} uses provider {st.spec.provider.value}, not gke",
                        "name a GKE cluster, or --provider gke --type T without one")
    if not gke and provider != ProviderName.GKE.value:
        raise bad_input("--manifest writes a GKE run's objects", "add --provider gke --type T (no cluster needed)")
    record = dict(st.record.get("gke") or {}) if gke and st is not None else None
    objs = objects(name if gke else NO_CLUSTER, tpu_type, slices, max_restarts, record,
                   st.spec.store if gke and st is not None else "", kueue.check_name(queue, "--queue"),
                   kueue.check_name(priority, "--priority"),
                   kueue.check_namespace(namespace) or (st.spec.namespace if gke and st is not None else ""))
    text = manifest.dump(objs)
    if path == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return len(objs)
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise bad_input(f"--manifest {path}: {e.strerror}", "name a file in a directory you can write") from None
    return len(objs)
