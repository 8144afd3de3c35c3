"""Run flows: submit (package, sync data, write job.json), and what logs/jobs/cancel read from the store.
Provider-agnostic: a Provider gives the store; no google or rich imports."""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from . import datasync, layout, packaging, runs
from .errors import ErrorKind, TpuctlError
from .jobspec import JobSpec
from .models import ClusterState, Phase
from .providers.base import Provider, Reporter
from .runs import RunSpec, RunState
from .store import BlobStore

STALE_SECONDS = 120   # no heartbeat for this long: `jobs` shows the run as "lost?"


def warn_package_bytes() -> int:
    """A job directory larger than this (100 MB, TPUCTL_PACKAGE_WARN_BYTES) gets a warning that suggests `data`."""
    return int(os.environ.get("TPUCTL_PACKAGE_WARN_BYTES", 100 << 20))


def submit(st: ClusterState, provider: Provider, job: JobSpec, args: list[str], transfer: datasync.Transfer,
           reporter: Reporter) -> tuple[str, dict[str, int]]:
    """Everything up to the written job.json; returns (run id, data sync summary)."""
    if st.phase is not Phase.READY:
        raise TpuctlError(ErrorKind.NOT_FOUND, f"cluster {st.name} is not ready (its `up` did not finish)",
                          f"run `tpuctl up -c {st.name} ...` again")
    provider.check_ready(st)
    if st.runtime and job.framework is not st.spec.framework:
        reporter.warn(f"job {job.name} is a {job.framework.value} job, but cluster {st.name} runs a "
                      f"{st.spec.framework.value} image ({st.runtime}); "
                      f"`tpuctl up --framework {job.framework.value}` on a new cluster matches them")
    store = provider.store(st)
    unpacked = packaging.size(job.root, job.data)
    if unpacked > warn_package_bytes():
        reporter.warn(f"the job directory holds {unpacked / 1e6:.0f} MB besides its data: it is packed and uploaded "
                      "as code; list large inputs under `data` in tpuctl.toml (synced once, skipped when unchanged)")
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "job.tar.gz"
        sha = packaging.build_file(job.root, job.data, pkg)   # on disk, streamed: never the whole job in memory
        pkg_key = layout.job_package(sha)
        if pkg_key not in store.stats(pkg_key):
            store.upload_file(str(pkg), pkg_key, lambda n: None)   # content-addressed: a rewrite is harmless
            reporter.resource("package", sha[:12], f"uploaded {pkg.stat().st_size / 1024:.1f} KiB", final=True)
        else:
            reporter.resource("package", sha[:12], "unchanged", final=True)
    run_id = runs.new_id()
    synced = datasync.sync(store, job.data, job.data_as, run_id, transfer) if job.data else {}
    if synced:
        reporter.resource("data", layout.run_data(run_id), f"{synced['uploaded']} of {synced['files']} files sent "
                          f"({synced['bytes_sent'] / 1e6:.1f} MB; {synced['bytes_skipped'] / 1e6:.1f} MB unchanged)",
                          final=True)
    spec = RunSpec(id=run_id, name=job.name, command=job.command, args=list(args), env=job.env, package=sha,
                   requirements=job.requirements, submitted=time.time(), cluster=st.name,
                   framework=job.framework.value)
    if not store.create(layout.run_job(run_id), json.dumps(spec.to_json(), indent=2).encode()):
        raise TpuctlError(ErrorKind.ERROR, f"run id {run_id} already exists", "submit again")
    return run_id, synced


def resolve_run(store: BlobStore, run_id: str | None) -> str:
    if run_id:
        if runs.job(store, runs.check_id(run_id)) is None:
            raise TpuctlError(ErrorKind.NOT_FOUND, f"no run {run_id}", "`tpuctl jobs` lists runs")
        return run_id
    latest = runs.latest(store)
    if latest is None:
        raise TpuctlError(ErrorKind.NOT_FOUND, "no runs yet", "`tpuctl submit JOB_DIR` starts one")
    return latest


def table(store: BlobStore) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for run_id in runs.all_ids(store):
        job = runs.job(store, run_id)
        st = runs.status(store, run_id)
        start, end = st.started, st.ended
        shown = st.state.value
        if not st.state.final and st.heartbeat and time.time() - st.heartbeat > STALE_SECONDS:
            shown = "lost?"   # no heartbeat for 2 minutes: the host may be gone
        rows.append({"id": run_id, "name": job.name if job else "", "state": shown,
                     "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start)) if start else "",
                     "duration": round((end or time.time()) - start, 1) if start else None,
                     "exit_code": st.exit_code, "attempt": st.attempt})
    return rows


def cancel(store: BlobStore, run_id: str) -> RunState:
    """A queued run never starts once cancelled; a running one gets SIGTERM, then SIGKILL after the grace."""
    st = runs.status(store, resolve_run(store, run_id))
    if st.state.final:
        raise TpuctlError(ErrorKind.INPUT, f"run {run_id} already {st.state.value}", "nothing to cancel")
    store.write(layout.run_cancel(run_id), json.dumps({"time": time.time()}).encode())
    return st.state
