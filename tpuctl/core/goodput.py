"""Goodput of a run, as Google's ml-goodput-measurement defines it (github.com/AI-Hypercomputer/
ml-goodput-measurement, README "Badput Breakdown Details"): goodput is the share of the job's lifetime spent in
productive training steps; badput is the rest, among it "Wasted Progress due to Disruption": "time that was spent on
productive training but lost after restart", i.e. steps re-done from the last checkpoint.

From the attempts the job recorded (metrics.MetricsLog.attempts, written through tpuctl.runtime) and the run's
lifetime (its first claim to its end):
- productive: time inside training steps that were not re-done;
- wasted_progress: time inside steps re-done after a resume (the interrupted attempt's steps past the step the next
  attempt restored);
- disruption: from an interrupted attempt's last step to the next attempt's start (the TPU lost, re-created, booted,
  the job restarted): what that library splits into accelerator initialisation, training preparation and program
  startup after a restart;
- other: the rest (the first start, data loading, checkpoint saves, evaluation).
"""
from __future__ import annotations

from typing import Any


def breakdown(attempts: list[dict[str, float]], started: float, ended: float) -> dict[str, Any]:
    total = max(ended - started, 1e-9)
    productive = wasted = disruption = 0.0
    redone = 0
    for i, a in enumerate(attempts):
        steps = max(a["step"] - a["from"], 0.0)
        per_step = a["step_seconds"] / steps if steps else 0.0
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        lost_steps = max(a["step"] - nxt["from"], 0.0) if nxt else 0.0
        redone += int(lost_steps)
        wasted += per_step * min(lost_steps, steps)
        productive += a["step_seconds"] - per_step * min(lost_steps, steps)
        if nxt:
            disruption += max(nxt["start"] - a["last"], 0.0)
    other = max(total - productive - wasted - disruption, 0.0)
    return {"goodput_pct": round(100 * productive / total, 1), "wall_seconds": round(total, 1),
            "productive_seconds": round(productive, 1), "wasted_progress_seconds": round(wasted, 1),
            "disruption_seconds": round(disruption, 1), "other_seconds": round(other, 1),
            "steps_redone": redone, "resumes": max(len(attempts) - 1, 0)}
