"""`tpuctl drill JOB_DIR`: the job through what a preemption delivers, on a temporary local cluster made and removed
here (free, no cloud), or on an existing one (-c: signalled through its agent), with the drills of
control/drill.py; a table (or --json) and exit 0/1."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from typing import TYPE_CHECKING, Optional

import typer

from .common import app, console
from .parsing import PassOnCommand
from ..core.errors import ErrorKind, TpuctlError, bad_input

if TYPE_CHECKING:
    from ..control.drill import Drill, Outcome, Say

SPOT_GRACE = 30.0   # a Spot VM's ACPI G2 soft off to G3 (RUN_HEALTH_FACTS.md section 1: Compute API Scheduling)


@app.command(cls=PassOnCommand)
def drill(ctx: typer.Context,
          job_dir: str = typer.Argument(..., help="Directory holding tpuctl.toml."),
          cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="An existing cluster: the job is "
                                                "submitted there and signalled through its agent (a restart, across "
                                                "hosts a new round; no TPU is deleted); default: a temporary local "
                                                "cluster, removed after."),
          at: Optional[str] = typer.Option(None, "--at", help="Phases to drill, in order, one per start of the job: "
                                           "start, compile, step, save, eval; `:kill` for SIGKILL alone (a lost "
                                           "host). Default: start,compile,step,save,step:kill,eval."),
          random_n: int = typer.Option(0, "--random", help="N drills at phases and signals drawn at random "
                                       "(--seed), instead of --at."),
          seed: Optional[int] = typer.Option(None, "--seed", help="The seed of --random (printed when drawn)."),
          grace: float = typer.Option(SPOT_GRACE, "--grace", help="Seconds between SIGTERM and SIGKILL (a Spot "
                                      "VM's 30 s by default)."),
          by_time: float = typer.Option(60.0, "--by-time", help="A job that reports no phases is signalled this "
                                        "many seconds into each start."),
          as_json: bool = typer.Option(False, "--json", help="A list with one object per drill, on stdout.")) -> None:
    """Run JOB_DIR and deliver what a preemption delivers at chosen moments (SIGTERM, its grace, SIGKILL; or
    SIGKILL alone); say whether each start saved, resumed from its last checkpoint and how much it redid. Exits 1
    when a drill failed. Arguments after `--` are appended to the job's command."""
    from ..control import drill as drills
    if grace < 0:
        raise bad_input(f"--grace {grace:g} is negative", "e.g. --grace 30")
    if random_n and seed is None:
        seed = int(time.time()) % 100000
    plan = drills.plan(at, random_n, seed)
    con = console()
    if random_n:
        con.err.print(f"drills drawn with --seed {seed}: {', '.join(d.label for d in plan)}", markup=False)
    say: "Say" = lambda s: con.err.print(s, markup=False)
    outcomes, final = _drill_on(cluster, job_dir, list(ctx.args), plan, grace, by_time, say) if cluster else \
        _drill_locally(job_dir, list(ctx.args), plan, grace, by_time, say)
    if as_json:
        print(json.dumps([o.to_json() for o in outcomes], indent=2))
    else:
        _table(outcomes, final)
    failed = [o for o in outcomes if o.passed is False]
    for o in failed:
        con.print_error(f"drill {o.phase} ({o.signal}): {o.why}", o.hint)
    if failed:
        raise typer.Exit(1)


def _tpuctl(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tpuctl", *args], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)


def _drill_locally(job_dir: str, args: list[str], plan: list["Drill"], grace: float, by_time: float,
                   say: "Say") -> tuple[list["Outcome"], str]:
    """A temporary local cluster, the run submitted with one restart per drill, the drills, the run to its end; the
    cluster removed whatever happens."""
    from ..control import drill as drills
    from ..core import runs, state
    from ..core.store import LocalStore
    name = f"drill-{uuid.uuid4().hex[:6]}"
    # the agent inherits these at `up`: the job's step written often (the steps redone are counted from it), and a
    # restart at once (the drill measures the job's own restart, not tpuctl's backoff)
    env = {**os.environ, "TPUCTL_PROGRESS_SECONDS": os.environ.get("TPUCTL_PROGRESS_SECONDS", "0.2"),
           "TPUCTL_RESTART_BACKOFF": os.environ.get("TPUCTL_RESTART_BACKOFF", "0")}
    say(f"drill: a temporary local cluster {name}")
    run_id = ""
    try:
        r = _tpuctl(env, "up", "--provider", "local", "-c", name, "--yes")
        if r.returncode != 0:
            raise TpuctlError(ErrorKind.INPUT, f"the drill's local cluster could not start: {_last(r.stderr)}", "")
        r = _tpuctl(env, "submit", job_dir, "-c", name, "--detach", "--max-restarts", str(len(plan)), "--", *args)
        if r.returncode != 0:
            raise TpuctlError(ErrorKind.INPUT, f"the job could not be submitted: {_last(r.stderr)}",
                              f"`tpuctl submit {job_dir} --provider local` shows why")
        run_id = r.stdout.strip().splitlines()[-1]
        st0 = state.load(name)
        assert st0 is not None, "`up` saved it"
        store = LocalStore(st0.spec.store)
        job = drills.Job(store, run_id)
        outcomes = drills.Driver(job, grace, say, by_time).run(plan)
        st = drills.wait_final(job)
        if st.state is not runs.RunState.SUCCEEDED:
            say(f"drill: the run ended {st.state.value} (exit {st.exit_code}); its log: tpuctl logs {run_id}")
        return outcomes, st.state.value
    finally:
        if run_id:
            _tpuctl(env, "cancel", run_id, "-c", name, timeout=120)
        _tpuctl(env, "down", "-c", name, "--provider", "local", "--delete-bucket", "--yes", timeout=300)


def _drill_on(cluster: str, job_dir: str, args: list[str], plan: list["Drill"], grace: float, by_time: float,
              say: "Say") -> tuple[list["Outcome"], str]:
    """An existing cluster: the job submitted there with one restart per drill, each drill a request its agent
    delivers (control/drill.py AgentSignals), the run to its end (cancelled if the drill stops early)."""
    from ..control import drill as drills
    from .common import cluster_and_provider
    st, prov = cluster_and_provider(cluster, None)
    if prov.remote_runs is not None:
        raise bad_input(f"cluster {st.name} runs jobs through {st.spec.provider.value}'s own service, not a tpuctl "
                        "agent: a drill cannot signal them", "drill on a TPU VM cluster, or drop -c for a local one")
    r = _tpuctl(dict(os.environ), "submit", job_dir, "-c", st.name, "--detach", "--max-restarts", str(len(plan)),
                "--", *args)
    if r.returncode != 0:
        raise TpuctlError(ErrorKind.INPUT, f"the job could not be submitted: {_last(r.stderr)}",
                          f"`tpuctl submit {job_dir} -c {st.name}` shows why")
    run_id = r.stdout.strip().splitlines()[-1]
    say(f"drill: run {run_id} on cluster {st.name}, signalled through its agent")
    job = drills.Job(prov.store(st), run_id)
    ended = False
    try:
        outcomes = drills.Driver(job, grace, say, by_time, through_agent=True).run(plan)
        final = drills.wait_final(job)
        ended = final.state.final
        return outcomes, final.state.value
    finally:
        if not ended:
            _tpuctl(dict(os.environ), "cancel", run_id, "-c", st.name, timeout=120)


def _last(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _table(outcomes: list["Outcome"], final: str) -> None:
    con = console()
    rows = []
    for o in outcomes:
        result = "not reached" if o.passed is None else "pass" if o.passed else "FAIL"
        rows.append([o.phase, o.signal, _cell(o.step), _cell(o.saved_in_grace), _cell(o.ended_in_grace),
                     _cell(o.last_checkpoint), _cell(o.resumed_from), _cell(o.redone), _cell(o.to_first_step_s),
                     _cell(o.compile_s), _cell(o.goodput_cost_s), _cell(o.data),
                     result + (" (by time)" if o.by_time else "")])
    con.print_table(["phase", "signal", "step", "saved", "ended", "last ckpt", "resumed", "redone", "1st step s",
                     "compile s", "cost s", "data", "result"], rows, drop=("cost s", "data", "compile s", "1st step s"))
    con.err.print(f"the run ended {final}; saved/ended: a checkpoint completed, and the job ended, within the "
                  "grace; 1st step s: from the job's end to the next start's first step", markup=False)
    if any(o.by_time for o in outcomes):
        con.err.print("drilled by time: the job reports no phases (tpuctl.runtime's metrics_callback or Progress "
                      "report them: docs/jobs.md)", markup=False)
