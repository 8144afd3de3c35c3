"""The host's parts, each built from its own context alone (host/contexts.py, issue 41): a store in tmp_path, a
seat, a clock and callables; no Agent, no Attempt. The end-to-end tests (test_rounds, test_restarts, ...) show the
parts working together; these show each one's own rules, in milliseconds."""
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from tpuctl.core import layout, notify, runindex, runs
from tpuctl.core.lifecycle import Clock
from tpuctl.core.runs import RunSpec, RunState, RunStatus
from tpuctl.core.store import BlobStore, LocalStore
from tpuctl.host import jobprocs
from tpuctl.host.autostop import SelfStop
from tpuctl.host.claims import Claims
from tpuctl.host.halts import Halts
from tpuctl.host.logshipper import LogShipper
from tpuctl.host.rounds import Rounds
from tpuctl.host.runevents import RunEvents
from tpuctl.host.supervisor import Supervisor, Watch


@dataclass
class Seat:
    """host/contexts.py's Seat as plain fields."""
    store: BlobStore
    host: str = "h0"
    worker: int = 0
    workers: int = 1
    record: dict[str, Any] = field(default_factory=dict)
    accelerator: str = "cpu"


@pytest.fixture
def store(tmp_path):
    return LocalStore(str(tmp_path / "store"))


def _queued(store, framework="jax") -> str:
    run_id = runs.new_id()
    store.write(layout.run_job(run_id), json.dumps(RunSpec(id=run_id, name="j", command="true", package="p",
                                                           framework=framework).to_json()).encode())
    runindex.register(store, run_id)
    return run_id


def _status(store, run_id, worker, **fields) -> None:
    store.write(layout.run_status(run_id, worker), json.dumps(RunStatus(**fields).to_json()).encode())


# -- autostop.py: SelfStop(seat, stop, clock) -----------------------------------------------------------------
def test_selfstop_ends_an_idle_local_cluster_and_says_why(store):
    stop = threading.Event()
    seat = Seat(store, record={"autostop": 60, "teardown": "exit", "cluster": "c"})
    SelfStop(seat, stop, Clock(now=time.time() - 30)).enforce()
    assert store.read(layout.STOPPED) is None and not stop.is_set()   # idle 30 s of 60
    SelfStop(seat, stop, Clock(now=time.time() - 61)).enforce()
    stopped = json.loads(store.read(layout.STOPPED))
    assert stopped["reason"].startswith("autostop") and stopped["host"] == "h0" and stop.is_set()


def test_selfstop_leaves_the_compute_to_worker_0(store):
    stop = threading.Event()
    seat = Seat(store, worker=1, record={"autostop": 60, "teardown": "exit", "deadline": time.time() - 1})
    selfstop = SelfStop(seat, stop, Clock(now=time.time() - 3600))
    selfstop.enforce()
    assert store.read(layout.STOPPED) is None and not stop.is_set() and selfstop.run_limit() == ""


def test_selfstops_run_limit_is_the_deadline_not_idleness(store):
    seat = Seat(store, record={"autostop": 60, "cluster": "c"})
    selfstop = SelfStop(seat, threading.Event(), Clock(now=time.time() - 3600))
    assert selfstop.run_limit() == ""   # a running run is not idle
    seat.record = {"deadline": time.time() - 1}   # read live: the agent re-reads the record every tick
    assert selfstop.run_limit() == "the cluster's --max-duration deadline has come"


# -- claims.py: Claims(seat, write_status) --------------------------------------------------------------------
def test_claims_take_a_run_once_and_a_second_claimer_is_refused(store):
    run_id = _queued(store)
    first, second = Claims(Seat(store, host="a"), _never), Claims(Seat(store, host="b"), _never)
    assert first.next() == (run_id, 1)
    assert second.next() is None
    assert json.loads(store.read(layout.run_claim(run_id, 0)))["host"] == "a"


def test_claims_lose_the_race_to_a_claim_written_after_they_looked(store, tmp_path):
    class Late(LocalStore):   # the other agent's claim lands between this one's read and its create
        def read(self, key):
            return None if "/claim" in key else super().read(key)
    run_id = _queued(store)
    assert Claims(Seat(store, host="a"), _never).next() == (run_id, 1)
    assert Claims(Seat(Late(str(store.root)), host="b"), _never).next() is None
    assert json.loads(store.read(layout.run_claim(run_id, 0)))["host"] == "a"


def test_claims_take_over_a_run_whose_host_went_quiet(store, monkeypatch):
    run_id = _queued(store)
    assert Claims(Seat(store, host="a"), _never).next() == (run_id, 1)
    _status(store, run_id, 0, state=RunState.RUNNING, host="a", heartbeat=time.time() - 100)
    monkeypatch.setenv("TPUCTL_STALE_SECONDS", "90")
    assert Claims(Seat(store, host="b"), _never).next() == (run_id, 2)


def test_claims_give_up_a_run_after_its_charged_attempts(store):
    run_id = _queued(store)
    store.create(layout.run_claim(run_id, 0), b'{"time": 0}')
    store.create(layout.run_claim(run_id, 0, 3), json.dumps({"host": "a", "charged": 3}).encode())
    _status(store, run_id, 0, state=RunState.INTERRUPTED, host="a", attempt=3, heartbeat=time.time())
    written: list[tuple[str, RunStatus]] = []
    assert Claims(Seat(store, host="b"), lambda r, st: written.append((r, st))).next() is None
    assert [(r, st.state) for r, st in written] == [(run_id, RunState.LOST)]


def test_claims_leave_a_tensorflow_run_to_worker_0(store):
    run_id = _queued(store, framework="tensorflow")
    assert Claims(Seat(store, worker=1, workers=2, record={"hosts": 2}), _never).next() is None
    assert store.read(layout.run_claim(run_id, 1)) is None


def _never(run_id: str, st: RunStatus) -> None:
    raise AssertionError(f"no status expected, got {st.state} for {run_id}")


# -- halts.py: Halts(store, run_id, stop, failed, limit) ------------------------------------------------------
def test_halts_see_a_cancel_the_limit_and_the_stop(store):
    stop, limit = threading.Event(), [""]
    halts = Halts(store, "r1", stop, _not_failed, lambda: limit[0])
    assert not halts.halted() and halts.why_not_restart() == ""
    store.write(layout.run_cancel("r1"), b"{}")
    assert halts.cancel_asked() and halts.halted()
    assert halts.why_not_restart() == "cancelled while waiting to restart: the job is not started again"
    store.delete(layout.run_cancel("r1"))
    limit[0] = "the cluster's --budget is spent (x)"
    assert halts.halted() and halts.limit == limit[0]   # kept for the run's final status
    assert halts.why_not_restart() == "the cluster's --budget is spent (x): ending the run"
    limit[0] = ""
    assert halts.halted()   # a limit that ended the run stays said
    halts = Halts(store, "r1", stop, _not_failed, lambda: "")
    stop.set()
    assert halts.halted()


def test_halts_report_a_store_outage_and_read_it_as_no_cancel(store):
    class Down(LocalStore):
        def read(self, key):
            raise OSError(5, "I/O error")
    failures: list[str] = []
    halts = Halts(Down(str(store.root)), "r1", threading.Event(),
                  lambda e, what: failures.append(what), lambda: "")
    assert halts.cancel_asked() is False and failures == ["run r1's cancel check"]


def _not_failed(e: BaseException, what: str) -> None:
    raise AssertionError(f"{what}: {e}")


# -- rounds.py: Rounds(seat, stop, run_id) --------------------------------------------------------------------
def _rounds(store, worker, stop=None):
    return Rounds(Seat(store, host=f"h{worker}", worker=worker, workers=2, record={"hosts": 2}),
                  stop or threading.Event(), "r1")


def test_rounds_first_caller_wins_the_next_round(store):
    w0, w1 = _rounds(store, 0), _rounds(store, 1)
    assert w0.call(2, "w0's job exited 42", counts=True)["worker"] == 0
    assert w1.call(2, "w1 went quiet")["why"] == "w0's job exited 42"
    assert w1.current() == 2 and w1.restarts(2) == 1
    assert w1.watch(1) == ("w0's job exited 42", w0.called(2))


def test_rounds_assemble_once_every_host_is_ready(store, monkeypatch):
    monkeypatch.setattr("tpuctl.host.rounds.WAIT_POLL_SECONDS", 0.001)
    w0, w1 = _rounds(store, 0), _rounds(store, 1)
    beats: list[str] = []
    w1.mark(1)
    assert w0.assemble(1, beats.append, lambda: False) == (1, "")
    assert w0.assemble(1, beats.append, lambda: True)[1] == ""   # every host already marked: no wait, no halt
    assert w0.assemble(2, beats.append, lambda: True) == (2, "halted")   # w1 never marked round 2
    assert store.read(layout.run_round_ready("r1", 2, 0)) is not None


def test_rounds_find_a_quiet_or_stopped_peer_lost(store, monkeypatch):
    monkeypatch.setenv("TPUCTL_PEER_LOST_SECONDS", "30")
    w0 = _rounds(store, 0)
    assert w0.lost_peer() == ""   # not started yet
    _status(store, "r1", 1, state=RunState.RUNNING, host="h1", heartbeat=time.time())
    assert w0.lost_peer() == ""
    _status(store, "r1", 1, state=RunState.RUNNING, host="h1", heartbeat=time.time() - 31)
    assert w0.lost_peer().startswith("w1 went quiet on h1 (31s")
    _status(store, "r1", 1, state=RunState.INTERRUPTED, host="h1")
    assert w0.lost_peer() == "w1's agent was stopped on h1"
    _status(store, "r1", 1, state=RunState.SUCCEEDED, host="h1")
    assert w0.lost_peer() == ""


# -- runevents.py: RunEvents(store, cluster, run, attempt, worker, host, started) ----------------------------
def _event(store, key) -> dict[str, Any] | None:
    notify.flush(5.0)
    raw = store.read(layout.notify_event(key))
    return json.loads(raw) if raw else None


def test_runevents_started_then_restarted_on_a_later_attempt(store):
    RunEvents(store, "c", "r1", 1, 0, "h0", time.time()).started()
    assert _event(store, "run.started-r1") | {"time": 0} == \
        {"event": "run.started", "cluster": "c", "run": "r1", "host": "h0", "time": 0}
    RunEvents(store, "c", "r1", 2, 0, "h1", time.time()).started()
    assert _event(store, "run.restarted-r1-a2")["host"] == "h1"
    RunEvents(store, "c", "r1", 2, 0, "h1", time.time()).started(restart=1, round_=3)
    assert _event(store, "run.restarted-r1-a2-r1-n3")["round"] == 3


def test_runevents_failed_with_the_logs_tail_and_only_from_worker_0(store):
    RunEvents(store, "c", "r2", 1, 1, "h1", time.time()).ended(1, False)
    assert _event(store, "run.ended-r2") is None
    store.write(layout.run_logs("r2", 0) + "000001.log", b"step 1\nTraceback: boom\n")
    RunEvents(store, "c", "r2", 1, 0, "h0", time.time()).ended(1, False)
    failed = _event(store, "run.ended-r2")
    assert failed["event"] == "run.failed" and failed["exit_code"] == 1 and failed["log_tail"].endswith("boom")


def test_runevents_finished_with_its_duration_and_nothing_for_a_cancel(store):
    RunEvents(store, "c", "r3", 1, 0, "h0", time.time()).ended(130, True)
    assert _event(store, "run.ended-r3") is None
    RunEvents(store, "c", "r3", 1, 0, "h0", time.time() - 60).ended(0, False)
    finished = _event(store, "run.ended-r3")
    assert finished["event"] == "run.finished" and 59 < finished["duration_s"] < 70


# -- supervisor.py: Supervisor(Watch(...), proc, shipper) ----------------------------------------------------
def _supervise(store, tmp_path, script, stop=None, run_id="r1"):
    stop = stop or threading.Event()
    pids: list[int] = []
    busy: list[float] = []
    watch = Watch(run_id, stop, Halts(store, run_id, stop, _not_failed, lambda: ""), pids.append,
                  lambda: busy.append(time.time()), lambda running: None, _not_failed)
    shipper = LogShipper(store, run_id, 0)
    proc = jobprocs.start(script, tmp_path, {"PATH": "/usr/bin:/bin"})
    rc, cancelled = Supervisor(watch, proc, shipper).run()
    shipper.flush(last=True)
    log = b"".join(store.read(k) or b"" for k, _ in store.list(layout.run_logs(run_id, 0)))
    return rc, cancelled, pids, busy, log


def test_supervisor_ships_the_output_and_returns_the_jobs_code(store, tmp_path, monkeypatch):
    monkeypatch.setenv("TPUCTL_DRAIN_SECONDS", "0")
    rc, cancelled, pids, _, log = _supervise(store, tmp_path, "echo step 1; exit 3")
    assert (rc, cancelled) == (3, False) and len(pids) == 1 and log == b"step 1\n"


def test_supervisor_signals_the_job_when_the_agent_stops(store, tmp_path, monkeypatch):
    monkeypatch.setenv("TPUCTL_DRAIN_SECONDS", "0")
    stop = threading.Event()
    stop.set()
    rc, cancelled, *_ = _supervise(store, tmp_path, "trap 'echo saved; exit 143' TERM; sleep 30 & wait", stop)
    assert (rc, cancelled) == (143, False)   # the host's stop: not a cancel (attempt.py records it interrupted)


def test_supervisor_ends_a_cancelled_job(store, tmp_path, monkeypatch):
    monkeypatch.setenv("TPUCTL_DRAIN_SECONDS", "0")
    monkeypatch.setenv("TPUCTL_CANCEL_GRACE", "5")
    store.write(layout.run_cancel("r1"), b"{}")
    started = time.monotonic()
    rc, cancelled, _, busy, _ = _supervise(store, tmp_path, "sleep 30 & wait")
    assert cancelled and rc == 128 + 15 and busy and time.monotonic() - started < 10


def test_supervisor_scans_the_jobs_processes_only_when_the_doctor_asks(store, tmp_path, monkeypatch):
    """The stall check runs every pass of the supervisor's loop (ten a second) and looks every few seconds; the
    job's processes (a scan of /proc that reads every process's open files) are for a stall's stacks, so they are
    found only when the doctor calls for them: a second of a job costs no scan (it was one a pass, some 4 ms of CPU
    each on a machine of a hundred processes), and a stall's dump gets them."""
    monkeypatch.setenv("TPUCTL_DRAIN_SECONDS", "0")
    scans: list[int] = []
    real = jobprocs.JobProcesses.processes
    monkeypatch.setattr(jobprocs.JobProcesses, "processes", lambda self: scans.append(1) or real(self))

    class Doctor:   # the supervisor's side of doctor.Doctor: a look every pass, the job's processes on a stall
        stalled = None
        looks: list = []
        dumped: list = []

        def check(self, pids, output, restarts):
            self.looks.append(len(scans))   # the scans made so far, as this look begins
            if len(self.looks) == 5:
                self.dumped.append(pids())
            return None
    doctor = Doctor()
    watch = Watch("r1", threading.Event(), Halts(store, "r1", threading.Event(), _not_failed, lambda: ""),
                  lambda pid: None, lambda: None, lambda running: None, _not_failed)
    proc = jobprocs.start("sleep 1.5", tmp_path, {"PATH": "/usr/bin:/bin"})
    assert Supervisor(watch, proc, LogShipper(store, "r1", 0), doctor=doctor).run() == (0, False)
    assert len(doctor.looks) >= 10 and doctor.looks == [0] * 5 + [1] * (len(doctor.looks) - 5), doctor.looks
    assert doctor.dumped == [[proc.pid, proc.pid]]             # the main process, and its session's (the same)


class _ReapedLate:
    """The job's process as Popen shows it, reaped late: a process's pipe closes as it exits, before its parent can
    reap it, so the pump can see the end of the output while a poll still finds the process running (here: every
    poll until the pump has ended, and the first one after)."""

    def __init__(self, proc):
        self.proc, self.pump, self.shown = proc, None, False

    def __getattr__(self, name):
        return getattr(self.proc, name)

    def poll(self):
        rc = self.proc.poll()
        if rc is None or self.shown:
            return rc
        if not self.pump.is_alive():
            self.shown = True
        return None


def test_a_drills_answer_says_when_the_job_ended_though_the_pump_saw_it_first(store, tmp_path, monkeypatch):
    """`tpuctl drill -c` waits for the answer's `ended`: the job's end seen only by the loop's own poll still counts
    (it was lost: the drill said `not reached: the run ended before its agent delivered the signal` while the run
    restarted, as soon as the supervisor's passes got faster)."""
    monkeypatch.setenv("TPUCTL_DRAIN_SECONDS", "0")
    store.write(layout.run_drill("r1", 0), json.dumps({"signal": "term", "grace": 5}).encode())
    stop = threading.Event()
    watch = Watch("r1", stop, Halts(store, "r1", stop, _not_failed, lambda: ""), lambda pid: None, lambda: None,
                  lambda running: None, _not_failed)
    proc = _ReapedLate(jobprocs.start("sleep 30", tmp_path, {"PATH": "/usr/bin:/bin"}))
    supervisor = Supervisor(watch, proc, LogShipper(store, "r1", 0))
    proc.pump = supervisor.pump
    assert supervisor.run() == (128 + 15, False) and proc.shown
    done = json.loads(store.read(layout.run_drill_done("r1", 0)))
    assert done["signal"] == "SIGTERM" and done["signalled"] <= done["ended"] <= time.time(), done
