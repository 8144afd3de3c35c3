"""A run on Kaggle: one or more sessions, each a private script kernel (kernel.py), chained through their outputs.

No agent reads the cluster's store here: `submit` hands the run over (`dispatch`), and whatever looks at the run
next (a following `submit` or `logs -f`, `jobs`, `logs`, `download`, `tpuctl watch`) moves it on (`advance`): it asks
Kaggle for the session's state, and once a session has ended, writes its log into the run's log chunks, fetches its
output into the run's output directory, and either pushes the next session (the job was stopped at the session's
time limit, or asked to continue) or writes the run's final status. So `logs`, `jobs` and `download` read the store
as for every provider.

The run's inputs are one private dataset, named by the hash of its contents (job package, tpuctl's wheel, the run's
data): submitting unchanged work attaches the dataset already there and uploads nothing; a session that starts
later in a chain sees exactly the files its run was submitted with, whatever was submitted since. Kaggle streams
no log through this API while a session runs: each session's log arrives when it ends.
"""
from __future__ import annotations

import io
import json
import os
import tarfile
import time
from pathlib import Path
from typing import Any, Callable

from ...core import layout, runindex, runs
from ...core.errors import ErrorKind, TpuctlError
from ...core.models import ClusterState
from ...core.jobspec import DEFAULT_TENSORFLOW
from ...core.runs import RunSpec, RunState, RunStatus
from ...core.store import BlobStore
from . import kernel
from .client import Kaggle

TPU_SESSION = 9 * 3600      # Kaggle's TPU session limit (kaggle.com/docs/tpu: 9 hours a session, 20 a week)
OTHER_SESSION = 12 * 3600   # GPU and CPU sessions (kaggle.com/docs/notebooks: 12 hours)
MARGIN = 15 * 60            # stopped this long before the limit: time to write the checkpoint and the output
DATASETS = layout.REMOTE_DATASETS
run_record = layout.run_remote


def session_seconds(shape: str) -> float:
    """How long a session may run before the script stops its job (TPUCTL_KAGGLE_SESSION_SECONDS overrides)."""
    if os.environ.get("TPUCTL_KAGGLE_SESSION_SECONDS"):
        return float(os.environ["TPUCTL_KAGGLE_SESSION_SECONDS"])
    return (TPU_SESSION if shape.startswith("Tpu") else OTHER_SESSION) - MARGIN


def grace_seconds() -> float:
    """After the job's deadline, how long it has to save and stop itself before it is stopped
    (TPUCTL_KAGGLE_GRACE_SECONDS, 120; part of the margin before Kaggle's limit)."""
    return float(os.environ.get("TPUCTL_KAGGLE_GRACE_SECONDS", "120"))


def tensorflow_for(job: RunSpec, shape: str) -> str:
    """The TensorFlow a session installs for the job: on a TPU, a TensorFlow job's own (Kaggle's TPU image has only
    tensorflow-cpu: Kaggle/docker-python tpu/requirements.in, "re-enable tensorflow-tpu when a compatible libtpu can
    be found"); elsewhere "" (the image's: Kaggle's GPU and CPU images ship TensorFlow)."""
    if job.framework != "tensorflow" or not shape.startswith("Tpu"):
        return ""
    return job.tensorflow or DEFAULT_TENSORFLOW


def tar_files(files: dict[str, bytes]) -> bytes:
    """Deterministic: the same files always make the same bytes (so the same dataset name)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as t:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(files[name]), 0, 0o644
            t.addfile(info, io.BytesIO(files[name]))
    return raw.getvalue()


class KaggleSessions:
    """providers/base.py RemoteRuns for Kaggle."""

    def __init__(self, shape: Callable[[ClusterState], str], accelerator: Callable[[ClusterState], str]) -> None:
        self.shape, self.accelerator = shape, accelerator

    # -- handing a run over ---------------------------------------------------------------------------
    def dispatch(self, st: ClusterState, store: BlobStore, run_id: str, sessions: int,
                 progress: Callable[[str], None]) -> None:
        job = runs.job(store, run_id)
        assert job is not None, "dispatch follows the run's job.json"
        k = Kaggle()
        from .. import agent_package
        digest, files = kernel.payload(store.read(layout.job_package(job.package)) or b"", agent_package.build(),
                                       tar_files({key[len(layout.run_data(run_id)):]: store.read(key) or b""
                                                  for key, _ in store.list(layout.run_data(run_id))}))
        dataset = f"tpuctl-{digest}"
        self._remember_dataset(store, dataset)
        if k.dataset_exists(dataset):
            progress(f"dataset {dataset} unchanged: nothing uploaded")
        else:
            size = sum(len(b) for b in files.values())
            progress(f"uploading dataset {dataset} ({size / 1e6:.1f} MB, private)")
            k.create_dataset(dataset, f"tpuctl inputs {digest}", files)
        rec: dict[str, Any] = {"dataset": dataset, "sessions": [], "chain": sessions, "chunks": 0, "looked": 0.0}
        self._push_or_fail(k, st, store, run_id, rec)
        store.write(layout.run_status(run_id, 0), json.dumps(RunStatus(
            state=RunState.QUEUED, host=f"kaggle:{k.user}", attempt=1).to_json()).encode())
        progress(f"session 1 pushed: kernel {rec['sessions'][-1]['kernel']} on {self.shape(st) or 'CPU'}")

    def _push(self, k: Kaggle, st: ClusterState, store: BlobStore, run_id: str, rec: dict[str, Any]) -> None:
        job = runs.job(store, run_id)
        assert job is not None
        n = len(rec["sessions"]) + 1
        slug = f"tpuctl-{run_id}-s{n}"
        previous = rec["sessions"][-1]["kernel"] if rec["sessions"] else ""
        shape = self.shape(st)
        # the script of the tpuctl that made the dataset, whichever tpuctl pushes this session: its wheel is there
        rec.setdefault("script", kernel.source())
        script = kernel.render(rec["script"], {"run_id": run_id, "digest": rec["dataset"].removeprefix("tpuctl-"),
                                "previous": bool(previous), "session": n, "command": job.command, "args": job.args,
                                "env": job.env, "requirements": job.requirements, "framework": job.framework,
                                "tensorflow": tensorflow_for(job, shape), "accelerator": self.accelerator(st),
                                "deadline": session_seconds(shape), "grace": grace_seconds()})
        # recorded before the push: `down` deletes it even if the answer is lost
        rec["sessions"].append({"kernel": slug, "pushed": time.time(), "state": "PUSHING"})
        store.write(run_record(run_id), json.dumps(rec).encode())
        version = k.push_kernel(slug, f"tpuctl {run_id} session {n}", script, shape, [rec["dataset"]],
                                [previous] if previous else [], internet=True, timeout=0)
        rec["sessions"][-1].update(state="QUEUED", version=version)
        store.write(run_record(run_id), json.dumps(rec).encode())

    def _push_or_fail(self, k: Kaggle, st: ClusterState, store: BlobStore, run_id: str, rec: dict[str, Any]) -> None:
        """A session Kaggle refuses (quota, phone verification) ends the run FAILED, saying why in its log."""
        try:
            self._push(k, st, store, run_id, rec)
        except TpuctlError as e:
            rec["sessions"][-1]["state"] = "REFUSED"
            self._chunk(store, run_id, rec, f"--- {e.message}" + (f" ({e.hint})" if e.hint else "") + " ---\n")
            self._status(store, run_id, rec, RunState.FAILED, 1)
            raise

    @staticmethod
    def _remember_dataset(store: BlobStore, slug: str) -> None:
        known = json.loads(store.read(DATASETS) or b"[]")
        if slug not in known:
            store.write(DATASETS, json.dumps(known + [slug]).encode())

    # -- moving it on ---------------------------------------------------------------------------------
    def advance(self, st: ClusterState, store: BlobStore, run_id: str) -> str:
        """Moves the run on when Kaggle has news; returns its state in words ("" when it is not a Kaggle run)."""
        raw = store.read(run_record(run_id))
        if raw is None:
            return ""
        rec = json.loads(raw)
        status = runs.status(store, run_id)
        if status.state.final:
            return status.state.value
        s = rec["sessions"][-1]
        poll = float(os.environ.get("TPUCTL_KAGGLE_POLL", "5"))
        if time.time() - rec.get("looked", 0.0) < poll:
            return self._words(rec, s)
        k = Kaggle()
        state, failure = k.kernel_status(s["kernel"])
        rec["looked"] = time.time()
        if state in ("QUEUED", "RUNNING", "NEW_SCRIPT"):
            if state == "RUNNING" and "started" not in s:
                s["started"] = time.time()
            s["state"] = state
            store.write(run_record(run_id), json.dumps(rec).encode())
            self._status(store, run_id, rec, RunState.RUNNING if state == "RUNNING" else RunState.QUEUED)
            return self._words(rec, s)
        self._ended(k, st, store, run_id, rec, state, failure)
        return self._words(rec, rec["sessions"][-1])

    def _ended(self, k: Kaggle, st: ClusterState, store: BlobStore, run_id: str, rec: dict[str, Any], state: str,
               failure: str) -> None:
        s = rec["sessions"][-1]
        s.update(state=state, ended=time.time(), failure=failure)
        files, log = k.kernel_output(s["kernel"])
        marks = {}
        out = Path(store.local_path(layout.run_output(run_id)))
        for name, url in files:
            if name in (kernel.CONTINUE_MARK, kernel.EXIT_MARK):
                marks[name] = True
                if name == kernel.EXIT_MARK:
                    tmp = out.parent / f".{kernel.EXIT_MARK}"
                    k.fetch(url, tmp)
                    s["exit_code"] = int(tmp.read_text() or 1)
                    tmp.unlink()
            elif name.startswith(kernel.OUTPUT + "/"):
                k.fetch(url, out / name[len(kernel.OUTPUT) + 1:])
        took = s["ended"] - s.get("started", s["pushed"])
        header = f"--- Kaggle session {len(rec['sessions'])} ({s['kernel']}): {state} after {took:.0f}s" + \
                 (f": {failure}" if failure else "") + " ---\n"
        self._chunk(store, run_id, rec, header + log)
        cut = kernel.CONTINUE_MARK in marks or "time limit" in failure
        if cut and len(rec["sessions"]) < rec["chain"]:
            self._chunk(store, run_id, rec, f"--- session {len(rec['sessions'])} stopped at its time limit with its "
                        "checkpoint; the next session resumes it ---\n")
            self._push_or_fail(k, st, store, run_id, rec)
            self._status(store, run_id, rec, RunState.QUEUED)
            return
        code = s.get("exit_code", 0 if state == "COMPLETE" else 1)
        if cut:
            code = kernel.CONTINUE_CODE
            self._chunk(store, run_id, rec, f"--- the run used all {rec['chain']} sessions (--chain) and is not "
                        f"finished: submit it again with a larger --chain to go on ---\n")
        final = RunState.CANCELLED if state.startswith("CANCEL") else \
            RunState.SUCCEEDED if code == 0 else RunState.FAILED
        store.write(run_record(run_id), json.dumps(rec).encode())
        self._status(store, run_id, rec, final, code)

    def _chunk(self, store: BlobStore, run_id: str, rec: dict[str, Any], text: str) -> None:
        rec["chunks"] += 1
        store.create(layout.log_chunk(run_id, 0, rec["chunks"]), text.encode())
        store.write(run_record(run_id), json.dumps(rec).encode())

    @staticmethod
    def _status(store: BlobStore, run_id: str, rec: dict[str, Any], state: RunState,
                code: int | None = None) -> None:
        first = rec["sessions"][0]
        now = time.time()
        store.write(layout.run_status(run_id, 0), json.dumps(RunStatus(
            state=state, exit_code=code, started=first.get("started", first["pushed"]),
            ended=now if state.final else None, heartbeat=now, host="kaggle",
            attempt=len(rec["sessions"])).to_json()).encode())
        if state.final:
            runindex.settle(store, run_id, 1)

    @staticmethod
    def _words(rec: dict[str, Any], s: dict[str, Any]) -> str:
        since = s.get("started", s["pushed"])
        return f"Kaggle session {len(rec['sessions'])}: {s['state']} {time.time() - since:.0f}s"

    def cancel(self, st: ClusterState, store: BlobStore, run_id: str) -> None:
        """Kaggle's API cancels a session only by an id no response carries: the session's kernel is deleted,
        which stops it (and drops its output)."""
        raw = store.read(run_record(run_id))
        if raw is None:
            raise TpuctlError(ErrorKind.NOT_FOUND, f"run {run_id} has no Kaggle session", "")
        rec = json.loads(raw)
        Kaggle().delete_kernel(rec["sessions"][-1]["kernel"])
        rec["sessions"][-1]["state"] = "CANCEL_ACKNOWLEDGED"
        store.write(run_record(run_id), json.dumps(rec).encode())
        self._chunk(store, run_id, rec, "--- cancelled: the session's kernel was deleted ---\n")
        self._status(store, run_id, rec, RunState.CANCELLED)

    # -- removing ---------------------------------------------------------------------------------------
    def delete_all(self, store: BlobStore, progress: Callable[[str], None]) -> None:
        """Every kernel and dataset tpuctl made for this cluster (as its store records them), nothing else."""
        k = Kaggle()
        for run_id in runindex.all_ids(store):
            raw = store.read(run_record(run_id))
            for s in json.loads(raw)["sessions"] if raw else []:
                progress(f"deleting kernel {s['kernel']}")
                k.delete_kernel(s["kernel"])
        for slug in json.loads(store.read(DATASETS) or b"[]"):
            progress(f"deleting dataset {slug}")
            k.delete_dataset(slug)
        store.write(DATASETS, b"[]")
