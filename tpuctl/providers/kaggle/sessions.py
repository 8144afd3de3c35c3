"""A run on Kaggle: one or more sessions, each a private script kernel (kernel.py), chained through their outputs.

No agent reads the cluster's store here: `submit` hands the run over (`dispatch`), and whatever looks at the run
next (a following `submit` or `logs -f`, `jobs`, `logs`, `download`, `tpuctl watch`) moves it on (`advance`): it asks
Kaggle for the session's state, and once a session has ended, writes its log into the run's log chunks, fetches its
output into the run's output directory, and either pushes the next session (the job was stopped at the session's
time limit, or asked to continue) or writes the run's final status. So `logs`, `jobs` and `download` read the store
as for every provider.

The run's inputs are one private dataset, named by the hash of its contents (job package, tpuctl's wheel, the run's
data; inputs.py): a session that starts later in a chain sees exactly the files its run was submitted with,
whatever was submitted since, and unchanged work submitted while the dataset is there uploads nothing. A command
that follows the run (`submit`, `logs -f`) shows the running session's lines as Kaggle streams them (livelog.py); the
session's stored log completes them when it ends. What the run keeps in the store is runlog.py's; a session's script
and limits are kernel.py's.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from ...core import knobs, layout, runindex, runs
from ...core.errors import ErrorKind, TpuctlError, bad_input
from ...core.models import ClusterState
from ...core.runs import RunState, RunStatus
from ...core.store import BlobStore
from . import inputs, kernel, runlog
from .client import Kaggle, SourceRefused, slugify
from .livelog import LiveLog
from .outputs import fetch_output

DATASETS = inputs.DATASETS
ORPHAN_SECONDS = 600        # a submit writes the run's record within moments of its job.json: this is generous


class _NoQueue:
    """What base.py RemoteRuns asks of `submit` that Kaggle has none of: no queue, no restarts by default."""
    default_restarts = 0

    def check_run(self, st: ClusterState, job: Any, max_restarts: int, queue: str, priority: str,
                  namespace: str = "") -> str:
        """Every framework runs in a Kaggle session (kernel.py picks what it installs); there is no queue."""
        if queue or priority or namespace:
            raise bad_input("--queue, --priority and --namespace apply to --provider gke clusters",
                            "leave them out: a Kaggle session starts when Kaggle gives it a TPU")
        return ""


class KaggleSessions(_NoQueue):
    """providers/base.py RemoteRuns for Kaggle."""
    restarts = False   # a session continues by CONTINUE_CODE, not by restarts (cli/runs.py refuses --max-restarts)

    def __init__(self, shape: Callable[[ClusterState], str], accelerator: Callable[[ClusterState], str]) -> None:
        self.shape, self.accelerator = shape, accelerator
        self._live: dict[str, LiveLog] = {}   # kernel slug -> its log stream, while this process follows it
        self._holder = runlog.Holder()   # the runs this tpuctl moves on now

    # -- handing a run over ---------------------------------------------------------------------------
    def dispatch(self, st: ClusterState, store: BlobStore, run_id: str, sessions: int,
                 progress: Callable[[str], None], keep_inputs: bool = False) -> None:
        """Whatever stops the run before its first session runs (credentials refused, a dataset Kaggle could not
        process, a refused push) ends it FAILED with the reason in its log: no run waits `queued` for ever."""
        rec: dict[str, Any] = {"dataset": "", "sessions": [], "chain": sessions, "chunks": 0, "looked": 0.0,
                               "keep": keep_inputs}
        runlog.save(store, run_id, rec)   # `cancel` and `down` find the run from now on
        try:
            k = Kaggle()
            rec["dataset"] = self._inputs(k, store, run_id, progress)
            self._push(k, st, store, run_id, rec)
        except TpuctlError as e:
            self._refused(store, run_id, rec, e)
            inputs.release(store, run_id, rec)
            raise
        store.write(layout.run_status(run_id, 0), json.dumps(RunStatus(
            state=RunState.QUEUED, host=f"kaggle:{k.user}", attempt=1).to_json()).encode())
        progress(f"session 1 pushed: kernel {rec['sessions'][-1]['kernel']} on {self.shape(st) or 'CPU'}")

    def _inputs(self, k: Kaggle, store: BlobStore, run_id: str, progress: Callable[[str], None]) -> str:
        """The run's dataset, READY on Kaggle: reused when it is there and READY, waited for while Kaggle processes
        it, made again when Kaggle's processing FAILED. Its title's slug is its slug (Kaggle derives one from it)."""
        job = runs.job(store, run_id)
        assert job is not None, "dispatch follows the run's job.json"
        from .. import agent_package
        digest, files = kernel.payload(store.read(layout.job_package(job.package)) or b"", agent_package.build(),
                                       inputs.tar_files({key[len(layout.run_data(run_id)):]: store.read(key) or b""
                                                  for key, _ in store.list(layout.run_data(run_id))}))
        dataset = f"tpuctl-{digest}"
        inputs.remember(store, dataset)
        return inputs.ensure(k, dataset, f"tpuctl {digest}", files, progress, lambda d: inputs.remember(store, d))

    def _push(self, k: Kaggle, st: ClusterState, store: BlobStore, run_id: str, rec: dict[str, Any]) -> None:
        job = runs.job(store, run_id)
        assert job is not None
        n = len(rec["sessions"]) + 1
        # Kaggle names a kernel after its title (client.push_kernel): this title's slug is the slug asked for
        title = f"tpuctl {run_id} s{n}"
        slug = slugify(title)
        previous = rec["sessions"][-1]["kernel"] if rec["sessions"] else ""
        shape = self.shape(st)
        # the script of the tpuctl that made the dataset, whichever tpuctl pushes this session: its wheel is there
        rec.setdefault("script", kernel.source())
        script = kernel.render(rec["script"], {"run_id": run_id, "digest": _digest(rec["dataset"]),
                                "previous": bool(previous), "session": n, "command": job.command, "args": job.args,
                                "env": job.env, "requirements": job.requirements, "framework": job.framework,
                                "keras_backend": job.keras_backend, "platform": "kaggle",
                                "tensorflow": kernel.tensorflow_for(job, shape), "accelerator": self.accelerator(st),
                                "deadline": kernel.session_seconds(shape), "grace": kernel.grace_seconds()})
        # recorded before the push: `down` deletes it even if the answer is lost
        rec["sessions"].append({"kernel": slug, "pushed": time.time(), "state": "PUSHING"})
        runlog.save(store, run_id, rec)
        ref, version = _push_waiting(lambda: k.push_kernel(slug, title, script, shape, [rec["dataset"]],
                                                           [previous] if previous else [], internet=True, timeout=0),
                                     lambda: self._holder.take(store, run_id) is not None)
        if ref != slug:   # Kaggle named it otherwise: its name from now on, ours kept for `down`
            rec["sessions"][-1]["asked"] = slug
        rec["sessions"][-1].update(kernel=ref, state="QUEUED", version=version)
        runlog.save(store, run_id, rec)

    def _push_or_fail(self, k: Kaggle, st: ClusterState, store: BlobStore, run_id: str, rec: dict[str, Any]) -> None:
        """A session Kaggle refuses (quota, phone verification) ends the run FAILED, saying why in its log."""
        try:
            self._push(k, st, store, run_id, rec)
        except HoldLost:
            raise   # the run is another tpuctl's now: nothing of it is written here
        except TpuctlError as e:
            self._refused(store, run_id, rec, e)
            inputs.release(store, run_id, rec, k)
            raise

    def _refused(self, store: BlobStore, run_id: str, rec: dict[str, Any], e: TpuctlError) -> None:
        if rec["sessions"] and rec["sessions"][-1]["state"] == "PUSHING":
            rec["sessions"][-1]["state"] = "REFUSED"
        runlog.chunk(store, run_id, rec, f"--- {e.message}" + (f" ({e.hint})" if e.hint else "") + " ---\n")
        runlog.status(store, run_id, rec, RunState.FAILED, 1, note=e.message)

    # -- moving it on ---------------------------------------------------------------------------------
    def advance(self, st: ClusterState, store: BlobStore, run_id: str, follow: bool = False) -> str:
        """Moves the run on when Kaggle has news; returns its state in words ("" when it is not a Kaggle run).
        `follow`: the caller shows the run's log as it grows, so the running session's stream is read too."""
        raw = store.read(runlog.run_record(run_id))
        if raw is None:
            return self._orphan(store, run_id)
        rec = json.loads(raw)
        status = runs.status(store, run_id)
        if status.state.final or not rec["sessions"]:
            self._holder.let_go(run_id)
            return status.state.value
        taken = self._holder.take(store, run_id)
        if taken is None:
            return runlog.words(rec, rec["sessions"][-1])   # another tpuctl moves it on and writes its log
        try:
            if taken:   # what the previous holder wrote before this one's lease began
                rec = json.loads(store.read(runlog.run_record(run_id)) or raw)
            return self._advance(st, store, run_id, rec, follow)
        finally:
            if not follow:
                self._holder.let_go(run_id)

    def let_go(self, run_id: str) -> None:
        self._holder.let_go(run_id)

    def _advance(self, st: ClusterState, store: BlobStore, run_id: str, rec: dict[str, Any], follow: bool) -> str:
        s = rec["sessions"][-1]
        if follow and s["state"] in ("QUEUED", "RUNNING", "NEW_SCRIPT"):
            self._stream(store, run_id, rec, s)
        if time.time() - rec.get("looked", 0.0) < poll_seconds(s):
            return runlog.words(rec, s)
        k = Kaggle()
        try:
            state, failure = k.kernel_status(s["kernel"])
        except TpuctlError as e:
            if e.kind is not ErrorKind.NOT_FOUND:
                raise
            runlog.gone(store, run_id, rec, f"its Kaggle kernel {s['kernel']} is gone (deleted outside tpuctl?)")
            inputs.release(store, run_id, rec, k)
            return runlog.words(rec, s)
        rec["looked"] = time.time()
        if state in ("QUEUED", "RUNNING", "NEW_SCRIPT"):
            if state == "RUNNING" and "started" not in s:
                s["started"] = time.time()
            s["state"] = state
            runlog.save(store, run_id, rec)
            runlog.status(store, run_id, rec, RunState.RUNNING if state == "RUNNING" else RunState.QUEUED)
            return runlog.words(rec, s)
        self._ended(k, st, store, run_id, rec, state, failure)
        return runlog.words(rec, rec["sessions"][-1])

    def _orphan(self, store: BlobStore, run_id: str) -> str:
        """A run whose submit stopped before handing it to Kaggle (killed between its job.json and its first
        record, or made by an earlier tpuctl that wrote the record only after the upload) would wait `queued` for
        ever: past ORPHAN_SECONDS it ends, saying so."""
        job, status = runs.job(store, run_id), runs.status(store, run_id)
        if job is None or status.state.final or time.time() - job.submitted < ORPHAN_SECONDS:
            return ""
        rec: dict[str, Any] = {"dataset": "", "sessions": [], "chain": 1, "chunks": 0}
        runlog.gone(store, run_id, rec, "it never reached Kaggle (submit interrupted): submit it again",
                    RunState.FAILED)
        return RunState.FAILED.value

    def _stream(self, store: BlobStore, run_id: str, rec: dict[str, Any], s: dict[str, Any]) -> None:
        """Writes the stream's new events into the run's log; (re)connects when there is no stream, or when it
        ended while the session still runs (a queued session has no stream yet) and a poll is due."""
        live = self._live.get(s["kernel"])
        if live is None or live.finished and time.time() - live.ended_at >= poll_seconds(s):
            live = self._live[s["kernel"]] = LiveLog(Kaggle(), s["kernel"])
        new = live.events[s.get("streamed", 0):]
        if new:
            s["streamed"] = s.get("streamed", 0) + len(new)
            runlog.chunk(store, run_id, rec, "".join(runlog.line(e) for e in new))

    def _ended(self, k: Kaggle, st: ClusterState, store: BlobStore, run_id: str, rec: dict[str, Any], state: str,
               failure: str) -> None:
        s = rec["sessions"][-1]
        s.update(state=state, ended=time.time(), failure=failure)
        live = self._live.pop(s["kernel"], None)
        if live:
            live.stop()
        files, log = k.kernel_output(s["kernel"])
        marks, exit_code, progressed = fetch_output(files, Path(store.local_path(layout.run_output(run_id))),
                                                     lambda why: runlog.chunk(store, run_id, rec, f"--- {why} ---\n"))
        if exit_code is not None:
            s["exit_code"] = exit_code
        took = s["ended"] - s.get("started", s["pushed"])
        rest = "".join(runlog.line(e) for e in log[s.get("streamed", 0):])   # what the stream has not shown
        # after the session's lines (which the stream may have shown while it ran), how it ended
        runlog.chunk(store, run_id, rec, rest + f"--- Kaggle session {len(rec['sessions'])} ({s['kernel']}): "
                    f"{state} after {took:.0f}s" + (f": {failure}" if failure else "") + " ---\n")
        # Cut at the limit: the script marked it so, or Kaggle stopped the script before its exit mark (an ERROR
        # whatever its message says) after the job had written new output (a checkpoint to resume from). A script
        # that failed on its own before the job wrote anything does not chain.
        cut = kernel.CONTINUE_MARK in marks or \
            (kernel.EXIT_MARK not in marks and state == "ERROR" and progressed)
        if cut and len(rec["sessions"]) < rec["chain"]:
            runlog.chunk(store, run_id, rec, f"--- session {len(rec['sessions'])} stopped at its time limit with its "
                        "checkpoint; the next session resumes it ---\n")
            self._push_or_fail(k, st, store, run_id, rec)
            runlog.status(store, run_id, rec, RunState.QUEUED)
            return
        code = s.get("exit_code", 0 if state == "COMPLETE" else 1)
        if cut:
            code = kernel.CONTINUE_CODE
            runlog.chunk(store, run_id, rec, f"--- the run used all {rec['chain']} sessions (--chain) and is not "
                        f"finished: submit it again with a larger --chain to go on ---\n")
        final = RunState.CANCELLED if state.startswith("CANCEL") else \
            RunState.SUCCEEDED if code == 0 else RunState.FAILED
        runlog.save(store, run_id, rec)
        runlog.status(store, run_id, rec, final, code)
        inputs.release(store, run_id, rec, k)

    def cancel(self, st: ClusterState, store: BlobStore, run_id: str) -> None:
        """Deletes the session's kernel, which stops it (client.delete_kernel: no response carries the session id
        that CancelKernelSession takes), then checks Kaggle no longer has it. A run that never reached Kaggle
        is cancelled here alone."""
        done = runs.status(store, run_id).state
        if done.final:
            raise TpuctlError(ErrorKind.INPUT, f"run {run_id} already {done.value}", "nothing to cancel")
        raw = store.read(runlog.run_record(run_id))
        rec: dict[str, Any] = json.loads(raw) if raw else {"dataset": "", "sessions": [], "chain": 1, "chunks": 0}
        if rec["sessions"]:
            k = Kaggle()
            slug = rec["sessions"][-1]["kernel"]
            k.delete_kernel(slug)
            try:
                state, _ = k.kernel_status(slug)
            except TpuctlError as e:
                if e.kind is not ErrorKind.NOT_FOUND:
                    raise
                state = ""
            if state in ("QUEUED", "RUNNING", "NEW_SCRIPT"):
                raise TpuctlError(ErrorKind.ERROR, f"Kaggle still runs {slug} after its deletion ({state})",
                                  f"cancel again, or stop it at https://www.kaggle.com/code/{k.user}/{slug}")
            rec["sessions"][-1]["state"] = "CANCEL_ACKNOWLEDGED"
        runlog.chunk(store, run_id, rec, "--- cancelled" + (": the session's kernel was deleted" if rec["sessions"]
                                                           else " before it reached Kaggle") + " ---\n")
        _say_counted(store, run_id, rec, self.shape(st))
        runlog.status(store, run_id, rec, RunState.CANCELLED)
        inputs.release(store, run_id, rec)

    # -- removing ---------------------------------------------------------------------------------------
    def delete_all(self, store: BlobStore, progress: Callable[[str], None]) -> None:
        """Every kernel and dataset tpuctl made for this cluster (as its store records them), nothing else; a run
        not finished ends first ("ended: cluster taken down"), so no run waits for a session that is gone."""
        k = Kaggle()
        for run_id in runindex.all_ids(store):
            raw = store.read(runlog.run_record(run_id))
            rec = json.loads(raw) if raw else None
            if rec is None:
                continue
            if not runs.status(store, run_id).state.final:
                runlog.gone(store, run_id, rec, "cluster taken down")
            for s in rec["sessions"]:
                for slug in {s["kernel"], s.get("asked", s["kernel"])}:
                    progress(f"deleting kernel {slug}")
                    k.delete_kernel(slug)
        for slug in json.loads(store.read(DATASETS) or b"[]"):
            progress(f"deleting dataset {slug}")
            k.delete_dataset(slug)
        store.write(DATASETS, b"[]")


def _digest(dataset: str) -> str:
    """The inputs' digest in the run's dataset slug, `tpuctl-<digest>[-<suffix>]` (a fresh slug's suffix: inputs.py)."""
    return dataset.removeprefix("tpuctl-").split("-")[0]


def _say_counted(store: BlobStore, run_id: str, rec: dict[str, Any], shape: str) -> None:
    """After a cancel of a TPU session, the run's log says whether Kaggle still counts it (still_counted)."""
    if rec["sessions"] and shape.startswith("Tpu"):
        runlog.chunk(store, run_id, rec, f"--- {still_counted(Kaggle())} ---\n")


def still_counted(k: Kaggle) -> str:
    """After a cancel, whether Kaggle still counts running sessions against the TPU quota. Whether deleting a kernel
    stops its session and quota clock is not established, and CancelKernelSession takes a session id that no response
    tpuctl sees carries (kagglesdk ApiCancelKernelSessionRequest.kernel_session_id): the quota's time_reserved
    ("reserved by currently-running sessions", ApiAcceleratorQuota) is what can be read."""
    try:
        reserved = float(k.tpu_quota()["reserved"])
    except TpuctlError as e:
        return f"whether Kaggle still counts the session is unknown ({e.message})"
    if reserved <= 0:
        return "Kaggle's TPU quota counts no running session now"
    return (f"Kaggle's TPU quota still counts {reserved:.0f}s for running sessions: the deleted kernel's session may "
            "still be counted (`tpuctl status` shows it; https://www.kaggle.com/code shows what runs)")


class HoldLost(TpuctlError):
    """Another tpuctl holds the run now (runlog.Holder): it moves it on."""


def _push_waiting(push: Callable[[], tuple[str, int]], keep: Callable[[], bool]) -> tuple[str, int]:
    """push(), again while Kaggle refuses to attach the previous session's output: whether a just-finished session's
    output can be attached to the next kernel at once is not established (issue 39 item 5). Backs off as the client
    polls (TPUCTL_KAGGLE_POLL, x1.5, to 30 s) for TPUCTL_KAGGLE_INPUT_WAIT seconds (600), then the refusal stands,
    with how long it was tried: the run ends with the reason (_push_or_fail). `keep` renews this tpuctl's hold on the
    run between tries (runlog.Holder): a wait longer than the lease must not let a second tpuctl push it too."""
    limit = knobs.number("TPUCTL_KAGGLE_INPUT_WAIT", 600)
    pause, start = knobs.number("TPUCTL_KAGGLE_POLL", 5), time.time()
    while True:
        try:
            return push()
        except SourceRefused as e:
            if time.time() - start + pause > limit:
                raise TpuctlError(ErrorKind.REFUSED, f"{e.message}, still after {time.time() - start:.0f}s",
                                  "submit the run again later") from None
            time.sleep(pause)
            pause = min(pause * 1.5, 30.0)
            if not keep():
                raise HoldLost(ErrorKind.ERROR, "another tpuctl took the run over while its next session waited "
                                  "for its input", "it pushes the session itself") from None


def poll_seconds(s: dict[str, Any]) -> float:
    """How often a session's state is asked: TPUCTL_KAGGLE_POLL (5 s, the client's first poll) while it is young,
    growing with its age up to 12x that (a 9-hour session is not asked 6,000 times; kaggle_api_extended
    `_adaptive_sleep` starts at 5 s and grows 1.5x a poll to a cap)."""
    base = knobs.number("TPUCTL_KAGGLE_POLL", 5)
    age = time.time() - s.get("started", s["pushed"])
    return base * min(12.0, max(1.0, age / 300))


