"""`tpuctl drill`: what a preemption delivers, at moments the job chooses by the phases it reports
(tpuctl/runtime/phases.py: OUTPUT/phase.json), and what came of it, judged from what the store holds.

The drill adds no restart path of its own: the job runs as any run (`submit --max-restarts`, one restart per
drill), its host's agent sees it end by the signal and restarts it (host/restarts.py), exactly as after a spot VM's
notice that reached the job alone. Drills run one per start of the job, in the order asked: drill K signals the
job's K-th start. Each one:
- waits for its phase in that start (start, compile, step: mid-run, save: a checkpoint being written, eval), or
  the run's end (`not reached`: fails nothing); a job that reports no phases is drilled by time (`--by-time`
  seconds into its start) and the report says so;
- sends SIGTERM, then SIGKILL once the grace is over (a spot VM's notice: 30 s, RUN_HEALTH_FACTS.md section 1), or
  SIGKILL alone (a lost host), to the job's process group (its main process leads a session of its own:
  host/jobprocs.start);
- reads the next start: the step it resumed from (metrics.json's attempts: the job's own count), the checkpoint it
  should have resumed from (phase.json's completed saves), the steps redone, the time to its first step and the
  compile within it (phase.json's compile -> step times), and the goodput it cost.
A drill passes when the job resumed from its last checkpoint, and: after SIGTERM, it ended within the grace with
nothing redone (it saved what it had); after SIGKILL, it redid no more than one checkpoint interval.

The signals reach the job's processes on this machine (LocalSignals: the drill's temporary local cluster,
cli/drill.py), or go through the run's agent on an existing cluster (AgentSignals: a request in the store its
supervisor delivers, then the job's restart is the agent's own; across hosts a new round): no TPU is deleted.
Where the job reports its data reader's position (runtime.data_position), each resumed start's is checked against
the one an earlier start had at that step.
"""
from __future__ import annotations

import json
import os
import random
import signal
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..core import knobs, layout, processes, runs
from ..core.errors import bad_input
from ..core.metrics import PHASES, parse, phase_doc
from ..core.store import BlobStore

SIGNALS = ("term", "kill")
DEFAULT = "start,compile,step,save,step:kill,eval"


@dataclass(frozen=True)
class Drill:
    phase: str
    signal: str = "term"

    @property
    def label(self) -> str:
        return self.phase + (":kill" if self.signal == "kill" else "")


def plan(at: str | None, random_n: int = 0, seed: int | None = None) -> list[Drill]:
    """The drills asked: `--at start,save,step:kill` (phases, each with `:kill` for SIGKILL alone), or `--random N`
    drills at phases and signals drawn with `seed`."""
    if random_n:
        rng = random.Random(seed)
        return [Drill(rng.choice(PHASES), rng.choice(SIGNALS)) for _ in range(random_n)]
    drills = []
    for word in (at or DEFAULT).split(","):
        name, _, sig = word.strip().partition(":")
        if name not in PHASES or sig not in ("", *SIGNALS):
            raise bad_input(f"--at {word!r} is not a phase ({', '.join(PHASES)}), with :kill for SIGKILL alone",
                            f"e.g. --at {DEFAULT}")
        drills.append(Drill(name, sig or "term"))
    return drills


@dataclass
class Outcome:
    phase: str
    signal: str                        # "SIGTERM" (then SIGKILL after the grace) or "SIGKILL"
    reached: bool = False
    by_time: bool = False              # the job reports no phases: signalled by time
    step: int | None = None            # the job's step when signalled
    saved_in_grace: bool | None = None  # a checkpoint completed between the signal and the job's end
    ended_in_grace: bool | None = None  # the job ended by itself before SIGKILL (SIGTERM drills)
    last_checkpoint: int | None = None  # the newest checkpoint complete when the job ended
    # the job ended at SIGTERM at once, its proof written (runtime.listen_for_stop: phase.json's "stopped"): the
    # step it had reported was its newest checkpoint's, so it had nothing to save
    stopped_at_checkpoint: bool | None = None
    resumed_from: int | None = None
    redone: int | None = None          # steps the next start does again
    to_first_step_s: float | None = None   # from the job's end to the next start's first step
    compile_s: float | None = None         # of which the first step's compile (or cache load)
    goodput_cost_s: float | None = None    # the restart's time plus the steps redone
    # the data position check (runtime.data_position): "same" (the resumed start's reader began where an
    # uninterrupted run's was at that step), "different", or None (the job reports no position, or no earlier start
    # reported one at that step)
    data: str | None = None
    passed: bool | None = None         # None: not reached
    note: str = ""
    why: str = ""
    hint: str = ""
    times: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc.pop("times")
        return doc


class Job:
    """What the store says about the drilled run (local: files), and its job's process group."""

    def __init__(self, store: BlobStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id

    def phase(self) -> dict[str, Any]:
        return phase_doc(self.store, self.run_id)

    def attempts(self) -> list[dict[str, float]]:
        m = parse(self.store.read(layout.run_metrics(self.run_id)))
        return m.attempts if m else []

    def status(self) -> runs.RunStatus:
        return runs.status(self.store, self.run_id)


def _is_run(pid: int, run_id: str) -> bool:
    """The process carries the run's TPUCTL_RUN_ID: a pid from status.json may have been reused."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"TPUCTL_RUN_ID={run_id}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)   # the job's session: its main process and what it started
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Delivered:
    """What became of a signal: when it was sent, when the job's process ended, whether SIGKILL ended it after the
    grace (always, for a SIGKILL drill); `why`: it could not be sent (the drill is then `not reached`)."""
    signalled: float = 0.0
    ended: float = 0.0
    killed: bool = False
    phase: str | None = None   # the job's phase when the signal landed, where the signaller can tell
    why: str = ""
    job: dict[str, Any] = field(default_factory=dict)   # the signalled start's phase.json as it ended, where known


class LocalSignals:
    """The signals straight to the job's process group on this machine (the drill's own local cluster)."""

    def __init__(self, job: Job, poll: float) -> None:
        self.job, self.poll = job, poll

    def deliver(self, start: int, kill: bool, grace: float) -> Delivered:
        # the agent writes the job's pid to status.json once it started it: the job's own first phase (a `start`
        # drill) may come before that write
        deadline = time.monotonic() + knobs.number("TPUCTL_DRILL_PID_WAIT", 10)
        while not ((pid := self.job.status().pid) and _is_run(pid, self.job.run_id)):
            if time.monotonic() >= deadline:
                return Delivered(why="not reached: the job's process was not found on this machine")
            time.sleep(max(self.poll, 0.05))
        d = Delivered(signalled=time.time(), killed=kill)
        _signal(pid, signal.SIGKILL if kill else signal.SIGTERM)
        while processes.running(pid) and not d.killed:
            if time.time() - d.signalled >= grace:
                _signal(pid, signal.SIGKILL)
                d.killed = True
                break
            time.sleep(self.poll)
        while processes.running(pid):
            time.sleep(self.poll)
        d.ended = time.time()
        return d


class AgentSignals:
    """The signals through the run's agent (`tpuctl drill -c CLUSTER`): a request in the store for the job's start
    (layout.run_drill), which the agent's supervisor reads at its once-a-second cancel check and delivers as it
    delivers a cancel, then the job's end is the job's own (a restart; across hosts a new round); the agent's answer
    (layout.run_drill_done) says when it signalled and when the job ended. No TPU is deleted: the host stays."""

    def __init__(self, job: Job, poll: float, wait: float) -> None:
        self.job, self.poll, self.wait = job, poll, wait

    def deliver(self, start: int, kill: bool, grace: float) -> Delivered:
        store, run_id = self.job.store, self.job.run_id
        store.write(layout.run_drill(run_id, start), json.dumps(
            {"signal": "kill" if kill else "term", "grace": grace, "time": time.time()}).encode())
        deadline = time.monotonic() + grace + self.wait
        while time.monotonic() < deadline:
            raw = store.read(layout.run_drill_done(run_id, start))
            done = json.loads(raw) if raw else None
            if done and done.get("ended"):
                job = done.get("job")
                return Delivered(float(done["signalled"]), float(done["ended"]), bool(done.get("killed")),
                                 done.get("phase") or None, job=job if isinstance(job, dict) else {})
            if self.job.status().state.final:
                return Delivered(why="not reached: the run ended before its agent delivered the signal")
            time.sleep(max(self.poll, 0.1))
        return Delivered(why=f"not reached: the agent did not answer within {grace + self.wait:g} s "
                         "(TPUCTL_DRILL_WAIT): is it running?")


class Driver:
    """Runs the drills against one run, each on the next start of its job (see the module's docstring)."""

    def __init__(self, job: Job, grace: float, say: Callable[[str], None] = lambda _: None,
                 by_time: float = 60.0, through_agent: bool = False) -> None:
        self.job, self.grace, self.say, self.by_time = job, grace, say, by_time
        self.poll = knobs.number("TPUCTL_DRILL_POLL", 0.005)
        self.wait = knobs.number("TPUCTL_DRILL_WAIT", 1800)
        self.signals: LocalSignals | AgentSignals = AgentSignals(job, self.poll, self.wait) if through_agent \
            else LocalSignals(job, self.poll)
        self.saves: dict[int, float] = {}   # every completed checkpoint seen: step -> when
        self.starts: dict[int, tuple[int, set[int]]] = {}   # each start seen: the step it resumed from, its saves
        self.data: dict[int, Any] = {}   # the reader's position at a step, as the job reported it (data_position)
        self.restarts = 0                   # the start the next drill signals (TPUCTL_RESTARTS)
        self.ended = False

    def run(self, drills: list[Drill]) -> list[Outcome]:
        out = []
        for i, d in enumerate(drills):
            o = Outcome(d.phase, "SIGKILL" if d.signal == "kill" else "SIGTERM")
            # the next drill in the start or compile phase of the next start: that start's first step never comes
            early = i + 1 < len(drills) and drills[i + 1].phase in ("start", "compile")
            if not self.ended:
                self._one(d, o, early)
            if not o.reached:
                o.why = o.why or "not reached: the run ended before this phase"
            out.append(o)
        return out

    def _saw(self, doc: dict[str, Any]) -> None:
        for step, at in doc.get("saves") or []:
            self.saves.setdefault(int(step), float(at))
        for step, position in [*(doc.get("data_at") or []), *([doc["data_from"]] if doc.get("data_from") else [])]:
            self.data.setdefault(int(step), position)
        if "from" in doc and "restarts" in doc:
            saves = self.starts.setdefault(int(doc["restarts"]), (int(doc["from"]), set()))[1]
            saves.update(int(step) for step, _ in doc.get("saves") or [])

    def _wait_for(self, d: Drill, o: Outcome) -> dict[str, Any] | None:
        """The phase document once the job's start self.restarts is in d's phase (None: the run ended, or the
        wait's deadline passed: o.why says which)."""
        deadline = time.monotonic() + self.wait
        began, looked, st = None, 0.0, self.job.status()
        while time.monotonic() < deadline:
            # phase.json at every poll (a small checkpoint's save lasts milliseconds), status.json 5 times a second
            if time.monotonic() - looked >= 0.2:
                st, looked = self.job.status(), time.monotonic()
            if st.state.final:
                self.ended = True
                return None
            doc = self.job.phase()
            self._saw(doc)
            if int(doc.get("restarts", -1)) > self.restarts:
                self.restarts = int(doc["restarts"])   # the job restarted by itself meanwhile
            if st.pid and st.restarts >= self.restarts and began is None:
                began = time.monotonic()
            if doc and int(doc.get("restarts", -1)) == self.restarts and _in(doc, d.phase):
                return doc
            if not doc and began is not None and time.monotonic() - began >= self.by_time and st.pid:
                o.by_time = True   # no phase.json: a job without tpuctl.runtime's callbacks
                return {"restarts": self.restarts, "step": None}
            time.sleep(self.poll)
        o.why = f"not reached within {self.wait:g} s (TPUCTL_DRILL_WAIT)"
        return None

    def _one(self, d: Drill, o: Outcome, early: bool = False) -> None:
        doc = self._wait_for(d, o)
        if doc is None:
            return
        # the step: phase.json's is the one the phase began at; metrics.json's (flushed every
        # TPUCTL_PROGRESS_SECONDS, which the drill's cluster sets to 0.2) is newer in the middle of a run
        steps = [int(doc["step"])] if doc.get("step") is not None else []
        t_now = time.time()
        began = float((doc.get("phases") or {}).get("start", t_now))
        steps += [int(a.get("step", 0)) for a in self.job.attempts()[-1:] if began <= a.get("start", 0) <= t_now]
        self.say(f"drill {d.label}: {o.signal} to the job at step {max(steps) if steps else None} "
                 f"(start {self.restarts})")
        got = self.signals.deliver(self.restarts, d.signal == "kill", self.grace)
        if got.why:
            o.why = got.why
            return
        o.reached, o.step = True, max(steps) if steps else None
        if got.phase and got.phase != d.phase:
            o.note = f"the signal landed in the job's {got.phase} phase (the agent reads drills once a second)"
        t_sig, t_end, killed = got.signalled, got.ended, got.killed
        # the signalled start's phase.json as its agent read it at its end, else as it is now
        last = got.job or self.job.phase()
        self._saw(last)
        # the signalled start's own records (the next start may have begun already: backoff 0)
        own = int(last.get("restarts", -1)) == self.restarts
        mine = [int(last.get("step") or 0)] if own else []
        if own and last.get("stopped") and d.signal == "term":
            step, checkpoint = last["stopped"][:2]
            o.stopped_at_checkpoint = checkpoint is not None and int(step) == int(checkpoint)
        mine += [int(a.get("step", 0)) for a in self.job.attempts() if a.get("start", 0) <= t_sig][-1:]
        reached_step = max(mine + [int(o.step or 0)])
        if d.signal == "term":
            o.ended_in_grace = not killed
        done = {s: at for s, at in self.saves.items() if at <= t_end}
        o.last_checkpoint = max(done) if done else None
        if done or not o.by_time:
            o.saved_in_grace = any(t_sig <= at <= t_end for at in done.values())
        o.times = {"signal": t_sig, "end": t_end}
        self._after(o, t_end, reached_step, early)
        judge(o, self.grace, interval(self.starts))
        self._event("drill.signalled", t_sig, o, grace=None if killed and d.signal == "kill" else self.grace)
        self._event("drill.result", time.time(), o)
        self.restarts += 1

    def _event(self, event: str, at: float, o: Outcome, **extra: Any) -> None:
        """The drill in the run's events (ui/runview.py says it as a sentence): recorded, never sent (a drill is no
        news for the run's notification URLs). A store that cannot take it loses the event, not the drill."""
        from ..core import notify
        fields = {"signal": o.signal, "phase": o.phase} if event == "drill.signalled" else \
            {k: v for k, v in o.to_json().items() if k not in ("hint", "note") and v is not None}
        try:
            notify.record(self.job.store, f"{event}-{self.job.run_id}-{self.restarts}",
                          {"event": event, "run": self.job.run_id, "time": at, "step": o.step,
                           "start": self.restarts, **fields, **extra})
        except Exception:  # noqa: BLE001 - see the docstring
            pass

    def _after(self, o: Outcome, t_end: float, reached: int, early: bool) -> None:
        """The next start: where it resumed, how long to its first step (or the run's end instead). `early`: only
        where it resumed (the next drill signals it before its first step)."""
        deadline = time.monotonic() + self.wait
        while time.monotonic() < deadline:
            if o.by_time and self.job.status().restarts > self.restarts:
                o.note = "drilled by time: restarted; no phases, so no checkpoint or step is seen"
                return
            doc = self.job.phase()
            ph = doc.get("phases") or {}
            # early: once the start says where it resumed from (its metrics.json may still be the last start's)
            if int(doc.get("restarts", -1)) > self.restarts and ("step" in ph or early and "from" in doc):
                self._data(o, doc)
                self._saw(doc)
                attempts = self.job.attempts()
                o.resumed_from = int(doc["from"]) if "from" in doc else \
                    int(attempts[-1]["from"]) if attempts else None
                o.redone = max(0, reached - o.resumed_from) if o.resumed_from is not None else None
                if "step" in ph:
                    o.to_first_step_s = round(ph["step"] - t_end, 2)
                    o.compile_s = round(ph["step"] - ph["compile"], 2) if "compile" in ph else None
                    o.goodput_cost_s = round(ph["step"] - o.times.get("signal", t_end) + (o.redone or 0)
                                             * _step_seconds(attempts), 2)
                return
            st = self.job.status()
            if st.state.final and st.state is runs.RunState.SUCCEEDED and o.phase == "eval" \
                    and o.ended_in_grace is not False:
                self.ended = True   # it finished within the grace (an evaluation after its last checkpoint)
                o.redone, o.note = 0, "the job finished within the grace: nothing to restart"
                return
            if st.state.final:
                self.ended = True
                o.why = f"the run ended {st.state.value} (exit {st.exit_code}) instead of restarting"
                o.hint = ("exit with runtime.STOPPED_CODE (143) after saving on SIGTERM, so tpuctl restarts the job"
                          if st.exit_code == 0 else "submit --max-restarts lets tpuctl restart it")
                return
            time.sleep(max(self.poll, 0.05))   # the restart takes seconds
        o.why = f"no restart within {self.wait:g} s (TPUCTL_DRILL_WAIT)"


    def _data(self, o: Outcome, doc: dict[str, Any]) -> None:
        """The resumed start's reader against where an uninterrupted run's was at its step: the position an earlier
        start reported at that step (its checkpoint's, or where it began)."""
        if not doc.get("data_from"):
            return
        step, position = doc["data_from"]
        if int(step) not in self.data:
            return
        want = self.data[int(step)]
        o.data = "same" if position == want else "different"
        if o.data == "different":
            o.note = (o.note + "; " if o.note else "") + \
                f"its reader began at {position!r} at step {step}, where an uninterrupted run's was at {want!r}"


def _in(doc: dict[str, Any], phase: str) -> bool:
    """The job is in `phase`; `step` only mid-run: a step done in this start, half a second into the phase."""
    if doc.get("phase") != phase:
        return False
    if phase != "step":
        return True
    since = (doc.get("phases") or {}).get("step")
    return since is not None and time.time() - float(since) >= 0.5


def _step_seconds(attempts: list[dict[str, float]]) -> float:
    per = [a["step_seconds"] / max(1.0, a["step"] - a["from"]) for a in attempts
           if a.get("step_seconds") and a.get("step", 0) > a.get("from", 0)]
    return statistics.median(per) if per else 0.0


def interval(starts: dict[int, tuple[int, set[int]]]) -> int | None:
    """The job's checkpoint interval in steps: the widest gap between the checkpoints one start wrote, counted from
    the step it resumed from (None: no start wrote one). Within a start only: a save on SIGTERM is off the job's
    cadence (step 13 of one every 10), and the next start's first regular one (20) is 7 after it, not 10."""
    gaps = [b - a for start, saves in starts.values() for a, b in zip(sorted({start, *saves}),
                                                                       sorted({start, *saves})[1:])]
    return max(gaps) if gaps else None


def judge(o: Outcome, grace: float, every: int | None) -> None:
    """passed, and why not with a hint, from what was measured."""
    if o.why:   # the run ended instead of restarting, or no restart came
        o.passed = False
        return
    fails: list[tuple[str, str]] = []
    if o.signal == "SIGTERM" and o.ended_in_grace is False:
        fails.append((f"still running {grace:g} s after SIGTERM, in its {o.phase} phase: SIGKILL",
                      "read runtime.stop_requested() in that phase too, save if needed, and exit (docs/jobs.md)"))
    if o.resumed_from is not None and o.last_checkpoint is not None and o.resumed_from != o.last_checkpoint:
        fails.append((f"resumed from step {o.resumed_from}, not its last checkpoint (step {o.last_checkpoint})",
                      "restore the latest checkpoint at start (docs/recovery.md)"))
    if o.data == "different":
        fails.append((f"the resumed run reads other data than an uninterrupted one would ({o.note.split('; ')[-1]})",
                      "skip the data the checkpoint's steps already read, and report where the reader is with "
                      "runtime.data_position (docs/jobs.md)"))
    redone = o.redone or 0
    if o.signal == "SIGTERM" and redone > 0 and not o.saved_in_grace:
        fails.append((f"no checkpoint written within the {grace:g} s grace: {redone} steps redone",
                      "save on SIGTERM, see docs/jobs.md (runtime.listen_for_stop)"))
    elif o.signal == "SIGKILL" and redone > 0 and (every is None or redone > every):
        what = f"more than one checkpoint interval ({every})" if every else "and no checkpoint interval seen"
        fails.append((f"{redone} steps redone, {what}", "checkpoint more often (docs/recovery.md)"))
    o.passed = not fails
    if fails:
        o.why = "; ".join(w for w, _ in fails)
        o.hint = fails[0][1]


Say = Callable[[str], None]


def wait_final(job: Job) -> runs.RunStatus:
    """The run's final status once the drills are over (it runs to its end: the goodput counts the whole run)."""
    deadline = time.monotonic() + knobs.number("TPUCTL_DRILL_WAIT", 1800)
    st = job.status()
    while not st.state.final and time.monotonic() < deadline:
        time.sleep(knobs.number("TPUCTL_DRILL_POLL", 0.02) * 10)
        st = job.status()
    return st
