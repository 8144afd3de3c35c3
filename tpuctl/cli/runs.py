"""The run commands: submit (and its dry run), logs, download, tensorboard, ssh, jobs, cancel. Registered on the
app when clusters.py imports this module."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, List, Optional

import typer

from .common import (CLUSTER, PROVIDER, app, check_worker, cluster_and_provider, cluster_name, console,
                     interrupted)
from ..core.errors import ErrorKind, ExitCode, TpuctlError, bad_input

if TYPE_CHECKING:
    from ..core.jobspec import JobSpec
    from ..core.models import ClusterState
    from ..providers.base import Provider
    from ..core.store import BlobStore


def _follow(store: "BlobStore", run_id: str, st0: "ClusterState", prov: "Provider", worker: int = 0,
            follow: bool = True, give_up_after: float = 900.0, all_hosts: list[tuple[int, str]] | None = None) -> int:
    from ..core import hostlogs, layout, runs
    from ..control.hostwatch import HostWatch
    out = sys.stdout.buffer
    cluster = st0.name

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()
    host_watch = HostWatch(prov, st0, run_id, give_up_after, lambda m: console().err.print(f"[yellow]! {m}[/]"),
                           console().Reporter())
    remote = prov.remote_runs
    said = [""]

    def watch(status: "runs.RunStatus") -> None:
        if remote is not None:   # a service's run: each idle poll moves it on, and says when its state changes
            words = remote.advance(st0, store, run_id, follow=follow)
            if words.split(" ")[:4] != said[0].split(" ")[:4]:
                console().err.print(f"[dim]{words}[/]")
            said[0] = words
            return
        host_watch(status)
    try:
        if remote is not None:
            remote.advance(st0, store, run_id, follow=follow)
        st = hostlogs.follow_all(store, run_id, all_hosts, write, follow=follow, watch=watch) if all_hosts else \
            runs.follow(store, run_id, write, worker=worker, follow=follow, watch=watch)
    except KeyboardInterrupt:
        raise interrupted(f"stopped following; run {run_id} keeps running on cluster {cluster}. Reattach: tpuctl logs "
                          f"{run_id} -c {cluster} -f; stop it: tpuctl cancel {run_id} -c {cluster}") from None
    if follow:
        code = st.exit_code
        con = console()
        con.err.print(f"run {run_id} {st.state.value}" + (f" (exit code {code})" if code is not None else "")
                      + (f": {st.note}" if st.state is runs.RunState.ENDED and st.note else ""))
        con.err.print(f"outputs: {store.local_path(layout.run_output(run_id))}/  "
                      f"fetch them: tpuctl download {run_id} -c {cluster}")
        return code if code is not None else int(ExitCode.ERROR)
    return int(ExitCode.OK)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(ctx: typer.Context,
           job_dir: str = typer.Argument(..., help="Directory holding tpuctl.toml."),
           cluster: Optional[str] = CLUSTER,
           data: List[str] = typer.Option([], "--data", help="Extra data path to sync (repeatable)."),
           detach: bool = typer.Option(False, "--detach", "-d", help="Print the run id and return at once."),
           give_up_after: float = typer.Option(900.0, "--give-up-after", help="Seconds to follow a silent host."),
           dry_run: bool = typer.Option(False, "--dry-run",
                                        help="Show what would be uploaded (needs no cluster); run nothing."),
           down: bool = typer.Option(False, "--down", help="The host ends the compute once the run is final."),
           chain: Optional[int] = typer.Option(None, "--chain", help="Kaggle: sessions a run may chain through "
                                               "past the session limit (default 10)."),
           keep_inputs: bool = typer.Option(False, "--keep-inputs", help="Kaggle: keep the run's input dataset "
                                            "once it ends, so that the same work submitted again uploads nothing "
                                            "(`down` deletes it)."),
           max_restarts: int = typer.Option(0, "--max-restarts", help="Restart the job up to N times when it exits "
                                            "42 (tpuctl.runtime.RESTART_CODE) or dies by a signal tpuctl did not "
                                            "send, as xpk does."),
           notify_to: List[str] = typer.Option([], "--notify", help="Send this run's events to a webhook or "
                                               "Apprise URL (repeatable), besides the cluster's."),
           provider: Optional[str] = PROVIDER) -> None:
    """Package JOB_DIR, sync its data, run it on the cluster and follow its logs; exits with the job's code.
    Arguments after `--` are appended to the job's command."""
    from ..core import jobspec, packaging
    from ..control import submission
    from ..core.notify import check_urls
    con = console()
    urls = check_urls(notify_to)
    job = jobspec.load(job_dir, data)          # the job's own mistakes first, before any cluster is looked for
    packaging.files(job.root, job.data)        # links out of the job are refused here too
    if dry_run:
        _submit_preview(job, cluster, provider)
        return
    st, prov = cluster_and_provider(cluster, provider)
    if chain is not None and (prov.remote_runs is None or chain < 1):
        raise bad_input(f"--chain {chain}: " + ("must be at least 1" if prov.remote_runs else
                        f"cluster {st.name}'s runs do not run in sessions"),
                        "--chain applies to --provider kaggle clusters, e.g. --chain 5")
    if keep_inputs and prov.remote_runs is None:
        raise bad_input(f"--keep-inputs: cluster {st.name}'s runs have no input dataset to keep",
                        "--keep-inputs applies to --provider kaggle clusters")
    _check_max_restarts(max_restarts, st, prov)
    with con.Reporter() as rep:
        if down:   # refused before the run exists when the host could not end the compute after it
            from ..control.up import arm
            arm(st, prov, lambda s: rep.resource("--down", "host", s))
        run_id, _ = submission.submit(st, prov, job, list(ctx.args), rep.transfer, rep, down_after=down,
                                      sessions=chain or 0, keep_inputs=keep_inputs, max_restarts=max_restarts,
                                      notify_urls=urls)
    if detach:
        print(run_id)
        return
    con.err.print(f"run {run_id} submitted; following its log (Ctrl-C stops following, not the run)")
    raise typer.Exit(_follow(prov.store(st), run_id, st, prov, give_up_after=give_up_after))


def _check_max_restarts(n: int, st: "ClusterState", prov: "Provider") -> None:
    """--max-restarts is the host agent's to honour: a service's sessions (Kaggle) chain by CONTINUE_CODE instead."""
    if n < 0:
        raise bad_input(f"--max-restarts {n} must be 0 or more", "e.g. --max-restarts 3")
    if n and prov.remote_runs is not None:
        raise bad_input(f"--max-restarts: cluster {st.name}'s runs run in a service's sessions, not under tpuctl's "
                        "agent", "a job there continues in the next session by exiting tpuctl.runtime.CONTINUE_CODE")


def _submit_preview(job: "JobSpec", cluster: Optional[str], provider: Optional[str]) -> None:
    from ..core import state
    from ..control import submission
    con = console()
    st = state.load(cluster_name(cluster))
    store = None
    if st is not None:
        try:
            store = cluster_and_provider(cluster, provider)[1].store(st)
        except TpuctlError as e:   # no credentials, say: still show what is known offline
            con.err.print(f"[yellow]! cannot compare with cluster {st.name}'s store: {e.message}[/]")
    p = submission.preview(job, store)
    human = con.human_bytes
    print(f"job      {job.name}: {job.command}")
    if job.tensorflow:
        print(f"tensorflow {job.tensorflow} (what a TPU VM on a base runtime installs for it: tensorflow-tpu; "
              "a tpu-vm-tf image keeps its own)")
    print(f"package  {human(p.package_bytes)} packed ({human(p.package_unpacked_bytes)} of files), "
          f"sha256 {p.package_sha256[:12]}" +
          ("" if store is None else ("  new" if p.package_new else "  already in the store")))
    if p.data:
        print(f"data     {len(p.data)} files, {human(p.data_bytes)} ({p.data_contents} distinct contents); "
              "the job sees each at $TPUCTL_DATA_DIR/<path>:")
        for path, rel, size in p.data[:20]:
            print(f"           {rel}  <- {path}  ({human(size)})")
        if len(p.data) > 20:
            print(f"           ... and {len(p.data) - 20} more")
    where = (f"to cluster {st.name}'s store: {p.data_new_contents} of {p.data_contents} data contents new"
             if store is not None and st is not None else "no cluster to compare with: everything counted")
    print(f"to send  {human(p.bytes_to_send)} ({where})")
    con.err.print("dry run: nothing was uploaded or run")


@app.command()
def logs(run_id: Optional[str] = typer.Argument(None, help="Run id (default: the latest run)."),
         cluster: Optional[str] = CLUSTER,
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep following until the run ends."),
         worker: int = typer.Option(0, "--worker", help="Worker of a multi-host slice (0 is the primary log)."),
         slice_: int = typer.Option(0, "--slice", help="Slice of a Multislice cluster (with --worker: one host)."),
         all_hosts: bool = typer.Option(False, "--all-hosts", help="Every host's output, each line prefixed "
                                        "[sK/wW]."),
         give_up_after: float = typer.Option(900.0, "--give-up-after", help="Seconds to follow a silent host."),
         provider: Optional[str] = PROVIDER) -> None:
    """Print a run's output, raw, on stdout."""
    from ..core import hostlogs, runs
    from ..control import submission
    st, prov = cluster_and_provider(cluster, provider)
    check_worker(st, worker)
    slices = max(1, st.spec.slices)
    if not 0 <= slice_ < slices:
        raise bad_input(f"cluster {st.name} has {slices} slice{'s' * (slices > 1)}", f"--slice takes 0 to {slices - 1}")
    if all_hosts and (worker or slice_):
        raise bad_input("--all-hosts follows every host: --slice and --worker pick one", "give one or the other")
    worker += slice_ * max(1, st.host.hosts)   # the host's index across slices (host/agent.py)
    store = prov.store(st)
    rid = submission.resolve_run(store, run_id)
    job = runs.job(store, rid)
    who = hostlogs.hosts(slices, max(1, st.host.hosts), job.framework if job else "tensorflow") if all_hosts else None
    if worker > 0 and job is not None and job.framework == "tensorflow":
        console().err.print(f"run {rid} is a TensorFlow program: it runs on worker 0 (`tpuctl logs {rid}`); "
                             f"worker {worker} serves the TPU runtime")
        return
    raise typer.Exit(_follow(store, rid, st, prov, worker, follow, give_up_after, who))


@app.command()
def download(run_id: Optional[str] = typer.Argument(None, help="Run id (default: the latest run)."),
             dest: Optional[str] = typer.Option(None, "--output", "-o", help="Directory (default: ./RUN_ID)."),
             cluster: Optional[str] = CLUSTER,
             provider: Optional[str] = PROVIDER) -> None:
    """Fetch a run's outputs (checkpoints, TensorBoard events, metrics.json); again, only what changed."""
    from pathlib import Path

    from ..control import download as dl, submission
    from ..core import runs
    con = console()
    st, prov = cluster_and_provider(cluster, provider)
    store = prov.store(st)
    rid = submission.resolve_run(store, run_id)
    submission.refresh(st, prov, store, [rid])
    target = Path(dest or rid)
    if target.exists() and not target.is_dir():
        raise bad_input(f"{target} exists and is not a directory", "pass -o DIR")
    with con.Reporter() as rep:
        got = dl.outputs(store, rid, target, lambda total: rep.transfer(total, "download"))
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
        code = board.serve(sources, port or board.free_port(), host, ready)
    except KeyboardInterrupt:
        raise interrupted("TensorBoard stopped; the runs it showed are untouched") from None
    raise typer.Exit(code)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(ctx: typer.Context, cluster: Optional[str] = CLUSTER,
        worker: int = typer.Option(0, "--worker", help="Worker of a multi-host slice."),
        provider: Optional[str] = PROVIDER) -> None:
    """Open a shell on the cluster's host through gcloud (`-- CMD` runs CMD there instead)."""
    import shlex
    import shutil
    import subprocess
    from ..core.models import Phase
    st, prov = cluster_and_provider(cluster, provider)
    if st.phase is Phase.DOWN:
        raise TpuctlError(ErrorKind.NOT_FOUND, f"cluster {st.name} is down", f"`tpuctl up -c {st.name}` brings it back")
    check_worker(st, worker)
    argv = prov.ssh_argv(st, worker, shlex.join(ctx.args))
    if shutil.which(argv[0]) is None:
        raise bad_input(f"{argv[0]} is not installed: `tpuctl ssh` runs `{shlex.join(argv)}`",
                        "install the Google Cloud CLI (cloud.google.com/sdk/docs/install), then run it again")
    console().err.print(f"$ {shlex.join(argv)}", style="dim", markup=False)
    raise typer.Exit(subprocess.call(argv))


@app.command()
def jobs(cluster: Optional[str] = CLUSTER,
         as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
         limit: int = typer.Option(20, "--limit", "-n", min=1, help="Show the latest N runs."),
         show_all: bool = typer.Option(False, "--all", help="Show every run (reads each one: slow on a long "
                                                             "history)."),
         provider: Optional[str] = PROVIDER) -> None:
    """List the cluster's runs, newest first: id, job, state, start, duration, exit code, latest step and loss,
    loss curve, and goodput (the share of the run's time spent in training steps that were kept)."""
    from ..control import submission
    con = console()
    st, prov = cluster_and_provider(cluster, provider)
    submission.refresh(st, prov, prov.store(st))
    rows = submission.table(prov.store(st), None if show_all else limit + 1)
    if not show_all and len(rows) > limit:
        rows = rows[:limit]
        con.err.print(f"the latest {'run' if limit == 1 else f'{limit} runs'}; `--limit N` or `--all` shows more",
                      style="dim")
    from ..core import budget
    hourly = budget.hourly(prov.price(st.spec).hourly)
    for r in rows:   # what the compute cost while the run ran, at the price every cost is counted at
        d = r["duration"]
        r["cost_usd"] = round(d / 3600 * hourly, 4) if isinstance(d, float) and hourly is not None else None
    from ..control.status import budget_of
    spend = budget_of(st, prov)   # the cluster's budget: each row carries it in --json, a line says it otherwise
    if as_json:
        con.print_json([{**r, **spend} for r in rows])
        return
    for r in rows:
        if r.get("restarts"):
            r["state"] = f"{r['state']} ({r['restarts']} restart{'s' * (r['restarts'] != 1)})"
    if spend:
        con.err.print(f"budget ${spend['budget_usd']:.2f}: ${spend['spent_usd']:.2f} spent, ${spend['left_usd']:.2f} "
                      "left", markup=False)
    con.print_table(["id", "job", "state", "started", "duration", "exit", "cost", "step", "loss", "loss curve",
                     "goodput"],
                    [[r["id"], r["name"], r["state"], r["started"],
                      "" if r["duration"] is None else f"{r['duration']:.0f}s",
                      "" if r["exit_code"] is None else r["exit_code"],
                      "" if r["cost_usd"] is None else f"${r['cost_usd']:.2f}",
                      "" if r["step"] is None else r["step"],
                      "" if r["loss"] is None else f"{r['loss']:.4f}", r["loss_curve"],
                      "" if r["goodput"] is None else f"{r['goodput']:.0f}%"
                      + _resumes(r)]
                     for r in rows], keep=("id",), drop=JOBS_DROPPED_FIRST)
    for r in rows:
        if r["note"]:
            con.err.print(f"[yellow]! run {r['id']}: {r['note']}[/]")


# What `jobs` goes without in a narrow terminal, first first: never the id (what logs, download and cancel take).
JOBS_DROPPED_FIRST = ("loss curve", "cost", "goodput", "exit", "started", "duration", "step", "loss", "job")


def _resumes(row: dict[str, Any]) -> str:
    n, k = row["goodput_parts"]["resumes"], row.get("recoveries", 0)
    said = ([f"{n} resume{'s' * (n > 1)}"] if n else []) + ([f"{k} recover{'ies' if k > 1 else 'y'}"] if k else [])
    return f" ({', '.join(said)})" if said else ""


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def notebook(ctx: typer.Context, job_dir: str = typer.Argument(..., help="Directory holding tpuctl.toml."),
             output: Optional[str] = typer.Option(None, "--output", "-o", help="Notebook file (default: JOB.ipynb)."),
             data: List[str] = typer.Option([], "--data", help="Extra data path to carry (repeatable)."),
             data_uri: str = typer.Option("", "--data-uri", help="Read the data from this Drive folder or gs:// URI "
                                          "instead of carrying it (needed past --embed-limit-mb)."),
             embed_limit_mb: float = typer.Option(20.0, "--embed-limit-mb", help="Most data carried inside.")) -> None:
    """Write a notebook that runs the job on Colab's TPU (or any Jupyter), resuming from Google Drive each session.
    Arguments after `--` are appended to the job's command."""
    import json
    from pathlib import Path

    from ..control import notebook as nb
    from ..core import jobspec
    job = jobspec.load(job_dir, data)
    doc = nb.build(job, list(ctx.args), data_uri, embed_limit_mb)
    target = Path(output or f"{job.name}.ipynb")
    target.write_text(json.dumps(doc, indent=1))
    console().err.print(f"[green]{target}[/]: {target.stat().st_size / 1e6:.1f} MB, the job, "
                        f"{'its data' if not data_uri else 'the data from ' + data_uri} and tpuctl inside; on Colab: "
                        "File, Upload notebook, Runtime, Change runtime type, v5e-1 TPU, Run all")


@app.command()
def cancel(run_id: str = typer.Argument(..., help="Run id."), cluster: Optional[str] = CLUSTER,
           provider: Optional[str] = PROVIDER) -> None:
    """Ask the agent to stop a run (SIGTERM, then SIGKILL after a grace period)."""
    from ..control import submission
    st, prov = cluster_and_provider(cluster, provider)
    store = prov.store(st)
    if prov.remote_runs is not None:
        rid = submission.resolve_run(store, run_id)
        prov.remote_runs.cancel(st, store, rid)
        console().err.print(f"run {rid} cancelled")
        return
    console().err.print(f"cancel of run {submission.cancel(store, run_id)} requested")
