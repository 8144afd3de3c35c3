"""Goodput of a run, as Google's ml-goodput-measurement defines it (github.com/AI-Hypercomputer/
ml-goodput-measurement: README "Badput Breakdown Details" and ml_goodput_measurement/src/goodput.py): goodput is the
share of the job's lifetime spent in productive training steps; badput is the rest.

From the attempts the job recorded (metrics.MetricsLog.attempts, written through tpuctl.runtime) and the run's
lifetime (its first claim to its end):
- productive: time inside training steps that were kept, less the two below;
- startup: after each start, the first step's extra time over the attempt's average step (compilation), as that
  library's `_compute_segment_final_metrics` moves `first_step_extra_time` to PROGRAM_STARTUP (an attempt of one
  step has none);
- checkpoint: time blocking checkpoint saves took (UNPRODUCTIVE_CHECKPOINT_SAVE_TIME, which that library subtracts
  from productive time); here the saves the job timed through tpuctl.runtime's `checkpointing()`, which are kept
  out of the steps' own time;
- wasted_progress: time inside steps re-done after a resume (the interrupted attempt's steps past the step the next
  attempt restored): "time that was spent on productive training but lost after restart";
- disruption: from an interrupted attempt's last step to the next attempt's start (the TPU lost, re-created, booted,
  the job restarted): what that library splits into accelerator initialisation, training preparation and program
  startup after a restart;
- stalled: from an attempt's last step to the next attempt's start (or the run's end) when the run doctor found
  the attempt stalled (host/doctor.py: its stall records' `since`): time a hung job held the TPU, which that library
  has no bucket for (its CUSTOM_BADPUT_EVENTS is the nearest), and not a disruption of the infrastructure's;
- other: the rest (the first start, data loading, evaluation, saves the job did not time).
"""
from __future__ import annotations

from typing import Any


def first_step_extra(a: dict[str, float]) -> float:
    """The first step's time past the average of the attempt's other steps; 0 for an attempt of one step."""
    calls, first = a.get("calls", 0.0), a.get("first_seconds", 0.0)
    if calls < 2:
        return 0.0
    return max(first - (a["step_seconds"] - first) / (calls - 1), 0.0)


STALL_SLACK = 5.0   # a stall's `since` is the agent's sight of the last step, a poll after the job's own stamp


def _stalled_after(a: dict[str, float], until: float, stalls: list[float]) -> bool:
    """Whether a stall began between the attempt's last step and `until`."""
    return any(a["last"] - STALL_SLACK <= since <= until for since in stalls)


def breakdown(attempts: list[dict[str, float]], started: float, ended: float,
              stalls: list[float] | None = None) -> dict[str, Any]:
    """`stalls`: when each of the run's stalls began (its last progress: runs.stalls' `since`)."""
    total = max(ended - started, 1e-9)
    productive = wasted = disruption = startup = checkpoint = stalled = 0.0
    stalls = stalls or []
    redone = 0
    for i, a in enumerate(attempts):
        steps = max(a["step"] - a["from"], 0.0)
        # an attempt that made no step kept nothing: its time is not productive (issue 40: `jobs` showed 39% for a
        # run at step 0 whose job had reported 7.9 s of "step" time before its first step ended)
        extra = first_step_extra(a) if steps else 0.0
        kept = a["step_seconds"] - extra if steps else 0.0
        per_step = kept / steps if steps else 0.0
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        lost_steps = max(a["step"] - nxt["from"], 0.0) if nxt else 0.0
        redone += int(lost_steps)
        wasted += per_step * min(lost_steps, steps)
        productive += kept - per_step * min(lost_steps, steps)
        startup += extra
        checkpoint += a.get("checkpoint_seconds", 0.0)
        if nxt and _stalled_after(a, nxt["start"], stalls):
            stalled += max(nxt["start"] - a["last"], 0.0)
        elif nxt:
            disruption += max(nxt["start"] - a["last"], 0.0)
        elif _stalled_after(a, ended, stalls):   # the run ended stalled, or is stalled now
            stalled += max(ended - max(a["last"], min(stalls)), 0.0)
    # steps timed by the job and a wall clock read by the host disagree by a clock's grain: a run of a fraction of a
    # second read 422% (issue 63.7); the kept steps' time is at most the run's
    productive = min(productive, total)
    other = max(total - productive - wasted - disruption - startup - checkpoint - stalled, 0.0)
    return {"goodput_pct": round(100 * productive / total, 1), "wall_seconds": round(total, 1),
            "productive_seconds": round(productive, 1), "startup_seconds": round(startup, 1),
            "checkpoint_seconds": round(checkpoint, 1), "wasted_progress_seconds": round(wasted, 1),
            "disruption_seconds": round(disruption, 1), "stalled_seconds": round(stalled, 1),
            "other_seconds": round(other, 1),
            "steps_redone": redone, "resumes": max(len(attempts) - 1, 0)}


def interval(attempts: list[dict[str, float]], started: float, t0: float, t1: float,
             lag: float = 0.0) -> float | None:
    """Goodput over the window [t0, t1] alone (as ml-goodput-measurement's `get_job_goodput_interval`): the
    productive time inside the window over the window's length, the window cut to start no earlier than the run
    (`started`). The attempts hold totals, not each step's time, so an attempt's productive time (as breakdown
    counts it: kept steps less startup and re-done steps) is taken as spread evenly over its span, from its start to
    its last report; the last attempt's span runs on to `t1` at the same rate for at most `lag` seconds (a job
    writes its file at least every TPUCTL_PROGRESS_SECONDS: a window ending now would otherwise miss the steps
    since its last write, and a stalled job still falls to 0 once `lag` has passed). None for an empty window."""
    t0 = max(t0, started)
    if t1 <= t0:
        return None
    productive = 0.0
    for i, a in enumerate(attempts):
        steps = max(a["step"] - a["from"], 0.0)
        if not steps:
            continue
        kept = a["step_seconds"] - first_step_extra(a)
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        lost = min(max(a["step"] - nxt["from"], 0.0), steps) if nxt else 0.0
        made = kept - kept / steps * lost
        start, last = a["start"], max(a["last"], a["start"])
        span = last - start
        if span <= 0:
            productive += made if t0 <= last <= t1 else 0.0
            continue
        rate = made / span
        end = min(t1, last + lag) if nxt is None else last
        productive += rate * max(min(end, t1) - max(start, t0), 0.0)
    return min(max(productive / (t1 - t0), 0.0), 1.0)
