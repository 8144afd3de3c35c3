"""Run flows: submit (package, sync data, write job.json), and what logs/jobs/cancel read from the store.
Provider-agnostic: a Provider gives the store; no google or rich imports."""
from __future__ import annotations

import json
import math
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..core import (backends, datasync, goodput, interrupts, jobfiles, knobs, layout, metrics, notify, orphans,
                   packaging, runindex, runs, utilisation)
from ..core.errors import ErrorKind, TpuctlError, bad_input
from ..core.jobspec import JobSpec, check_launchable
from ..core.sizes import human_bytes
from ..core.models import ClusterState, Framework, Phase
from . import armed
from ..providers.base import Provider, Reporter
from ..core.runs import RunSpec
from ..core.store import BlobStore, said_full

STALE_SECONDS = 120   # no heartbeat for this long: `jobs` shows the run as "lost?"


SHOWN_CANDIDATES = 5   # an ambiguous short id names this many of the runs it matches

DEFAULT_SESSIONS = 10   # a service's run chains through at most this many sessions unless --chain says otherwise


def warn_package_bytes() -> int:
    """A job directory larger than this (100 MB, TPUCTL_PACKAGE_WARN_BYTES) gets a warning that suggests `data`."""
    return knobs.count("TPUCTL_PACKAGE_WARN_BYTES", 100 << 20)


def large_job_warning(job: JobSpec) -> str:
    """The warning for a job directory past warn_package_bytes, "" under it: submit and its dry run say the same."""
    unpacked = packaging.size(job.root, job.data)
    if unpacked <= warn_package_bytes():
        return ""
    return (f"the job directory holds {human_bytes(unpacked)} besides its data: it is packed and uploaded as code; "
            "list large inputs under `data` in tpuctl.toml (synced once, skipped when unchanged)")


def _check_keras_tensorflow(st: ClusterState, job: JobSpec) -> None:
    """A Keras 3 job that would run on a TensorFlow older than Keras 3 supports (core/backends.py)."""
    if job.framework is not Framework.KERAS or not st.runtime:
        return
    refusal = backends.old_tensorflow_refusal({"arch": st.spec.arch.value, "runtime": st.runtime},
                                              backends.forced(job.env, job.keras_backend)[0])
    if refusal:
        why, hint = refusal
        raise bad_input(f"job {job.name} on cluster {st.name}: {why}", hint)


def check_offline(st: ClusterState, provider: Provider, job: JobSpec, queue: str = "", priority: str = "",
                  namespace: str = "") -> None:
    """What the cluster's record refuses of a job, asked without the cloud: `submit` and `submit --dry-run` alike
    (issue 63.3: a dry run refuses what the real command refuses)."""
    if st.spec.slices > 1 and job.framework is Framework.TENSORFLOW:
        raise bad_input(f"job {job.name} is TensorFlow (no `framework` in tpuctl.toml): TPUStrategy does not span "
                        f"slices, and cluster {st.name} has {st.spec.slices}",
                        'use one larger slice (`tpuctl up --type ...` without --slices), or a JAX or PyTorch job '
                        '(framework = "jax")')
    if st.spec.slices > 1 and job.framework is Framework.KERAS and \
            backends.forced(job.env, job.keras_backend)[0] == "tensorflow":
        raise bad_input(f"job {job.name} forces Keras's TensorFlow backend: TPUStrategy does not span slices, and "
                        f"cluster {st.name} has {st.spec.slices}",
                        "let tpuctl pick the backend (JAX on Multislice): remove keras_backend / [env] KERAS_BACKEND")
    _check_keras_tensorflow(st, job)
    if provider.remote_runs is None and (queue or priority or namespace):
        raise bad_input("--queue, --priority and --namespace apply to --provider gke clusters",
                        f"leave them out: cluster {st.name}'s runs start as soon as its agent takes them")


def submit(st: ClusterState, provider: Provider, job: JobSpec, args: list[str], transfer: datasync.Transfer,
           reporter: Reporter, down_after: bool = False, sessions: int = 0,
           keep_inputs: bool = False, max_restarts: int = 0,
           notify_urls: list[str] | None = None, queue: str = "", priority: str = "", stall_after: float = 0.0,
           on_stall: str = "restart", namespace: str = "") -> tuple[str, dict[str, int]]:
    """Everything up to the written job.json (and, where runs execute on a service, its hand-over); returns (run
    id, data sync summary). `sessions`: how many sessions a service's run may chain through (0: the default);
    `keep_inputs`: the service keeps the run's inputs once it ends; `max_restarts`: how often the host restarts a
    job that exits 42 or dies by a signal (host/restarts.py); `queue`, `priority`: Kueue's, on GKE; `stall_after`,
    `on_stall`: the run doctor's window (0: the default rule, -1: off) and action (host/stall.py, doctor.py);
    `namespace`: the run's Kubernetes namespace, on GKE."""
    check_launchable(job.command, args, job.env)   # before anything is uploaded: what no host could start
    if st.phase is Phase.DOWN:
        raise TpuctlError(ErrorKind.NOT_FOUND, f"cluster {st.name} is down (its {provider.store_noun} is kept)",
                          f"`tpuctl up -c {st.name}` brings it back")
    if st.phase is not Phase.READY:
        raise TpuctlError(ErrorKind.NOT_FOUND, f"cluster {st.name} is not ready (its `up` did not finish)",
                          f"run `tpuctl up -c {st.name} ...` again")
    check_offline(st, provider, job, queue, priority, namespace)
    namespace = namespace or st.spec.namespace   # `up --namespace` (GKE): the cluster's; job.json keeps the one used
    if provider.remote_runs is not None:
        picked = provider.remote_runs.check_run(st, job, max_restarts, queue, priority, namespace)
        if picked != queue:
            reporter.info(f"the run waits in queue {picked}, cluster {st.name}'s " +
                          ("default" if picked == "default" else "only one") + " (--queue names another)")
        queue = picked
    st = provider.revive(st, reporter)
    provider.check_ready(st)
    if st.runtime and job.framework not in (st.spec.framework, Framework.KERAS):   # Keras 3 follows the runtime
        reporter.warn(f"job {job.name} is a {job.framework.value} job, but cluster {st.name} runs a "
                      f"{st.spec.framework.value} image ({st.runtime}); "
                      f"`tpuctl up --framework {job.framework.value}` on a new cluster matches them")
    store = provider.store(st)
    large = large_job_warning(job)
    if large:
        reporter.warn(large)
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "job.tar.gz"
        sha = packaging.build_file(job.root, job.data, pkg)   # on disk, streamed: never the whole job in memory
        pkg_key = layout.job_package(sha)
        if pkg_key not in store.stats(pkg_key):
            # said before it starts, so the line's time is the upload's (issue 63.6: it read 0s, said only at the end)
            reporter.resource("package", sha[:12], f"uploading {human_bytes(pkg.stat().st_size)}", final=False)
            with said_full(store):
                store.upload_file(str(pkg), pkg_key, lambda n: None)   # content-addressed: a rewrite is harmless
            reporter.resource("package", sha[:12], f"uploaded {human_bytes(pkg.stat().st_size)}", final=True)
        else:
            reporter.resource("package", sha[:12], "unchanged", final=True)
    run_id = runs.new_id()
    try:
        with said_full(store):   # what _write_run wrote of the run is removed first (orphans.py)
            synced, interrupted = _write_run(store, st, job, args, run_id, transfer, reporter, down_after, sha,
                                             max_restarts, notify_urls or [], queue, priority, stall_after, on_stall,
                                             namespace)
    except datasync.Interrupted as e:
        raise TpuctlError(ErrorKind.INTERRUPTED, f"submit stopped while sending data: run {run_id} was never "
                          f"submitted and keeps no data; {e.stored} of {e.missing} new data contents "
                          f"({human_bytes(e.bytes_sent)}) reached the store and stay there (no submit sends them "
                          "again)", "submit again to send the rest and run it") from None
    except KeyboardInterrupt:
        raise TpuctlError(ErrorKind.INTERRUPTED, f"submit stopped before run {run_id} was written: nothing of it is "
                          "in the store", "submit again to run it") from None
    armed.for_run(store, run_id)   # an armed cluster's watch is for the first run submitted after `up --recover`
    if provider.remote_runs is not None:
        provider.remote_runs.dispatch(st, store, run_id, sessions or DEFAULT_SESSIONS,
                                      lambda m: reporter.resource("run", run_id, m, final=True), keep_inputs)
    if interrupted:   # the run is written and handed over: it runs, and the Ctrl-C stops only the following
        raise TpuctlError(ErrorKind.INTERRUPTED, f"run {run_id} was submitted as Ctrl-C came, and runs",
                          f"follow it: tpuctl logs {run_id} -c {st.name} -f; stop it: tpuctl cancel {run_id} "
                          f"-c {st.name}")
    return run_id, synced


def _write_run(store: BlobStore, st: ClusterState, job: JobSpec, args: list[str], run_id: str,
               transfer: datasync.Transfer, reporter: Reporter, down_after: bool, sha: str, max_restarts: int,
               notify_urls: list[str], queue: str = "", priority: str = "", stall_after: float = 0.0,
               on_stall: str = "restart", namespace: str = "") -> tuple[dict[str, int], bool]:
    """The run's data, then its job.json, queue entry and index entry; returns the data sync summary and whether
    a Ctrl-C came once the job.json was being written. A run stopped before its job.json is written (Ctrl-C, a
    failed upload) leaves no data (orphans.py); once it is, Ctrl-C waits for the entries, so a run is never
    written and left unqueued."""
    if job.data:
        orphans.begin(store, run_id)
        reporter.resource("data", layout.run_data(run_id), "syncing", final=False)   # its line's time starts here
    try:
        synced = datasync.sync(store, job.data, job.data_as, run_id, transfer,
                                lambda total: reporter.transfer(total, "hash")) if job.data else {}
        if synced:
            reporter.resource("data", layout.run_data(run_id), f"{synced['uploaded']} of {synced['files']} files "
                              f"sent ({human_bytes(synced['bytes_sent'])}; {human_bytes(synced['bytes_skipped'])} "
                              "unchanged)", final=True)
        spec = RunSpec(id=run_id, name=job.name, command=job.command, args=list(args), env=job.env, package=sha,
                       requirements=job.requirements, submitted=time.time(), cluster=st.name,
                       framework=job.framework.value, down_after=down_after, tensorflow=job.tensorflow,
                       max_restarts=max_restarts, keras_backend=job.keras_backend, queue=queue, priority=priority,
                       stall_after=stall_after, on_stall=on_stall, namespace=namespace)
        with interrupts.held() as interrupted:
            notify.save_run_urls(store, run_id, notify_urls)   # before the run exists: its host reads them
            if not store.create(layout.run_job(run_id), json.dumps(spec.to_json(), indent=2).encode()):
                raise TpuctlError(ErrorKind.ERROR, f"run id {run_id} already exists", "submit again")
            runindex.register(store, run_id)
            if job.data:
                orphans.end(store, run_id)
    except BaseException:
        with interrupts.held():
            if runs.job(store, run_id) is None and job.data:
                try:
                    orphans.discard(store, run_id)
                except Exception:  # noqa: BLE001 - the store failing as well: the mark stays, `status` shows it
                    pass
        raise
    return synced, bool(interrupted)


@dataclass
class Preview:
    """What `submit` would send (`submit --dry-run`)."""
    package_sha256: str
    package_bytes: int                        # packed, as it would be uploaded
    package_unpacked_bytes: int
    package_new: bool                         # True also when there is no store to compare with
    data: list[tuple[str, str, int]]          # (local path, path under TPUCTL_DATA_DIR, bytes)
    data_contents: int                        # distinct contents among the data files
    data_new_contents: int
    bytes_to_send: int
    compared_with_store: bool

    @property
    def data_bytes(self) -> int:
        return sum(size for _, _, size in self.data)


def preview(job: JobSpec, store: BlobStore | None, hashing: datasync.Transfer | None = None) -> Preview:
    """What `submit` would send, without a run: the package (built here, so its size and hash are exact) and each
    data file with where the job sees it; with a store, what of it the store already holds."""
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "job.tar.gz"
        sha = packaging.build_file(job.root, job.data, pkg)
        packed = pkg.stat().st_size
    files = datasync.plan(job.data, job.data_as)
    by_md5 = datasync.contents(files, hashing)
    have = datasync.stored(store) if store is not None else set()
    pkg_new = store is None or layout.job_package(sha) not in store.stats(layout.job_package(sha))
    new = [md5 for md5 in by_md5 if md5 not in have]
    return Preview(sha, packed, packaging.size(job.root, job.data), pkg_new,
                   [(str(path), rel, path.stat().st_size) for path, rel in files], len(by_md5), len(new),
                   (packed if pkg_new else 0) + sum(by_md5[md5][1] for md5 in new), store is not None)


def resolve_run(store: BlobStore, run_id: str | None) -> str:
    """The run `run_id` names: a whole id (one read: its job.json), or a unique start or end of one, as git and
    docker take short ids (runindex.matching); None: the latest run. An empty or blank id is refused: it is what
    `tpuctl cancel "$RUN"` passes with RUN unset, never a way to say "the latest"."""
    if run_id is not None and not run_id.strip():
        raise bad_input(f"empty run id ({run_id!r})", "give a run id; `tpuctl jobs` lists them")
    if run_id is None:
        latest = runindex.latest(store)
        if latest is None:
            raise TpuctlError(ErrorKind.NOT_FOUND, "no runs yet", "`tpuctl submit JOB_DIR` starts one")
        return latest
    part = run_id.lower()
    if runs.is_id(part):
        if runs.job(store, part) is None:
            raise TpuctlError(ErrorKind.NOT_FOUND, f"no run {part}", "`tpuctl jobs` lists runs")
        return part
    if not runindex.is_short_form(part):
        runs.check_id(run_id)   # refused with the id's shape as the hint
    found = runindex.matching(store, part)
    if not found:
        raise TpuctlError(ErrorKind.NOT_FOUND, f"no run id starts or ends with {part!r}", "`tpuctl jobs` lists runs")
    if len(found) > 1:
        shown = ", ".join(found[:SHOWN_CANDIDATES]) + (f" and {len(found) - SHOWN_CANDIDATES} more"
                                                        if len(found) > SHOWN_CANDIDATES else "")
        raise TpuctlError(ErrorKind.INPUT, f"{part!r} is ambiguous: {len(found)} runs match ({shown})",
                          "give more of the id (its start or its end); `tpuctl jobs` lists runs")
    return found[0]


def _row(store: BlobStore, run_id: str, repair: bool = True) -> dict[str, object] | None:
    """A run from its first claim (its first attempt's start: a resumed run's time includes its outages) to its
    end, or now. None for an index entry whose run does not exist (runindex.py; removed from the index unless
    `repair` is False). Each run's files are read alone and not trusted (core/jobfiles.py): a run whose job.json or
    status.json is no such record is a row that says so; a metrics or chips file that cannot be read, a note on
    its row; neither stops the other rows."""
    try:
        job = runs.job(store, run_id)
    except runs.Unreadable as e:
        return _unreadable(run_id, "", e.why)
    if job is None:
        if repair:
            runindex.forget(store, run_id)
        return None
    try:
        st = runs.status(store, run_id)
        return _read_row(store, run_id, job, st)
    except runs.Unreadable as e:
        return _unreadable(run_id, job.name, e.why)
    except (ValueError, TypeError, KeyError, AttributeError, ArithmeticError, RecursionError) as e:
        return _unreadable(run_id, job.name, f"its files are unreadable ({type(e).__name__}: {str(e)[:120]})")


UNREADABLE = "unreadable"   # the state shown for a run whose records cannot be read


def _unreadable(run_id: str, name: str, why: str) -> dict[str, object]:
    return {"id": run_id, "name": name, "state": UNREADABLE, "started": "", "started_at": None, "duration": None,
            "exit_code": None, "attempt": None, "note": why, "restarts": 0, "step": None, "loss": None,
            "loss_curve": "", "goodput": None, "goodput_parts": None, "tpu_duty_pct": None, "tpu": "",
            "sessions": None}


def _read_row(store: BlobStore, run_id: str, job: RunSpec, st: runs.RunStatus) -> dict[str, object]:
    m, metrics_why = metrics.load(store, layout.run_metrics(run_id))
    chips, chips_why = utilisation.load(store, layout.run_chips(run_id, 0))
    start = _first_claim(store, run_id) or st.started
    end = st.ended
    shown = st.state.value
    if not st.state.final and st.heartbeat and time.time() - st.heartbeat > STALE_SECONDS:
        shown = "lost?"   # no heartbeat for 2 minutes: the host may be gone
    losses = [v for _, v in m.history.get("loss", [])] if m else []
    stalls = [float(d["since"]) for d in runs.stalls(store, run_id) if d.get("since")] if m and m.attempts else []
    parts = goodput.breakdown(m.attempts, min(start or m.attempts[0]["start"], m.attempts[0]["start"]),
                              end or time.time(), stalls) if m and m.attempts else None
    return {"id": run_id, "name": job.name, "state": shown,
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start)) if start else "",
            "started_at": start,
            "duration": round((end or time.time()) - start, 1) if start else None,
            "exit_code": st.exit_code, "attempt": st.attempt,
            "note": "; ".join(n for n in (st.note, metrics_why, chips_why) if n), "restarts": st.restarts,
            "stalled_since": st.stalled_since, "failure": st.failure or None,
            "step": m.step if m else None, "loss": m.metrics.get("loss") if m else None,
            "loss_curve": metrics.sparkline(losses),
            "goodput": parts.pop("goodput_pct") if parts else None, "goodput_parts": parts,
            "tpu_duty_pct": utilisation.recent_duty(chips), "tpu": utilisation.shown(chips) if not chips_why else
            "n/a (unreadable)", "sessions": _sessions(store, run_id)}


def _sessions(store: BlobStore, run_id: str) -> list[dict[str, object]] | None:
    """A run on a service (Kaggle): each session's kernel, state and accelerator hours; None for other runs (and
    for a record that cannot be read: the row goes without its sessions)."""
    try:
        rec = jobfiles.read_object(store, layout.run_remote(run_id))
        if not rec:
            return None
        return [{"kernel": s.get("kernel"), "state": s.get("state"),
                 "hours": round((s["ended"] - s.get("started", s["pushed"])) / 3600, 4) if s.get("ended") else None}
                for s in rec.get("sessions", [])]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _first_claim(store: BlobStore, run_id: str) -> float | None:
    try:
        t = (jobfiles.read_object(store, layout.run_claim(run_id, 0)) or {}).get("time")
        return float(t) if t and math.isfinite(float(t)) else None
    except (ValueError, TypeError, OverflowError):
        return None


def table(store: BlobStore, limit: int | None = None, ids: list[str] | None = None,
          repair: bool = True) -> list[dict[str, object]]:
    """One row for each of the `limit` latest runs (None: all), newest first: one short listing of the index,
    then a few small reads a run, 16 at a time (a bucket answers in ~50 ms); older runs are not read at all.
    `ids`: these runs instead (a page of the index `tpuctl ui` listed). `repair=False` (`tpuctl ui`) writes
    nothing: index entries that name no run are left for the next `jobs` to remove."""
    ids = runindex.newest(store, limit, repair=repair) if ids is None else ids
    if not ids:
        return []
    with ThreadPoolExecutor(min(16, len(ids))) as pool:
        rows = [r for r in pool.map(lambda rid: _row(store, rid, repair), ids) if r is not None]
    _recoveries_during(store, rows)
    return rows


def costed(rows: list[dict[str, object]], hourly: float | None) -> None:
    """Each row's `cost_usd`: what the compute cost while the run ran, at the price every cost is counted at
    (status.costing's hourly); None without a price or a duration. `jobs` and `tpuctl ui` show it."""
    for r in rows:
        d = r["duration"]
        r["cost_usd"] = round(d / 3600 * hourly, 4) if isinstance(d, float) and hourly is not None else None


def _recoveries_during(store: BlobStore, rows: list[dict[str, object]]) -> None:
    """Each run's `recoveries`: the recovery watcher's re-creates while it ran (one listing for all runs)."""
    done = [float(r.get("detected_at", 0)) for r in armed.recoveries(store)] if rows else []
    for row in rows:
        start, took = row["started_at"], row["duration"]
        if isinstance(start, float) and isinstance(took, float):
            row["recoveries"] = sum(1 for t in done if start <= t <= start + took)
        else:
            row["recoveries"] = 0


def refresh(st: ClusterState, provider: Provider, store: BlobStore, run_ids: list[str] | None = None) -> None:
    """Where runs execute on a service: bring the records of these (default: every unfinished) run up to date."""
    remote = provider.remote_runs
    if remote is None:
        return
    # runindex.unfinished has read each status already; runs asked for by id are read here
    ids = runindex.unfinished(store) if run_ids is None else \
        [r for r in run_ids if not runs.status(store, r).state.final]
    for run_id in ids:
        remote.advance(st, store, run_id)


def cancel(store: BlobStore, run_id: str) -> str:
    """A queued run never starts once cancelled; a running one gets SIGTERM, then SIGKILL after the grace.
    Returns the whole id of the run `run_id` names."""
    run_id = resolve_run(store, run_id)
    st = runs.status(store, run_id)
    if st.state.final:
        raise TpuctlError(ErrorKind.INPUT, f"run {run_id} already {st.state.value}", "nothing to cancel")
    store.write(layout.run_cancel(run_id), runs.cancel_request(time.time()))
    return run_id
