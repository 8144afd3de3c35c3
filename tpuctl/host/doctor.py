"""The run doctor on this host, while a job runs (supervisor.py calls it): is the run stalled (stall.py's rule over
metrics.json and the job's output), and once it is, what is left for the user and what is done:
- this host's job's stacks to the store (stacks-wN.txt, stacks.py), every other host's too: each host dumps its
  own when it sees the stall, or when another host calls a round for it (rounds.py, `stalled` in its record);
- a stall record (layout.run_stalls: goodput counts its time as badput `stalled`), a line in the run's log, and
  the event run.stalled (notified, and listed on the run's page);
- the action `submit --on-stall` asks: notify (the run goes on, shown stalled until it moves again), restart
  (a new attempt, bounded by --max-restarts), stop (the run ends `stalled`); restart past its bound stops.
The TPU duty cycle each host sampled (chipsampler.py) is said beside the verdict: near 0 on every host means the
chips wait too; a busy chip with a stuck step is rarer (a collective spinning)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..core import knobs, layout, metrics, notify, runs, utilisation
from ..core.runs import RunSpec
from . import failures, stacks
from .alone import Outputs, host_of, twice_in_a_row
from .contexts import Seat
from .stall import StallWatch, latest_attempt

ON_STALL = ("notify", "restart", "stop")


@dataclass(frozen=True)
class Stall:
    why: str          # what the verdict rests on, and the chips' duty cycle
    since: float      # the run's last progress (time.time())
    action: str       # notify, restart or stop: what this host does now


class Doctor:
    def __init__(self, seat: Seat, run_id: str, job: RunSpec, attempt: int, stacks_dir: Path) -> None:
        """`stacks_dir`: the job's TPUCTL_STACKS_DIR (runtime/stacks.py writes each process's stacks there)."""
        self.store, self.run_id, self.job, self.worker, self.workers = seat.store, run_id, job, seat.worker, \
            seat.workers
        self.host, self.cluster, self.attempt, self.stacks_dir = seat.host, str(seat.record.get("cluster", "")), \
            attempt, stacks_dir
        self.watch: StallWatch | None = None
        self.next_look = 0.0
        self.stalled: Stall | None = None   # the stall this job is in (notify: until it moves again)
        self.dumped = False
        self.seen = 0   # stalls seen since the run's last restart (a notified run may stall again)
        self.outputs = Outputs(self.store, run_id, self.workers)   # each host's output: who stalled alone (alone.py)

    def begin(self) -> None:
        """The job (re)started: a new watch, the earlier stall forgotten."""
        self.watch = StallWatch(time.time(), self.job.stall_after)
        self.next_look, self.stalled, self.dumped, self.seen = 0.0, None, False, 0
        self.outputs.samples.clear()

    def fresh_stacks_dir(self) -> str:
        """TPUCTL_STACKS_DIR for a start of the job, emptied of an earlier start's files."""
        self.stacks_dir.mkdir(parents=True, exist_ok=True)
        for old in self.stacks_dir.glob("*.txt"):
            old.unlink(missing_ok=True)
        return str(self.stacks_dir)

    def poll(self) -> float:
        """How often progress is looked at: TPUCTL_STALL_POLL, else every heartbeat (5 s) or a quarter window."""
        w = self.watch.window() if self.watch else 60.0
        return knobs.number("TPUCTL_STALL_POLL", min(runs.heartbeat_seconds(), w / 4))

    def check(self, pids: Callable[[], list[int]], output: int, restarts: int) -> Stall | None:
        """A new stall seen now (after its stacks, record and event), else None; `restarts`: spent so far; `pids`:
        the job's processes, asked for only when a stall is seen (the supervisor's scan of /proc costs CPU, and
        this is called every pass of its loop)."""
        watch, now = self.watch, time.time()
        if watch is None or now < self.next_look or self.job.stall_after < 0:   # --stall-after off
            return None
        self.next_look = now + self.poll()
        try:
            log, _ = metrics.load(self.store, layout.run_metrics(self.run_id))   # an unreadable file: no progress
        except Exception:  # noqa: BLE001 - a store hiccup: the next look reads it
            return None
        watch.observe(now, latest_attempt(log), output)
        every = max(self.poll(), watch.window() / 4)
        self.outputs.sample(now, every, watch.startup() + watch.window())
        if self.stalled is not None:
            if not watch.stalled(now):
                self.stalled = None   # it moved again (notify): shown running
            return None
        if not watch.stalled(now):
            return None
        action = self.job.on_stall if self.job.on_stall in ON_STALL else "restart"
        if action == "restart" and restarts >= self.job.max_restarts:
            action = "stop"
        since = watch.last_progress
        self.stalled = Stall(f"{watch.said()}; {self.duty()}", since, action)
        self.dump(pids(), self.stalled.why)
        self.record(self.stalled, restarts, self.outputs.alone(since, every))
        return self.stalled

    def dump(self, pids: list[int], why: str) -> None:
        """This host's job's processes and stacks to stacks-wN.txt (once a stall)."""
        if self.dumped:
            return
        self.dumped = True
        head = (f"run {self.run_id}, worker {self.worker} on {self.host}, attempt {self.attempt}, at "
                f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}\nstalled: {why}\n\n")
        try:
            self.store.write(layout.run_stacks(self.run_id, self.worker),
                             (head + stacks.dump(pids, self.stacks_dir)).encode())
        except Exception:  # noqa: BLE001 - the stall is still recorded and acted on
            pass

    def record(self, s: Stall, restarts: int, alone: int | None = None) -> None:
        """`alone`: the worker whose output alone stood still through the stall (alone.py), named in the record;
        the same host twice in a row is marked sick, for the recovery watcher to replace."""
        at = time.time()
        doc = {"since": s.since, "at": at, "worker": self.worker, "host": self.host,
               "attempt": self.attempt, "restarts": restarts, "stall": self.seen + 1, "action": s.action, "why": s.why}
        if alone is not None:
            doc.update(alone_worker=alone, alone_host=host_of(self.store, alone) or f"worker {alone}")
        try:
            self.store.write(f"{layout.run_stalls(self.run_id)}w{self.worker}-{int(at * 1000)}.json",
                             json.dumps(doc).encode())
            sick = twice_in_a_row(runs.stalls(self.store, self.run_id)) if alone is not None else None
            if sick:
                failures.mark_sick(self.store, str(sick["alone_host"]), int(sick["alone_worker"]),
                                   f"the run stalled twice in a row held back by this host alone (its job wrote "
                                   f"nothing while the other hosts' did): {s.why}")
        except Exception:  # noqa: BLE001 - the event still goes
            pass
        self.seen += 1   # the key is the same on every host that sees this stall: it is sent once
        notify.emit(self.store, "run.stalled", f"run.stalled-{self.run_id}-r{restarts}-s{self.seen}", self.cluster,
                    self.run_id, host=self.host, worker=self.worker,
                    since=round(s.since, 1), action=s.action, why=s.why,
                    stacks=layout.run_stacks(self.run_id, self.worker))

    def duty(self) -> str:
        """Each host's TPU duty cycle as sampled, for the verdict."""
        said = []
        for w in range(self.workers):
            try:
                d = utilisation.recent_duty(utilisation.parse(self.store.read(layout.run_chips(self.run_id, w))))
            except Exception:  # noqa: BLE001 - not sampled
                d = None
            if d is not None:
                said.append(f"w{w} {d:.0f}%")
        return f"TPU duty cycle {', '.join(said)}" if said else "TPU duty cycle not sampled"

