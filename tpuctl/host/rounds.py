"""One run across many hosts starts, stops and restarts as one: rounds.

A JAX or PyTorch/XLA run on a multi-host slice or a Multislice cluster is one program: every host's process must be
there, and a host that goes away leaves the others stuck in their collectives. Google says as much of a multi-host
slice: "all instances in the slice [must] be recovered or rescheduled together", and until then "the XLA compiler
can't run the workload" (cloud.google.com/tpu/docs/failure-recovery, "Multi-host slice recovery requirements");
xpk's JobSet restarts every pod of a workload when one fails (AI-Hypercomputer/xpk, workload.py `maxRestarts`).

So such a run goes in rounds, kept in the store (layout.run_round): round 1 is the first start. A host asks for
round n+1, once, by create-if-absent (the first caller wins, the others read its reason):
- its job exited with a restartable code (host/restarts.py): the round counts against `submit --max-restarts`;
- the host it watches went quiet or was stopped (a dead agent, a preempted or repaired slice, maintenance): not
  counted. Each host watches the next one (worker i watches i+1, the last watches 0), so the run's hosts together
  read one status per heartbeat however many there are;
- it took the run over (a restarted agent, a replaced host) after it had already marked the current round ready,
  so that round may be running without it: not counted;
- its job failed past its restarts: the round ends the run (`end`), and every host stops its job;
- its job exited non-zero (1: an exception, 134: an abort, a signal) while another host was lost: a JAX process
  whose peer died ends within seconds, long before that peer's heartbeats go stale, so before such an exit is the
  job's, every other host must show itself alive after it (`lost_since`): one that does not is the cause, and the
  round is not counted.
Every host that sees a new round stops its job (SIGTERM, TPUCTL_STOP_GRACE to checkpoint) and marks itself ready
for it (layout.run_round_ready); the round starts on a host once every worker's mark is there, that is once the
cluster is whole again (Google repaired the slice, `up` or the recovery watcher made it anew). Single-host runs and
TensorFlow runs (one program on worker 0) have no rounds.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

from ..core import knobs, layout, runs
from ..core.runs import RunSpec, RunState, RunStatus
from . import kerasbackend
from .contexts import Seat

WAIT_POLL_SECONDS = 1.0
FINISHED = "every host had finished the run already"   # assemble's why-not for a round every host finished
# A peer whose heartbeats stopped for this long is lost (TPUCTL_PEER_LOST_SECONDS, never more than
# TPUCTL_STALE_SECONDS). JAX's coordination service declares a silent task dead after its heartbeat timeout, 100 s by
# default (jax/_src/distributed.py, `heartbeat_timeout_seconds`), and ends the survivors: a host must be found lost,
# and the round asked for, before they give up. Heartbeats come every 5 s (runs.heartbeat_seconds), so 30 s is six
# missed in a row.
PEER_LOST_SECONDS = 30.0
Beat = Callable[[str], None]   # a status heartbeat with the note given
Called = tuple[str, dict[str, Any]]   # a later round asked for: (why, its record)


class Rounds:
    def __init__(self, seat: Seat, stop: threading.Event, run_id: str) -> None:
        """`stop`: the agent's, which every wait here ends at."""
        self.seat, self.stop, self.run_id = seat, stop, run_id
        self.workers = seat.workers
        self.peer = (seat.worker + 1) % self.workers
        self.last_peer_check = time.monotonic()
        self.last_beat = 0.0

    @staticmethod
    def of(seat: Seat, stop: threading.Event, run_id: str, job: RunSpec) -> Rounds | None:
        """The run's rounds when it runs on more than one host, else None."""
        one_program = kerasbackend.framework(job, seat.record, seat.accelerator) == "tensorflow"
        return Rounds(seat, stop, run_id) if not one_program and seat.workers > 1 else None

    def label(self, worker: int) -> str:
        """`sK/wW` on a Multislice cluster, `wW` on one slice (as `logs --all-hosts` prefixes them)."""
        hosts = int(self.seat.record.get("hosts") or 1)
        return f"s{worker // hosts}/w{worker % hosts}" if int(self.seat.record.get("slices") or 1) > 1 else f"w{worker}"

    def called(self, n: int) -> dict[str, Any] | None:
        return runs.read_json(self.seat.store, layout.run_round(self.run_id, n))

    def keys(self) -> set[str]:
        """The run's round records and marks, in one listing."""
        return {k for k, _ in self.seat.store.list(layout.run_rounds(self.run_id))}

    def current(self) -> int:
        """The newest round asked for (1: none after the first start)."""
        keys = self.keys()
        n = 1
        while layout.run_round(self.run_id, n + 1) in keys:
            n += 1
        return n

    def call(self, n: int, why: str, counts: bool = False, end: str = "", exit_code: int | None = None,
             stalled: bool = False) -> dict[str, Any]:
        """Asks for round n (once: the first caller's reason stands). The round's record, ours or the winner's.
        `stalled`: the run stalled (doctor.py): every host dumps its job's stacks before it stops it."""
        doc = {"round": n, "worker": self.seat.worker, "host": self.seat.host, "why": why, "counts": counts, "end": end,
               "exit_code": exit_code, "time": time.time(), **({"stalled": True} if stalled else {})}
        if self.seat.store.create(layout.run_round(self.run_id, n), json.dumps(doc).encode()):
            return doc
        return self.called(n) or doc

    def join(self) -> int:
        """The round a new attempt on this host starts in: the current one, unless this host had already marked it
        ready (a restarted agent, a replaced host), so it may be running without this host: then the next (unless
        every host had finished it: `assemble` says so)."""
        n = self.current()
        if not self.missing(n, True, self.keys()):
            return n
        if self.seat.store.read(layout.run_round_ready(self.run_id, n, self.seat.worker)) is None:
            return n
        return int(self.call(n + 1, f"{self.label(self.seat.worker)} took the run over "
                                    f"(attempt on {self.seat.host})")["round"])

    def for_stall(self, n: int, why: str, action: str) -> tuple[str, dict[str, Any]]:
        """The run stalled, seen on this host (doctor.py): round n+1 asked for, `stalled`, so that every host takes
        its job's stacks before it stops it; counted against --max-restarts (`action` restart), or the run's end
        (stop). (why, the round's record), as `watch` gives them."""
        said = f"the run stalled, seen on {self.label(self.seat.worker)} ({why})"
        doc = self.call(n + 1, said, counts=True, stalled=True) if action == "restart" else \
            self.call(n + 1, said, end="stalled", stalled=True)
        return (self.ended(doc) if doc.get("end") else str(doc.get("why", ""))), doc

    def restarts(self, n: int) -> int:
        """Rounds up to n that `submit --max-restarts` counts."""
        return sum(1 for k in range(2, n + 1) if (self.called(k) or {}).get("counts"))

    def missing(self, n: int, done: bool, keys: set[str]) -> list[int]:
        return [w for w in range(self.workers) if layout.run_round_ready(self.run_id, n, w, done) not in keys]

    def mark(self, n: int, done: bool = False) -> None:
        self.seat.store.write(layout.run_round_ready(self.run_id, n, self.seat.worker, done), b"")

    def assemble(self, n: int, beat: Beat, halted: Callable[[], bool]) -> tuple[int, str]:
        """Marks this host ready for round n and waits for every other; a later round asked for meanwhile is
        joined instead. (round, why not): why not is "" once every host is ready, else why the run cannot start
        (the round ends the run, a host already ended its part), "halted" (a cancel, the agent's stop) or FINISHED:
        every host had finished round n, so the run succeeded and only this host's final status was lost (its host
        went down between its done mark and its status)."""
        if not self.missing(n, True, self.keys()):
            return n, FINISHED
        self.mark(n)
        while True:
            keys = self.keys()   # one listing a poll: the next round's record and every host's mark
            later = self.called(n + 1) if layout.run_round(self.run_id, n + 1) in keys else None
            if later is not None and later.get("end"):
                return n + 1, self.ended(later)
            if later is not None:
                n += 1
                self.mark(n)
                continue
            why = self._wait(n, False, keys, beat, halted)
            if why is not None:
                return n, why

    def finish(self, n: int, beat: Beat, halted: Callable[[], bool]) -> tuple[tuple[str, dict[str, Any]] | None, str]:
        """This host's job ended well in round n: the run succeeds once every host's has, and restarts whole if a
        host is lost first (its program ends with all of them). (a later round asked for and why, why not): both
        empty once every host is done; why not as `assemble` says it."""
        self.mark(n, done=True)
        while True:
            keys = self.keys()
            later = self.watch(n, keys)
            if later is not None:
                return later, ""
            why = self._wait(n, True, keys, beat, halted)
            if why is not None:
                return None, why

    def _wait(self, n: int, done: bool, keys: set[str], beat: Beat, halted: Callable[[], bool]) -> str | None:
        """One look at round n's marks in `keys`: "" once every host's is there, a reason when it never can be, else
        None (after a poll's wait and, when due, a heartbeat that says which hosts are awaited)."""
        missing = self.missing(n, done, keys)
        if not missing:
            return ""
        ended = [w for w in missing if runs.status(self.seat.store, self.run_id, w).state.final]
        if ended:   # a host marks its round before it writes its final status: a mark after `keys` was listed counts
            ended = [w for w in ended if w in self.missing(n, done, self.keys())]
        if ended:
            return f"{', '.join(map(self.label, ended))} had already ended its part of the run, which runs on every host"
        if halted():
            return "halted"
        if time.monotonic() - self.last_beat >= runs.heartbeat_seconds():
            self.last_beat = time.monotonic()
            what = "finish" if done else "be ready"
            beat(f"round {n}: waiting for {', '.join(map(self.label, missing))} to {what} "
                 f"({self.workers - len(missing)} of {self.workers} hosts are)")
        self.stop.wait(WAIT_POLL_SECONDS)
        return None

    def ended(self, doc: dict[str, Any]) -> str:
        return f"the run failed on {self.label(int(doc.get('worker', 0)))}: {doc.get('why', '')}"

    def watch(self, n: int, keys: set[str] | None = None) -> tuple[str, dict[str, Any]] | None:
        """While round n runs here: (why, the round's record) once round n+1 is asked for, by another host or by
        this one because the host it watches is lost; else None. Called about once a second, with the run's
        `keys` when the caller has just listed them (else round n+1 is read)."""
        asked = keys is None or layout.run_round(self.run_id, n + 1) in keys
        later = self.called(n + 1) if asked else None
        if later is None and time.monotonic() - self.last_peer_check >= runs.heartbeat_seconds():
            self.last_peer_check = time.monotonic()
            lost = self.lost_peer()
            if lost:
                later = self.call(n + 1, lost)
        if later is None:
            return None
        return (self.ended(later) if later.get("end") else str(later.get("why", ""))), later

    def lost_peer(self, worker: int | None = None, st: RunStatus | None = None) -> str:
        """Why the host this one watches (or `worker`, whose status is `st`) is lost ("" while it is not): its agent
        stopped, or its status went quiet for lost_seconds(). A peer that has not started yet, or has ended its
        part, is not lost."""
        worker = self.peer if worker is None else worker
        st = st or runs.status(self.seat.store, self.run_id, worker)
        who = self.label(worker)
        if st.state in (RunState.INTERRUPTED, RunState.LOST):
            return f"{who}'s agent was stopped on {st.host or 'its host'}"
        if st.state.final or not st.heartbeat:
            return ""
        quiet = time.time() - st.heartbeat
        if quiet >= lost_seconds():
            return f"{who} went quiet on {st.host or 'its host'} ({quiet:.0f}s without a heartbeat)"
        return ""

    def lost_since(self, n: int, rc: int, cancelled: bool, beat: Beat, halted: Callable[[], bool]) -> Called | None:
        """This host's job exited `rc` just now, in round n: (why, round n+1's record) when a lost host is the cause
        (another host asked for round n+1, or one is quiet or stopped: then this host asks for it, not counted),
        None once every other host has shown itself alive since (a heartbeat, or its part ended): the exit is the
        job's own. Waits at most until a quiet host would count as lost. None at once for an exit of 0 or one
        tpuctl caused (a cancel)."""
        if cancelled or rc == 0:
            return None
        since = time.time()
        deadline = time.monotonic() + lost_seconds() + 2 * runs.heartbeat_seconds()
        others = [w for w in range(self.workers) if w != self.seat.worker]
        self.last_beat = 0.0
        while True:
            keys = self.keys()
            if layout.run_round(self.run_id, n + 1) in keys:
                return self.watch(n, keys)
            lost, alive = "", 0
            for w in others:
                st = runs.status(self.seat.store, self.run_id, w)
                lost = self.lost_peer(w, st)
                if lost:
                    break
                alive += st.state.final or (st.heartbeat or 0) > since or \
                    layout.run_round_ready(self.run_id, n, w, True) in keys
            if lost:
                doc = self.call(n + 1, f"{lost}, and {self.label(self.seat.worker)}'s job exited {rc} after it")
                return (self.ended(doc) if doc.get("end") else str(doc.get("why", ""))), doc
            if alive == len(others) or halted() or time.monotonic() >= deadline:
                return None
            if time.monotonic() - self.last_beat >= runs.heartbeat_seconds():
                self.last_beat = time.monotonic()
                beat(f"round {n}: the job exited {rc}; checking that every host is still there "
                     f"({alive + 1} of {self.workers} are)")
            self.stop.wait(min(WAIT_POLL_SECONDS, runs.heartbeat_seconds()))


def lost_seconds() -> float:
    """How long a peer may be quiet before it is lost (PEER_LOST_SECONDS)."""
    return min(runs.stale_seconds(), knobs.number("TPUCTL_PEER_LOST_SECONDS", PEER_LOST_SECONDS))
