"""The phases a job reports, for `tpuctl drill` (control/drill.py) to signal it at chosen moments and for the run
doctor to read: start (before the first step), compile (the first step), step (between steps), save (a checkpoint
being written), eval. metrics_callback and Progress report them by themselves; a loop of one's own calls
`phase("compile")` / `phase("eval")` where it has one, and `with progress.checkpointing():` reports `save`.

And the other half of surviving a preemption: `stop_requested()` is True once the job got SIGTERM (a spot VM's
notice, `tpuctl cancel`, a drill). Python runs a signal handler only between bytecodes of the main thread, so a
job that reads the flag only between steps misses it during a long compile, a save or an evaluation (spd#741: the
SIGTERM save "fired 0/6 times"); a job reads it after each save too, and exits with STOPPED_CODE (143, what a
process SIGTERM kills exits with) once its state is saved, so tpuctl restarts it from there.

The phase goes to OUTPUT/phase.json (process 0 only, rewritten at each change of phase, never per step):
{"phase", "step", "from", "since", "restarts", "pid", "saves": [[step, finished time], ...], "phases": {name: first time in
this start}, and where the job reports its data position (data_position): "data_from": [step, position] (where this
start's reader began), "data_at": [[step, position], ...] (the reader's position at each checkpoint)}."""
from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, Callable

from ..core.metrics import PHASE_FILE, PHASES
from .environment import output_dir
from .files import records_metrics, write_text

STOPPED_CODE = 128 + signal.SIGTERM
_KEPT_SAVES = 20

_state: dict[str, Any] = {}
_armed: list[bool] = []
_stopped: list[float] = []
_exit_when: list[Callable[[], bool]] = []


_where: list[str] = []   # the directory of the job's metrics.json, where it named one (_at(), from metrics_file.py)


def _at(directory: str) -> None:
    """phase.json goes beside the job's metrics.json (metrics_callback's and Progress's `path`)."""
    _where[:] = [directory]


def _path() -> str:
    return f"{(_where or [output_dir()])[0]}/{PHASE_FILE}"


def phase(name: str, step: int | None = None) -> None:
    """The job is now in phase `name` (one of PHASES) at `step` (the last one known when None)."""
    if name not in PHASES:
        raise ValueError(f"phase {name!r} is not one of {', '.join(PHASES)}")
    said = os.environ.get("TPUCTL_RESTARTS") or "0"   # set by tpuctl's agent for each start
    restarts = int(said) if said.isdigit() else 0
    if _state.get("pid") != os.getpid() or _state.get("restarts") != restarts:
        _state.clear()
        _state.update(restarts=restarts, pid=os.getpid(), saves=[], phases={}, step=0)
    moved = False
    if step is not None:
        if name == "start" and _state.get("from") != int(step):
            _state["from"] = int(step)   # the step this start resumed from
            moved = True
        _state["step"] = int(step)   # after "from" and before the phase: _at_checkpoint() reads them in a handler
    if _state.get("phase") == name and not moved:
        return
    now = time.time()
    _state.update(phase=name, since=now)
    _state["phases"].setdefault(name, now)
    _write()


def data_position(step: int, position: int | str) -> None:
    """The job's data reader is at `position` once `step` is done (the rows, records or batches it has read: any
    number or string that an uninterrupted run would also reach at that step), for a drill to check that a resumed
    run reads what an uninterrupted one would. Call it when the start knows where its reader begins (its resumed
    step) and after each step (kept in memory: written with each checkpoint, never per step)."""
    if _state.get("pid") != os.getpid():
        phase("start")
    _state["data"] = [int(step), position]
    if "data_from" not in _state:
        _state["data_from"] = [int(step), position]   # where this start's reader began: written at once
        _write()


def saved(step: int) -> None:
    """A checkpoint of `step` is complete (the save phase ends): the drill's proof of a save within the grace."""
    _state.setdefault("saves", []).append([int(step), time.time()])
    del _state["saves"][:-_KEPT_SAVES]
    data = _state.get("data")
    if data and data[0] == int(step):   # the reader's position the checkpoint goes with
        _state.setdefault("data_at", []).append(data)
        del _state["data_at"][:-_KEPT_SAVES]
    _state["step"] = int(step)
    _state["phase"] = ""   # the next phase() writes again, whichever it is
    _write()               # now: a job that exits right after its save (on SIGTERM) writes no phase again


def _write() -> None:
    # under tpuctl only (a drill reads it): a job run by hand gets no file it did not ask for
    if records_metrics() and os.environ.get("TPUCTL_RUN_ID"):
        try:
            write_text(_path(), json.dumps(_state))
        except OSError:
            pass   # a phase is a hint for a drill: never the job's failure


def stop_requested() -> bool:
    """True once SIGTERM came (after listen_for_stop())."""
    return bool(_stopped)


def listen_for_stop(exit_when: Callable[[], bool] | None = None) -> None:
    """SIGTERM sets stop_requested() instead of ending the process at once (main thread only; a handler the job
    installed itself is left as it is). Only for a job that reads the flag and saves: one that does not would then
    run on until tpuctl's SIGKILL after the grace. `exit_when`: asked when SIGTERM comes; True (nothing unsaved, no
    save under way) ends the job there and then with STOPPED_CODE, in the middle of a compile or an evaluation,
    if what this module was told agrees (_at_checkpoint()): the job's own count may lag the step its callbacks
    already reported, and an exit then would lose that step with no save (the drill saw it: issue 61). Where they
    disagree the flag stays set, and the job's next read of it saves. An exit at once is written to phase.json as
    "stopped": [step, checkpoint's step, time], the proof that nothing was lost."""
    _exit_when[:] = [exit_when] if exit_when else []
    phase("start")   # a job that listens is starting: a drill's `start` need not wait for its first callback
    if _armed or signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return
    try:
        signal.signal(signal.SIGTERM, _on_term)
    except ValueError:
        return   # not the main thread
    _armed.append(True)


def _at_checkpoint() -> bool:
    """Nothing this start reported is unsaved: no save under way, and the step reported last is the newest
    checkpoint's (one completed in this start, else the step it resumed from); or no step reported yet in a start
    that never said where it resumed from. Read in the SIGTERM handler, between any two bytecodes of the main
    thread: phase() sets the step before it records the phase, so a half-made update reads as unsaved."""
    if _state.get("pid") != os.getpid():
        return True   # nothing reported by this process: nothing it could lose
    if _state.get("phase") == "save":
        return False
    checkpoint = _checkpoint()
    if checkpoint is None:
        return "step" not in _state.get("phases", {}) and not _state.get("step")
    return int(_state.get("step") or 0) == int(checkpoint)


def _on_term(signum: int, frame: Any) -> None:
    _stopped.append(time.time())
    if _exit_when and _at_checkpoint() and _exit_when[0]():
        _state["stopped"] = [int(_state.get("step") or 0), _checkpoint(), time.time()]
        _write()
        raise SystemExit(STOPPED_CODE)


def _checkpoint() -> int | None:
    saves = _state.get("saves") or []
    return int(saves[-1][0]) if saves else _state.get("from")
