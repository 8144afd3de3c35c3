"""Run flows: submit (package, sync data, write job.json), and what logs/jobs/cancel read from the store.
Cloud-agnostic: a Provider gives the store; no google or rich imports."""
from __future__ import annotations

import json
import time

from . import datasync, packaging, runs
from .errors import TpuctlError
from .jobspec import JobSpec
from .models import ClusterState


def submit(st: ClusterState, provider, job: JobSpec, args: list[str], transfer, reporter) -> tuple[str, dict]:
    """Everything up to the written job.json; returns (run id, data sync summary)."""
    if st.phase != "ready":
        raise TpuctlError("not_found", f"cluster {st.name} is not ready (its `up` did not finish)",
                          f"run `tpuctl up -c {st.name} ...` again")
    provider.check_ready(st)
    store = provider.store(st)
    pkg, sha = packaging.build(job.root, job.data)
    pkg_key = f"tpuctl/packages/{sha}.tar.gz"
    if pkg_key not in store.stats(pkg_key):
        store.create(pkg_key, pkg)
        reporter.resource("package", sha[:12], f"uploaded {len(pkg) / 1024:.1f} KiB", final=True)
    else:
        reporter.resource("package", sha[:12], "unchanged", final=True)
    synced = datasync.sync(store, job.data, f"data/{job.name}/", transfer) if job.data else {}
    if synced:
        reporter.resource("data", f"data/{job.name}/", f"{synced['uploaded']} of {synced['files']} files sent "
                          f"({synced['bytes_sent'] / 1e6:.1f} MB; {synced['bytes_skipped'] / 1e6:.1f} MB unchanged)",
                          final=True)
    run_id = runs.new_id()
    spec = {"id": run_id, "name": job.name, "command": job.command, "args": list(args), "env": job.env,
            "package": sha, "requirements": job.requirements, "submitted": time.time(), "cluster": st.name}
    if not store.create(runs.key(run_id, "job.json"), json.dumps(spec, indent=2).encode()):
        raise TpuctlError("error", f"run id {run_id} already exists", "submit again")
    return run_id, synced


def resolve_run(store, run_id: str | None) -> str:
    if run_id:
        if runs.job(store, run_id) is None:
            raise TpuctlError("not_found", f"no run {run_id}", "`tpuctl jobs` lists runs")
        return run_id
    latest = runs.latest(store)
    if latest is None:
        raise TpuctlError("not_found", "no runs yet", "`tpuctl submit JOB_DIR` starts one")
    return latest


def table(store) -> list[dict]:
    rows = []
    for run_id in runs.all_ids(store):
        job = runs.job(store, run_id) or {}
        st = runs.status(store, run_id)
        start, end = st.get("started"), st.get("ended")
        if st.get("state") not in runs.FINAL and st.get("heartbeat") and time.time() - st["heartbeat"] > 120:
            st["state"] = "lost?"   # no heartbeat for 2 minutes: the host may be gone
        rows.append({"id": run_id, "name": job.get("name", ""), "state": st.get("state", "queued"),
                     "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start)) if start else "",
                     "duration": round((end or time.time()) - start, 1) if start else None,
                     "exit_code": st.get("exit_code"), "attempt": st.get("attempt", 1)})
    return rows


def cancel(store, run_id: str) -> dict:
    st = runs.status(store, run_id)
    if st.get("state") in runs.FINAL:
        raise TpuctlError("input", f"run {run_id} already {st['state']}", "nothing to cancel")
    store.write(runs.key(run_id, "cancel"), json.dumps({"time": time.time()}).encode())
    return st
