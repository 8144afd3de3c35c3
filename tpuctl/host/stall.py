"""When a running job has stopped moving: the stall rule, pure (the clock and what was seen are given), so it can be
read and tested alone; doctor.py feeds it and acts on its verdict.

Progress is the step the job reports through tpuctl.runtime (metrics.json's latest attempt: its step and its count of
reports), and, before the job has reported a step in this attempt, any new output in its log or a new metrics.json
(a job that reports no steps, or one still installing, loading or compiling). A job is stalled once progress has not
advanced for its window:
- with steps: `submit --stall-after` when given, else the larger of 15 minutes (TPUCTL_STALL_SECONDS) and 10x the
  attempt's median step time (a job whose steps take 3 minutes each is not stalled after 15): a slow but steady job
  never is;
- before its first step: never before the start-up window, 3x that window from the attempt's start (45 minutes by
  default), then the window after its last output. The start-up covers what precedes a first step on a TPU: the
  job's requirements installed, libtpu and the slice initialised, data opened, and the first XLA compile, which
  for a large model takes tens of minutes and prints nothing while the TPU is busy; a compile is not a stall.
Only the job's own clock stamps are used for the step time; the deadline is on this host's clock.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ..core import knobs
from ..core.metrics import MetricsLog

DEFAULT_WINDOW = 900.0   # 15 minutes
STEP_FACTOR = 10.0       # a window is at least 10 median steps
STARTUP_FACTOR = 3.0     # the start-up window: 3 windows (45 minutes by default)
MIN_STALL_AFTER = 10.0   # `submit --stall-after` takes 10 s and up (tests use seconds)
RATES_KEPT = 200         # step times kept for the median
START_SLACK = 1.0        # an attempt begun up to 1 s before the agent's clock said the job started is the job's


def base_window(stall_after: float = 0.0) -> float:
    """The window with no step time known: `submit --stall-after`, else TPUCTL_STALL_SECONDS (15 minutes)."""
    return stall_after or knobs.number("TPUCTL_STALL_SECONDS", DEFAULT_WINDOW)


# attempts recorded, step, reports, the job's time of its last step, its attempt's start, its first step's own time
Progress = tuple[int, float, float, float, float, float]


def latest_attempt(log: MetricsLog | None) -> Progress | None:
    """What metrics.json says of the latest attempt (Progress), None without one. `log` is metrics.load's: the
    job's file read as every other reader of it does, capped and with its non-finite numbers dropped."""
    if log is None or not log.attempts:
        return None
    a = log.attempts[-1]
    return (len(log.attempts), a["step"], a.get("calls", 0.0), a["last"], a["start"], a.get("first_seconds", 0.0))


@dataclass
class StallWatch:
    started: float                     # this host's clock when the job started
    stall_after: float = 0.0           # `submit --stall-after`, 0: the default rule
    baseline: Progress | None = None   # metrics.json as the job found it (a restart's)
    seen: Progress | None = None
    stepped: bool = False              # the job reported a step in this attempt
    last_progress: float = 0.0
    output: int = -1                   # bytes of output seen
    rates: list[float] = field(default_factory=list)   # seconds per step, the job's own clock
    first_look: bool = True

    def __post_init__(self) -> None:
        self.last_progress = self.started

    def window(self) -> float:
        if self.stall_after:
            return self.stall_after
        med = self.median_step()
        return max(base_window(), STEP_FACTOR * med) if med is not None else base_window()

    def startup(self) -> float:
        return STARTUP_FACTOR * base_window(self.stall_after)

    def median_step(self) -> float | None:
        """The median step time seen between reports (the job's clock); before two reports, the first step's own
        time as the job reported it (with its compile: a longer window, never a shorter one)."""
        if self.rates:
            return statistics.median(self.rates)
        return self.seen[5] if self.stepped and self.seen is not None and self.seen[5] > 0 else None

    def observe(self, now: float, progress: Progress | None, output: int) -> None:
        """What was seen at `now`: metrics.json's latest_attempt, and the bytes of output the job has written."""
        if self.first_look:   # what the job found there: an earlier attempt's steps are not this one's
            self.first_look, self.baseline, self.seen = False, progress, None
            if progress is not None and progress[4] < self.started - START_SLACK:
                self.seen = progress
        if progress != self.seen and progress is not None:
            prev = self.seen
            # this attempt's: changed since the job started, or begun after it (its steps came before the first look)
            ours = progress[2] > 0 and (progress != self.baseline or progress[4] >= self.started - START_SLACK)
            if ours and prev is not None and prev[0] == progress[0] and prev[2] > 0 and progress[1] > prev[1]:
                self.rates.append(max(progress[3] - prev[3], 0.0) / (progress[1] - prev[1]))
                del self.rates[:-RATES_KEPT]
            if ours and (not self.stepped or prev is None or progress[1] != prev[1] or progress[0] != prev[0]):
                self.last_progress = now   # a step (or a new attempt's first)
            elif not self.stepped:
                self.last_progress = now   # a new metrics.json before the first step: the job is alive
            self.stepped = self.stepped or ours
            self.seen = progress
        if output != self.output:
            if self.output >= 0 and not self.stepped:
                self.last_progress = now   # output counts only before the first step
            self.output = output

    def deadline(self) -> float:
        """When the run is stalled if nothing moves before it."""
        if self.stepped:
            return self.last_progress + self.window()
        return max(self.started + self.startup(), self.last_progress + self.window())

    def stalled(self, now: float) -> bool:
        return now >= self.deadline()

    def said(self) -> str:
        """What the verdict rests on, for the run's log and event."""
        if self.stepped and self.seen is not None:
            med = self.median_step()
            return (f"no step past {self.seen[1]:.0f} for {self.window():.0f}s (the stall window"
                    + (f"; median step {med:.3g}s" if med is not None else "") + ")")
        return (f"no step reported and no output for {self.window():.0f}s after the start-up window "
                f"({self.startup():.0f}s)")
