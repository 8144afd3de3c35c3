"""What runs show: logs, download, tensorboard, jobs. Registered on the app after runs.py (--help's order)."""
from __future__ import annotations

import time
from typing import Any, List, Optional

import typer

from .common import CLUSTER, PROVIDER, app, check_run_ids, check_worker, cluster_and_provider, console, interrupted
from .runs import follow_run
from ..core.errors import ErrorKind, TpuctlError, bad_input


@app.command()
def logs(run_id: Optional[str] = typer.Argument(None, help="Run id (default: the latest run)."),
         cluster: Optional[str] = CLUSTER,
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep following until the run ends."),
         worker: int = typer.Option(0, "--worker", help="Worker of a multi-host slice (0 is the primary log)."),
         slice_: int = typer.Option(0, "--slice", help="Slice of a Multislice cluster (with --worker: one host)."),
         all_hosts: bool = typer.Option(False, "--all-hosts", help="Every host's output, each line prefixed "
                                        "[sK/wW]."),
         give_up_after: float = typer.Option(900.0, "--give-up-after", help="Seconds to follow a silent host."),
         stacks: bool = typer.Option(False, "--stacks", help="Print the stacks every host's job had when the run "
                                     "stalled (stacks-wN.txt), instead of its output."),
         provider: Optional[str] = PROVIDER) -> None:
    """Print a run's output, raw, on stdout."""
    from ..core import backends, hostlogs, runs
    from ..control import submission
    check_run_ids(run_id)
    st, prov = cluster_and_provider(cluster, provider, run_id)
    check_worker(st, worker)
    slices = max(1, st.spec.slices)
    if not 0 <= slice_ < slices:
        raise bad_input(f"cluster {st.name} has {slices} slice{'s' * (slices > 1)}", f"--slice takes 0 to {slices - 1}")
    if all_hosts and (worker or slice_):
        raise bad_input("--all-hosts follows every host: --slice and --worker pick one", "give one or the other")
    worker += slice_ * max(1, st.host.hosts)   # the host's index across slices (host/agent.py)
    store = prov.store(st)
    rid = submission.resolve_run(store, run_id)
    if stacks:
        raise typer.Exit(_stacks(store, rid, worker if (worker or slice_) else None))
    job = runs.job(store, rid)
    record = {"arch": st.spec.arch.value, "runtime": st.runtime, "slices": st.spec.slices}   # as in the cluster record
    framework = backends.program_framework(job.framework, job.env, job.keras_backend, record) if job else "tensorflow"
    who = hostlogs.hosts(slices, max(1, st.host.hosts), framework) if all_hosts else None
    if worker > 0 and job is not None and framework == "tensorflow":
        console().err.print(f"run {rid} is a TensorFlow program: it runs on worker 0 (`tpuctl logs {rid}`); "
                             f"worker {worker} serves the TPU runtime")
        return
    raise typer.Exit(follow_run(store, rid, st, prov, worker, follow, give_up_after, who))


def _stacks(store: Any, run_id: str, worker: Optional[int]) -> int:
    """The stacks the run doctor saved (host/doctor.py), every host's (or --worker's), each after a header line."""
    from ..core import layout
    prefix = layout.run_prefix(run_id) + "stacks-w"
    keys = sorted((k for k, _ in store.list(prefix)), key=lambda k: int(k[len(prefix):-len(".txt")] or 0))
    if worker is not None:
        keys = [k for k in keys if k == layout.run_stacks(run_id, worker)]
    if not keys:
        raise TpuctlError(ErrorKind.NOT_FOUND, f"run {run_id} has no stacks" + (f" of worker {worker}" if worker
                                                                                 is not None else ""),
                          "the run doctor saves them when a run stalls (submit --stall-after)")
    for k in keys:
        print(f"==> {k.rsplit('/', 1)[-1]} <==", flush=True)
        print((store.read(k) or b"").decode(errors="replace"), flush=True)
    return 0


@app.command()
def download(run_id: Optional[str] = typer.Argument(None, help="Run id (default: the latest run)."),
             dest: Optional[str] = typer.Option(None, "--output", "-o", help="Directory (default: ./RUN_ID)."),
             cluster: Optional[str] = CLUSTER,
             provider: Optional[str] = PROVIDER) -> None:
    """Fetch a run's outputs (checkpoints, TensorBoard events, metrics.json); again, only what changed."""
    from pathlib import Path

    from ..control import download as dl, submission
    from ..core import runs
    from .common import cannot_write, writable_dir
    check_run_ids(run_id)
    con = console()
    st, prov = cluster_and_provider(cluster, provider, run_id)
    store = prov.store(st)
    rid = submission.resolve_run(store, run_id)
    submission.refresh(st, prov, store, [rid])
    target = Path(dest or rid)
    if target.exists() and not target.is_dir():
        raise bad_input(f"{target} exists and is not a directory", "pass -o DIR")
    writable_dir(target, "-o")
    try:
        with con.Reporter() as rep:
            got = dl.outputs(store, rid, target, lambda total: rep.transfer(total, "download",
                                                                             f"run {rid}'s outputs"))
    except OSError as e:
        raise cannot_write(e, target, "-o") from None
    if got.files == 0:
        con.err.print(f"run {rid} has no outputs yet (a job writes them under $TPUCTL_OUTPUT_DIR)")
        return
    con.err.print(f"[green]{target}/[/]: {got.fetched} of {got.files} files fetched "
                  f"({con.human_bytes(got.bytes_fetched)}; {con.human_bytes(got.bytes_unchanged)} already here)")
    if not runs.status(store, rid).state.final:
        con.err.print(f"run {rid} is still going: run the same command again to fetch what is new")


@app.command()
def tensorboard(run_ids: List[str] = typer.Argument(None, help="Run ids (default: every run of the cluster)."),
                cluster: Optional[str] = CLUSTER,
                port: Optional[int] = typer.Option(None, "--port", help="Port (default: the first free from 6006)."),
                host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
                provider: Optional[str] = PROVIDER) -> None:
    """Serve TensorBoard on runs' event files (a bucket's are synced as they grow) and print its URL."""
    from . import tensorboard as board
    from ..core import runindex
    from ..control import submission
    check_run_ids(*(run_ids or []))
    board.require_installed()
    if port is not None:
        board.check_port(port, host)
    con = console()
    st, prov = cluster_and_provider(cluster, provider)
    store = prov.store(st)
    ids = [submission.resolve_run(store, r) for r in run_ids] if run_ids else runindex.all_ids(store)
    if not ids:
        raise TpuctlError(ErrorKind.NOT_FOUND, f"cluster {st.name} has no runs yet",
                          "`tpuctl submit JOB_DIR` starts one")
    sources = board.Sources(store, st.name, ids)
    if sources.cached:
        con.err.print(f"syncing event files of {len(sources.cached)} run(s) from {st.spec.store} every "
                      f"{board.sync_seconds():g}s")

    def ready(url: str) -> None:
        con.err.print(f"[green]TensorBoard[/] for {len(ids)} run(s): {url}   (Ctrl-C stops it)")
        print(url, flush=True)
    try:
        code = board.serve(sources, port, host, ready)
    except KeyboardInterrupt:
        raise interrupted("TensorBoard stopped; the runs it showed are untouched") from None
    raise typer.Exit(code)


@app.command()
def jobs(cluster: Optional[str] = CLUSTER,
         as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
         limit: int = typer.Option(20, "--limit", "-n", min=1, help="Show the latest N runs."),
         show_all: bool = typer.Option(False, "--all", help="Show every run (reads each one: slow on a long "
                                                             "history)."),
         provider: Optional[str] = PROVIDER) -> None:
    """List the cluster's runs, newest first: id, job, state, start, duration, exit code, latest step and loss,
    loss curve, goodput (the share of the run's time spent in training steps that were kept), and tpu (the chips'
    mean duty cycle over the last samples its host took, or n/a and why)."""
    from ..control import submission
    from ..core import budget
    con = console()
    st, prov = cluster_and_provider(cluster, provider)
    submission.refresh(st, prov, prov.store(st))
    rows = submission.table(prov.store(st), None if show_all else limit + 1)
    if not show_all and len(rows) > limit:
        rows = rows[:limit]
        con.err.print(f"the latest {'run' if limit == 1 else f'{limit} runs'}; `--limit N` or `--all` shows more",
                      style="dim")
    from ..control.status import costing
    hourly, spend = costing(st, prov)   # the budget: each row carries it in --json, a line says it otherwise
    submission.costed(rows, hourly)
    if as_json:
        con.print_json([{**r, **spend} for r in rows])
        return
    for r in rows:
        if r.get("state") == "cancelled" and "--budget is spent" in str(r.get("note") or ""):
            r["state"] = "cancelled (budget)"   # the cluster's cap ended it, not a user's cancel
        if r.get("stalled_since"):   # since its last progress (host/doctor.py); `running, stalled`: --on-stall notify
            since = time.strftime('%H:%M:%S', time.localtime(float(str(r['stalled_since']))))
            r["state"] = f"{'' if r['state'] == 'stalled' else str(r['state']) + ', '}stalled since {since}"
        if r.get("failure") and r.get("state") in ("failed", "ended"):   # ended: a replacement failed (replacing.py)
            r["state"] = f"{r['state']} ({r['failure']})"   # the cause (host/failures.py)
        if r.get("restarts"):
            r["state"] = f"{r['state']} ({r['restarts']} restart{'s' * (r['restarts'] != 1)})"
    if spend:
        d = budget.dollars
        con.err.print(f"budget {d(float(str(spend['budget_usd'])))}: {d(float(str(spend['spent_usd'])))} spent, "
                      f"{d(float(str(spend['left_usd'])))} left", markup=False)
    con.print_table(["id", "job", "state", "started", "duration", "exit", "cost", "step", "loss", "loss curve",
                     "goodput", "tpu"],
                    [[r["id"], r["name"], r["state"], r["started"],
                      "" if r["duration"] is None else f"{r['duration']:.0f}s",
                      "" if r["exit_code"] is None else r["exit_code"],
                      "" if r["cost_usd"] is None else f"${r['cost_usd']:.2f}",
                      "" if r["step"] is None else r["step"],
                      "" if r["loss"] is None else f"{r['loss']:.4f}", r["loss_curve"],
                      "" if r["goodput"] is None else f"{r['goodput']:.0f}%"
                      + _resumes(r), r["tpu"]]
                     for r in rows], keep=("id",), drop=JOBS_DROPPED_FIRST)
    for r in rows:
        if r["note"]:
            con.err.print(f"[yellow]! run {r['id']}: {r['note']}[/]")


# What `jobs` goes without in a narrow terminal, first first: never the id (what logs, download and cancel take).
JOBS_DROPPED_FIRST = ("loss curve", "tpu", "cost", "goodput", "exit", "started", "duration", "step", "loss", "job")


def _resumes(row: dict[str, Any]) -> str:
    n, k = row["goodput_parts"]["resumes"], row.get("recoveries", 0)
    said = ([f"{n} resume{'s' * (n > 1)}"] if n else []) + ([f"{k} recover{'ies' if k > 1 else 'y'}"] if k else [])
    return f" ({', '.join(said)})" if said else ""
