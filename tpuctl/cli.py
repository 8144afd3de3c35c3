"""typer commands: parse, load config, call the orchestrator, render. No cloud logic here.

Imports of google-cloud and the providers happen inside commands, so `tpuctl --help` stays fast.
"""
from __future__ import annotations

import os
import sys
import traceback
from types import ModuleType
from typing import TYPE_CHECKING, List, Optional

import typer

from . import __version__
from .errors import ErrorKind, ExitCode, TpuctlError, bad_input

if TYPE_CHECKING:
    from .jobspec import JobSpec
    from .models import ClusterSpec, ClusterState
    from .providers.base import Provider
    from .store import BlobStore

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Train TensorFlow jobs on Cloud TPUs (or this machine): up, submit, logs, down.",
                  context_settings={"help_option_names": ["-h", "--help"]})



def _cluster_names(incomplete: str) -> list[str]:
    """Shell completion of -c: the clusters in local state (file names only: nothing is parsed or asked)."""
    from .state import cluster_names
    return [n for n in cluster_names() if n.startswith(incomplete)]


CLUSTER = typer.Option(None, "--cluster", "-c", help="Cluster name (default: 'default').",
                       autocompletion=_cluster_names)
PROVIDER = typer.Option(None, "--provider", help="gcp (default) or local; also TPUCTL_PROVIDER.")
PROJECT = typer.Option(None, "--project", help="Google Cloud project id.")


def _print_version(value: bool) -> None:
    if value:
        print(f"tpuctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_print_version,
                                       help="Print tpuctl's version and exit.")) -> None:
    """Train TensorFlow jobs on Cloud TPUs (or this machine): up, submit, logs, down."""


def _config() -> ModuleType:
    from . import config   # lazily: tomllib and configparser are not needed to print help
    return config


def _cluster(flag: Optional[str]) -> str:
    from .models import check_cluster_name
    if flag == "":
        raise bad_input("empty cluster name (-c \"\")", "drop -c to use the cluster 'default', or name one: -c bert")
    config = _config()
    return check_cluster_name(config.setting("cluster", flag, "default"))


def _console() -> ModuleType:
    from . import console
    return console


def _orch() -> ModuleType:
    from . import orchestrator
    return orchestrator


def _interactive() -> bool:
    return sys.stdin.isatty()


def _declined() -> None:
    _console().err.print("nothing changed")
    raise typer.Exit(ExitCode.ERROR)   # README's exit table: 1 also means "declined"


@app.command()
def up(
    type_: Optional[str] = typer.Option(None, "--type", "-t", help="TPU type, e.g. v3-8, v5litepod-8, v6e-4."),
    zone: List[str] = typer.Option([], "--zone", "-z", help="Zone; repeat or comma-separate to fail over on stockouts."),
    cluster: Optional[str] = CLUSTER,
    project: Optional[str] = PROJECT,
    arch: Optional[str] = typer.Option(None, "--arch", help="vm (TPU VM, default) or node (legacy TPU Node + VM)."),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="TPU runtime (vm) or TensorFlow version (node)."),
    spot: bool = typer.Option(False, "--spot", help="Spot/preemptible capacity: cheaper, can be reclaimed."),
    service_account: Optional[str] = typer.Option(None, "--service-account", help="Identity the TPU workload runs as."),
    bucket: Optional[str] = typer.Option(None, "--bucket", help="Bucket to use or create (default: PROJECT-tpuctl-CLUSTER)."),
    vm_type: Optional[str] = typer.Option(None, "--vm-type", help="Machine type of the legacy node's VM."),
    framework: Optional[str] = typer.Option(None, "--framework",
                                            help="tensorflow (default: TF runtimes), jax or pytorch (base runtimes)."),
    autostop: Optional[str] = typer.Option(None, "--autostop",
                                           help="End the compute after this long with no run (90s, 30m, 2h, 1d, off)."),
    max_duration: Optional[str] = typer.Option(None, "--max-duration",
                                               help="End the compute this long after it was made (30m, 8h, 1d, off)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and print the plan; create nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    provider: Optional[str] = PROVIDER,
) -> None:
    """Create (or adopt) a TPU, a bucket in its region, and the bucket permissions its workload needs."""
    from . import providers
    from .providers.base import UpFlags
    con = _console()
    prov = providers.get(_config().provider(provider))
    flags = UpFlags(tpu_type=type_, zones=zone, project=project, arch=arch,
                    runtime=runtime, spot=spot, service_account=service_account, bucket=bucket, vm_type=vm_type,
                    framework=framework)
    spec = prov.make_spec(_cluster(cluster), flags)
    _lifecycle(spec, prov, autostop, max_duration)
    price = prov.price(spec)
    con.err.print(f"[bold]Plan for cluster {spec.name}[/]" + (f" (project {spec.project}):" if spec.project else ":"))
    for row in prov.plan(spec):
        con.err.print(f"  {row.kind:<6} {row.name}  [dim]{row.where}[/]")
    con.err.print(f"  cost   {price.text} while it exists")
    from .lifecycle import show_duration
    if spec.autostop:
        con.err.print(f"  stop   the host ends the compute after {show_duration(spec.autostop)} with no run")
    if spec.max_duration:
        con.err.print(f"  stop   the host ends the compute {show_duration(spec.max_duration)} after it is made")
    if dry_run:
        con.err.print("dry run: nothing was created")
        return
    for warning in prov.preflight(spec):   # no credentials or permissions: say so now, not after a yes
        con.err.print(f"! {warning}", style="yellow", markup=False)
    costs_money = price.hourly != 0.0
    if costs_money and _interactive() and not yes and not con.confirm("Create these resources?"):
        _declined()
    from .locks import cluster_lock
    with cluster_lock(spec.name, "up", lambda m: con.err.print(f"[yellow]! {m}[/]")), con.Reporter() as rep:
        st = _orch().up(spec, prov, rep)
    con.err.print(f"[green]cluster {st.name} ready[/]: {prov.location(st)}, store {st.spec.store}")
    con.err.print(f"next: tpuctl submit JOB_DIR -c {st.name}    when done: tpuctl down -c {st.name}")


@app.command()
def status(cluster: Optional[str] = CLUSTER,
           as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
           provider: Optional[str] = PROVIDER) -> None:
    """Show a cluster's resources as the cloud reports them now."""
    con = _console()
    st, prov = _cluster_and_provider(cluster, provider)
    info = _orch().status(st, prov)
    if as_json:
        con.print_json(info)
        return
    rows = [[k, "yes" if v is True else str(v)] for k, v in info.items()
            if k not in ("grants", "resources", "problem", "fix") and v not in ("", None, False)]
    for kind, res in info["resources"].items():
        if kind in ("boot_logs", "workers"):
            for host, line in res.items():
                rows.append([f"{'boot' if kind == 'boot_logs' else 'agent'} {host}", line])
            continue
        rows.append([kind, " ".join(f"{k}={v}" for k, v in res.items() if v not in ("", None))])
    for g in info["grants"]:
        rows.append(["grant", g])
    con.print_table(["field", "value"], rows)
    if info["problem"]:
        con.err.print(f"[bold red]! {info['problem']}[/]")
    if info["fix"]:
        con.err.print(f"[dim]fix:[/] {info['fix']}" if info["problem"] else f"[dim]{info['fix']}[/]")


@app.command("ls")
def ls_(as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
        project: Optional[str] = PROJECT) -> None:
    """List clusters in local state and every tpuctl-labelled TPU in the project (orphans flagged)."""
    from . import providers
    from .models import ProviderName
    con = _console()
    rows = _orch().ls([providers.get(p) for p in ProviderName], _config().project(project),
                      lambda m: con.err.print(f"[yellow]! {m}[/]"))
    if as_json:
        con.print_json(rows)
        return
    if not rows:
        con.err.print("no clusters; make one with `tpuctl up --type v3-8 --zone us-central1-b`")
        return
    def note(r: dict[str, object]) -> str:
        if r["orphan"]:
            return f"ORPHAN {r['kind']} {r['name']}: no local state; remove: {r['remove']}"
        if r["phase"] == "down":
            kept = f"{con.human_bytes(int(str(r['store_bytes'])))} kept" if r["store_bytes"] is not None else "kept"
            return f"{kept}; --delete-bucket on down removes it"
        return ""
    con.print_table(["cluster", "provider", "type", "zone", "state", "store", "note"],
                    [[r["cluster"], r["provider"], r["type"], r["zone"], r["phase"], r["store"], note(r)]
                     for r in rows])


@app.command()
def down(cluster: Optional[str] = CLUSTER,
         delete_bucket: bool = typer.Option(False, "--delete-bucket", help="Also delete the bucket and its contents."),
         yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
         project: Optional[str] = typer.Option(None, "--project",
                                               help="Without local state: find the cluster by its labels here."),
         provider: Optional[str] = PROVIDER) -> None:
    """Delete what `up` made: TPU, VM, the grants it added; the bucket only with --delete-bucket."""
    from .models import Phase
    con = _console()
    try:
        st, prov = _cluster_and_provider(cluster, provider)
    except TpuctlError as e:
        if e.kind is not ErrorKind.NOT_FOUND:
            raise
        st, prov = _from_labels(_cluster(cluster), project, provider, e)
    already = st.phase is Phase.DOWN
    if already and not delete_bucket:
        con.err.print(f"cluster {st.name} is already down; its {prov.store_noun} {st.spec.store} is kept "
                      f"(`tpuctl down -c {st.name} --delete-bucket` removes it)")
        return
    what = ", ".join(([] if already else prov.teardown_list(st))
                     + ([f"{len(st.grants)} bucket grants"] if st.grants else [])
                     + ([f"{prov.store_noun} {st.spec.store} and all its contents"] if delete_bucket else []))
    if not yes:
        if not _interactive():
            raise bad_input(f"down would delete {what}; refusing without confirmation", "pass --yes")
        if not con.confirm(f"Delete {what}?"):
            _declined()
    from .locks import cluster_lock
    with cluster_lock(st.name, "down", lambda m: con.err.print(f"[yellow]! {m}[/]")), con.Reporter() as rep:
        from . import state
        # as it is now (an `up` may have just run), or as found by its labels when there is no state
        _orch().down(state.load(st.name) or st, prov, rep, delete_bucket)
    con.err.print(f"[green]cluster {st.name} is down[/]")


def _from_labels(name: str, project: Optional[str], provider: Optional[str],
                 missing: TpuctlError) -> "tuple[ClusterState, Provider]":
    """No local state: the cluster as its labelled resources describe it (ls names this way for orphans)."""
    from . import providers
    prov = providers.get(_config().provider(provider))
    proj = _config().project(project)
    if prov.inventory is None or not proj:
        raise missing
    st = _orch().from_labels(name, proj, prov)
    if st is None:
        raise TpuctlError(ErrorKind.NOT_FOUND, f"no cluster named {name!r}, here or labelled in project {proj}",
                          "`tpuctl ls --project P` lists what carries tpuctl's label")
    _console().err.print(f"no local state for {name}: found by its labels in project {proj}")
    return st, prov


def _lifecycle(spec: "ClusterSpec", prov: "Provider", autostop: Optional[str], max_duration: Optional[str]) -> None:
    """--autostop / --max-duration (or the config's autostop / max_duration); when neither is given on a re-run,
    the cluster keeps what it had."""
    from . import state
    from .lifecycle import parse_duration
    prior = state.load(spec.name)
    config = _config()
    for attr, flag, key, value in (("autostop", "--autostop", "autostop", autostop),
                                   ("max_duration", "--max-duration", "max_duration", max_duration)):
        given = config.setting(key, value, None)
        setattr(spec, attr, parse_duration(str(given), flag) if given is not None
                else (getattr(prior.spec, attr) if prior else 0))
    if (spec.autostop or spec.max_duration) and not prov.self_teardown:
        raise TpuctlError(ErrorKind.INPUT, f"--autostop and --max-duration are not enforced on "
                          f"{spec.provider.value} yet: refused rather than shown armed when nothing would fire",
                          "leave them out (or set them off), and `tpuctl down` when done")


def _cluster_and_provider(cluster: Optional[str], provider: Optional[str]) -> "tuple[ClusterState, Provider]":
    from . import providers
    st = _orch().load(_cluster(cluster))
    if provider and provider != st.spec.provider.value:
        raise bad_input(f"cluster {st.name} uses provider {st.spec.provider.value}, not {provider}",
                        "drop --provider")
    return st, providers.get(st.spec.provider)


def _follow(store: "BlobStore", run_id: str, st0: "ClusterState", prov: "Provider", worker: int = 0,
            follow: bool = True, give_up_after: float = 900.0) -> int:
    from . import layout, runs
    from .hostwatch import HostWatch
    out = sys.stdout.buffer
    cluster = st0.name

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()
    watch = HostWatch(prov, st0, run_id, give_up_after, lambda m: _console().err.print(f"[yellow]! {m}[/]"))
    try:
        st = runs.follow(store, run_id, write, worker=worker, follow=follow, watch=watch)
    except KeyboardInterrupt:
        _console().err.print(f"\nstopped following; run {run_id} continues. "
                             f"Reattach: tpuctl logs {run_id} -c {cluster} -f")
        raise typer.Exit(130)
    if follow:
        code = st.exit_code
        con = _console()
        con.err.print(f"run {run_id} {st.state.value}" + (f" (exit code {code})" if code is not None else ""))
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
           provider: Optional[str] = PROVIDER) -> None:
    """Package JOB_DIR, sync its data, run it on the cluster and follow its logs; exits with the job's code.
    Arguments after `--` are appended to the job's command."""
    from . import jobspec, packaging, submission
    con = _console()
    job = jobspec.load(job_dir, data)          # the job's own mistakes first, before any cluster is looked for
    packaging.files(job.root, job.data)        # links out of the job are refused here too
    if dry_run:
        _submit_preview(job, cluster, provider)
        return
    st, prov = _cluster_and_provider(cluster, provider)
    if down and not prov.self_teardown:
        raise TpuctlError(ErrorKind.INPUT, f"submit --down is not enforced on {st.spec.provider.value} yet: "
                          "refused rather than leaving the compute running", f"submit without --down, then "
                          f"`tpuctl down -c {st.name}`")
    with con.Reporter() as rep:
        run_id, _ = submission.submit(st, prov, job, list(ctx.args), rep.transfer, rep, down_after=down)
    if detach:
        print(run_id)
        return
    con.err.print(f"run {run_id} submitted; following its log (Ctrl-C stops following, not the run)")
    raise typer.Exit(_follow(prov.store(st), run_id, st, prov, give_up_after=give_up_after))


def _submit_preview(job: "JobSpec", cluster: Optional[str], provider: Optional[str]) -> None:
    from . import state, submission
    con = _console()
    st = state.load(_cluster(cluster))
    store = None
    if st is not None:
        try:
            store = _cluster_and_provider(cluster, provider)[1].store(st)
        except TpuctlError as e:   # no credentials, say: still show what is known offline
            con.err.print(f"[yellow]! cannot compare with cluster {st.name}'s store: {e.message}[/]")
    p = submission.preview(job, store)
    human = con.human_bytes
    print(f"job      {job.name}: {job.command}")
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
         give_up_after: float = typer.Option(900.0, "--give-up-after", help="Seconds to follow a silent host."),
         provider: Optional[str] = PROVIDER) -> None:
    """Print a run's output, raw, on stdout."""
    from . import runs, submission
    st, prov = _cluster_and_provider(cluster, provider)
    _check_worker(st, worker)
    store = prov.store(st)
    rid = submission.resolve_run(store, run_id)
    job = runs.job(store, rid)
    if worker > 0 and job is not None and job.framework == "tensorflow":
        _console().err.print(f"run {rid} is a TensorFlow program: it runs on worker 0 (`tpuctl logs {rid}`); "
                             f"worker {worker} serves the TPU runtime")
        return
    raise typer.Exit(_follow(store, rid, st, prov, worker, follow, give_up_after))


@app.command()
def download(run_id: Optional[str] = typer.Argument(None, help="Run id (default: the latest run)."),
             dest: Optional[str] = typer.Option(None, "--output", "-o", help="Directory (default: ./RUN_ID)."),
             cluster: Optional[str] = CLUSTER,
             provider: Optional[str] = PROVIDER) -> None:
    """Fetch a run's outputs (checkpoints, TensorBoard events, metrics.json); again, only what changed."""
    from pathlib import Path

    from . import download as dl, runs, submission
    con = _console()
    st, prov = _cluster_and_provider(cluster, provider)
    store = prov.store(st)
    rid = submission.resolve_run(store, run_id)
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
    from . import board, runs, submission
    board.require_installed()
    con = _console()
    st, prov = _cluster_and_provider(cluster, provider)
    store = prov.store(st)
    ids = [submission.resolve_run(store, r) for r in run_ids] if run_ids else runs.all_ids(store)
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
    raise typer.Exit(board.serve(sources, port or board.free_port(), host, ready))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(ctx: typer.Context, cluster: Optional[str] = CLUSTER,
        worker: int = typer.Option(0, "--worker", help="Worker of a multi-host slice."),
        provider: Optional[str] = PROVIDER) -> None:
    """Open a shell on the cluster's host through gcloud (`-- CMD` runs CMD there instead)."""
    import shlex
    import shutil
    import subprocess
    from .models import Phase
    st, prov = _cluster_and_provider(cluster, provider)
    if st.phase is Phase.DOWN:
        raise TpuctlError(ErrorKind.NOT_FOUND, f"cluster {st.name} is down", f"`tpuctl up -c {st.name}` brings it back")
    _check_worker(st, worker)
    argv = prov.ssh_argv(st, worker, shlex.join(ctx.args))
    if shutil.which(argv[0]) is None:
        raise bad_input(f"{argv[0]} is not installed: `tpuctl ssh` runs `{shlex.join(argv)}`",
                        "install the Google Cloud CLI (cloud.google.com/sdk/docs/install), then run it again")
    _console().err.print(f"$ {shlex.join(argv)}", style="dim", markup=False)
    raise typer.Exit(subprocess.call(argv))


def _check_worker(st: "ClusterState", worker: int) -> None:
    workers = max(1, st.host.hosts)
    if not 0 <= worker < workers:
        raise bad_input(f"cluster {st.name} has {workers} worker{'s' * (workers > 1)}",
                        f"--worker takes 0 to {workers - 1}")


@app.command()
def jobs(cluster: Optional[str] = CLUSTER,
         as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
         provider: Optional[str] = PROVIDER) -> None:
    """List the cluster's runs: id, job, state, start, duration, exit code, latest step and loss, loss curve."""
    from . import submission
    con = _console()
    st, prov = _cluster_and_provider(cluster, provider)
    rows = submission.table(prov.store(st))
    hourly = prov.price(st.spec).hourly
    for r in rows:   # what the compute cost while the run ran, at the catalog price of the cluster's type
        d = r["duration"]
        r["cost_usd"] = round(d / 3600 * hourly, 4) if isinstance(d, float) and hourly is not None else None
    if as_json:
        con.print_json(rows)
        return
    con.print_table(["id", "job", "state", "started", "duration", "exit", "cost", "step", "loss", "loss curve"],
                    [[r["id"], r["name"], r["state"], r["started"],
                      "" if r["duration"] is None else f"{r['duration']:.0f}s",
                      "" if r["exit_code"] is None else r["exit_code"],
                      "" if r["cost_usd"] is None else f"${r['cost_usd']:.2f}",
                      "" if r["step"] is None else r["step"],
                      "" if r["loss"] is None else f"{r['loss']:.4f}", r["loss_curve"]] for r in rows])


@app.command()
def cancel(run_id: str = typer.Argument(..., help="Run id."), cluster: Optional[str] = CLUSTER,
           provider: Optional[str] = PROVIDER) -> None:
    """Ask the agent to stop a run (SIGTERM, then SIGKILL after a grace period)."""
    from . import submission
    st, prov = _cluster_and_provider(cluster, provider)
    submission.cancel(prov.store(st), run_id)
    _console().err.print(f"cancel of run {run_id} requested")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def agent(ctx: typer.Context, store: str = typer.Option(..., "--store", help="gs://bucket or a directory.")) -> None:
    """Run the host agent (what the startup script runs; also `python -m tpuctl.agent`)."""
    from .agent import main as agent_main
    agent_main(["--store", store, *ctx.args])


@app.command()
def version() -> None:
    """Print tpuctl's version."""
    print(__version__)


def _debug_log(exc: BaseException) -> str:
    from .state import home
    path = home() / "debug.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write("".join(traceback.format_exception(exc)))
    except OSError:
        return ""
    return str(path)


def _is_parser_error(e: BaseException) -> bool:
    """typer's command-line parser errors (raised from typer's own copy of click, so not click's classes: matched
    by what they offer instead of by importing click)."""
    return callable(getattr(e, "format_message", None)) and isinstance(getattr(e, "exit_code", None), int)


def _usage_error(e: BaseException) -> None:
    message = str(getattr(e, "format_message")())
    if type(e).__name__ == "NoArgsIsHelpError":   # `tpuctl` alone: the help, and success
        print(message)
        sys.exit(ExitCode.OK)
    ctx = getattr(e, "ctx", None)
    where = getattr(ctx, "command_path", "") or "tpuctl"
    _console().print_error(message.strip().splitlines()[0] if message.strip() else "bad usage",
                           f"`{where} --help` lists {'its options' if ' ' in where else 'the commands'}")
    sys.exit(int(getattr(e, "exit_code")))


def main(argv: Optional[List[str]] = None) -> None:
    # State, the debug log, the local store and what the local agent unpacks may hold a job's [env] secrets:
    # everything tpuctl creates is private to its user (dirs 0700, files 0600).
    os.umask(0o077)
    try:
        rc = app(args=argv, standalone_mode=False, prog_name="tpuctl")  # a typer.Exit comes back as its code
        sys.exit(rc if isinstance(rc, int) else 0)
    except TpuctlError as e:
        if e.kind is not ErrorKind.INPUT:
            _debug_log(e)
        _console().print_error(e.message, e.hint)
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        _console().print_error("interrupted", "")
        sys.exit(ExitCode.INTERRUPTED)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # noqa: BLE001 - the last line of defence: a message, not a traceback
        if _is_parser_error(e):
            _usage_error(e)
        path = _debug_log(e)
        if os.environ.get("TPUCTL_DEBUG"):
            traceback.print_exc()
        _console().print_error(f"internal error: {type(e).__name__}: {e}",
                               f"details in {path}; please report it" if path else "please report it")
        sys.exit(ExitCode.ERROR)
