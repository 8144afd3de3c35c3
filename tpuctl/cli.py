"""typer commands: parse, load config, call the orchestrator, render. No cloud logic here.

Imports of google-cloud and the providers happen inside commands, so `tpuctl --help` stays fast.
"""
from __future__ import annotations

import os
import sys
import traceback
from typing import List, Optional

import typer

from . import __version__
from .errors import TpuctlError, bad_input

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Train TensorFlow jobs on Cloud TPUs (or this machine): up, submit, logs, down.",
                  context_settings={"help_option_names": ["-h", "--help"]})

CLUSTER = typer.Option(None, "--cluster", "-c", help="Cluster name (default: 'default').")
PROVIDER = typer.Option(None, "--provider", help="gcp (default) or local; also TPUCTL_PROVIDER.")
PROJECT = typer.Option(None, "--project", help="Google Cloud project id.")


def _config():
    from . import config   # lazily: tomllib and configparser are not needed to print help
    return config


def _cluster(flag: Optional[str]) -> str:
    from .models import check_cluster_name
    config = _config()
    return check_cluster_name(config.setting("cluster", flag, "default"))


def _console():
    from . import console
    return console


def _orch():
    from . import orchestrator
    return orchestrator


def _interactive() -> bool:
    return sys.stdin.isatty()


def _build_spec(name, provider, type_, zones, project, arch, runtime, spot, service_account, bucket, vm_type):
    from .catalog import DEFAULT_VM_TYPE, check_vm_type, check_zones, tpu_type
    config = _config()
    from .models import ClusterSpec, check_bucket_name, check_project, check_service_account, default_bucket
    spec = ClusterSpec(name=name, provider=provider)
    if provider == "local":
        from .providers.local import LocalProvider
        given = [f for f, v in (("--type", type_), ("--zone", zones), ("--project", project), ("--runtime", runtime),
                                ("--spot", spot), ("--service-account", service_account), ("--bucket", bucket),
                                ("--vm-type", vm_type), ("--arch", arch != "vm")) if v]
        if given:
            raise bad_input(f"{', '.join(given)} do not apply to --provider local",
                            "the local provider runs on this machine: `tpuctl up --provider local -c NAME`")
        spec.bucket = str(LocalProvider.root(name))
        return spec
    if not type_:
        raise bad_input("--type is required", "for example: tpuctl up --type v3-8 --zone us-central1-b")
    t = tpu_type(type_)
    if arch not in ("vm", "node"):
        raise bad_input(f"unknown --arch {arch!r}", "use --arch vm (TPU VM, default) or --arch node (legacy)")
    if arch == "node" and not t.node_arch:
        raise bad_input(f"TPU Nodes (--arch node) were never offered for {t.family}", "use --arch vm")
    flat = [z.strip() for item in (zones or []) for z in item.split(",") if z.strip()]
    if not flat and config.setting("zone", None):
        flat = [config.setting("zone", None)]
    spec.tpu_type, spec.arch, spec.zones = t.name, arch, check_zones(t, flat)
    spec.runtime, spec.spot = runtime or "", spot
    spec.project = check_project(config.project(project))
    spec.service_account = check_service_account(service_account) if service_account else ""
    spec.bucket = check_bucket_name(bucket or default_bucket(spec.project, name))
    spec.vm_type = check_vm_type(vm_type or DEFAULT_VM_TYPE) if arch == "node" else ""
    return spec


@app.command()
def up(
    type_: Optional[str] = typer.Option(None, "--type", "-t", help="TPU type, e.g. v3-8, v5litepod-8, v6e-4."),
    zone: List[str] = typer.Option([], "--zone", "-z", help="Zone; repeat or comma-separate to fail over on stockouts."),
    cluster: Optional[str] = CLUSTER,
    project: Optional[str] = PROJECT,
    arch: str = typer.Option("vm", "--arch", help="vm (TPU VM) or node (legacy TPU Node + companion VM)."),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="TPU runtime (vm) or TensorFlow version (node)."),
    spot: bool = typer.Option(False, "--spot", help="Spot/preemptible capacity: cheaper, can be reclaimed."),
    service_account: Optional[str] = typer.Option(None, "--service-account", help="Identity the TPU workload runs as."),
    bucket: Optional[str] = typer.Option(None, "--bucket", help="Bucket to use or create (default: PROJECT-tpuctl-CLUSTER)."),
    vm_type: Optional[str] = typer.Option(None, "--vm-type", help="Machine type of the legacy node's VM."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and print the plan; create nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    provider: Optional[str] = PROVIDER,
):
    """Create (or adopt) a TPU, a bucket in its region, and the bucket permissions its workload needs."""
    con = _console()
    prov = _config().provider(provider)
    spec = _build_spec(_cluster(cluster), prov, type_, zone, project, arch, runtime, spot, service_account,
                       bucket, vm_type)
    rows = _orch().plan(spec)
    con.err.print(f"[bold]Plan for cluster {spec.name}[/]" + (f" (project {spec.project}):" if spec.project else ":"))
    for kind, name, where in rows:
        con.err.print(f"  {kind:<6} {name}  [dim]{where}[/]")
    con.err.print(f"  cost   {_orch().price(spec)[1]} while it exists")
    if dry_run:
        con.err.print("dry run: nothing was created")
        return
    if prov == "gcp" and _interactive() and not yes and not con.confirm("Create these resources?"):
        raise typer.Exit(1)
    from . import providers
    with con.Reporter() as rep:
        st = _orch().up(spec, providers.get(prov, spec.project), rep)
    where = f"{st.tpu_type} in {st.zone}" if prov == "gcp" else "this machine"
    con.err.print(f"[green]cluster {st.name} ready[/]: {where}, store {st.store_uri}")
    con.err.print(f"next: tpuctl submit JOB_DIR -c {st.name}    when done: tpuctl down -c {st.name}")


@app.command()
def status(cluster: Optional[str] = CLUSTER,
           as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
           provider: Optional[str] = PROVIDER):
    """Show a cluster's resources as the cloud reports them now."""
    con = _console()
    st, prov = _cluster_and_provider(cluster, provider)
    info = _orch().status(st, prov)
    if as_json:
        con.print_json(info)
        return
    keys = ("cluster", "provider", "phase", "store", "price") if st.provider == "local" else \
        ("cluster", "provider", "project", "phase", "type", "arch", "zone", "runtime", "store", "price")
    rows = [[k, str(info[k])] for k in keys if info.get(k) not in ("", None)]
    for kind, res in info["resources"].items():
        if kind == "boot_logs":
            for host, line in res.items():
                rows.append([f"boot {host}", line])
            continue
        rows.append([kind, " ".join(f"{k}={v}" for k, v in res.items() if v not in ("", None))])
    for g in info["grants"]:
        rows.append(["grant", g])
    con.print_table(["field", "value"], rows)


@app.command("ls")
def ls_(as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
        project: Optional[str] = PROJECT):
    """List clusters in local state and every tpuctl-labelled TPU in the project (orphans flagged)."""
    con = _console()
    try:
        extra = _config().project(project, allow_adc=False)
    except TpuctlError:
        extra = ""

    def list_labelled(p):
        from .providers.gcp.provider import GcpProvider
        try:
            return GcpProvider(p).list_labelled()
        except TpuctlError as e:   # local clusters still list; say what could not be seen
            con.err.print(f"[yellow]! could not list TPUs in project {p}: {e.message}[/] ({e.hint})")
            return []
    rows = _orch().ls(list_labelled, extra)
    if as_json:
        con.print_json(rows)
        return
    if not rows:
        con.err.print("no clusters; make one with `tpuctl up --type v3-8 --zone us-central1-b`")
        return
    con.print_table(["cluster", "provider", "type", "zone", "state", "bucket", "note"],
                    [[r["cluster"], r["provider"], r["type"], r["zone"], r["phase"], r["bucket"],
                      "ORPHAN: no local state (tpuctl up -c NAME adopts it)" if r["orphan"] else ""] for r in rows])


@app.command()
def down(cluster: Optional[str] = CLUSTER,
         delete_bucket: bool = typer.Option(False, "--delete-bucket", help="Also delete the bucket and its contents."),
         yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
         provider: Optional[str] = PROVIDER):
    """Delete what `up` made: TPU, VM, the grants it added; the bucket only with --delete-bucket."""
    con = _console()
    st, prov = _cluster_and_provider(cluster, provider)
    what = ", ".join(x for x in (st.tpu_name and f"TPU {st.tpu_name}", st.vm_name and f"VM {st.vm_name}",
                                 st.provider == "local" and f"the local agent of {st.name}",
                                 st.grants and f"{len(st.grants)} bucket grants",
                                 delete_bucket and f"bucket {st.store_uri} and all its contents") if x)
    if not yes:
        if not _interactive():
            raise bad_input(f"down would delete {what}; refusing without confirmation", "pass --yes")
        if not con.confirm(f"Delete {what}?"):
            raise typer.Exit(1)
    with con.Reporter() as rep:
        _orch().down(st, prov, rep, delete_bucket)
    con.err.print(f"[green]cluster {st.name} is down[/]")


def _cluster_and_provider(cluster, provider):
    from . import providers
    st = _orch().load(_cluster(cluster))
    if provider and provider != st.provider:
        raise bad_input(f"cluster {st.name} uses provider {st.provider}, not {provider}", "drop --provider")
    return st, providers.get(st.provider, st.project)


def _follow(store, run_id: str, cluster: str, worker: int = 0, follow: bool = True) -> int:
    from . import runs
    out = sys.stdout.buffer

    def write(data: bytes):
        out.write(data)
        out.flush()
    try:
        st = runs.follow(store, run_id, write, worker=worker, follow=follow)
    except KeyboardInterrupt:
        _console().err.print(f"\nstopped following; run {run_id} continues. "
                             f"Reattach: tpuctl logs {run_id} -c {cluster} -f")
        raise typer.Exit(130)
    if follow:
        code = st.get("exit_code")
        _console().err.print(f"run {run_id} {st.get('state')}" + (f" (exit code {code})" if code is not None else ""))
        return code if isinstance(code, int) else 1
    return 0


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(ctx: typer.Context,
           job_dir: str = typer.Argument(..., help="Directory holding tpuctl.toml."),
           cluster: Optional[str] = CLUSTER,
           data: List[str] = typer.Option([], "--data", help="Extra data path to sync (repeatable)."),
           detach: bool = typer.Option(False, "--detach", "-d", help="Print the run id and return at once."),
           provider: Optional[str] = PROVIDER):
    """Package JOB_DIR, sync its data, run it on the cluster and follow its logs; exits with the job's code.
    Arguments after `--` are appended to the job's command."""
    from . import jobspec, submission
    con = _console()
    st, prov = _cluster_and_provider(cluster, provider)
    job = jobspec.load(job_dir, data)
    with con.Reporter() as rep:
        run_id, _ = submission.submit(st, prov, job, list(ctx.args), rep.transfer, rep)
    if detach:
        print(run_id)
        return
    con.err.print(f"run {run_id} submitted; following its log (Ctrl-C stops following, not the run)")
    raise typer.Exit(_follow(prov.store(st), run_id, st.name))


@app.command()
def logs(run_id: Optional[str] = typer.Argument(None, help="Run id (default: the latest run)."),
         cluster: Optional[str] = CLUSTER,
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep following until the run ends."),
         worker: int = typer.Option(0, "--worker", help="Worker of a multi-host slice (0 is the primary log)."),
         provider: Optional[str] = PROVIDER):
    """Print a run's output, raw, on stdout."""
    from . import submission
    st, prov = _cluster_and_provider(cluster, provider)
    store = prov.store(st)
    rid = submission.resolve_run(store, run_id)
    raise typer.Exit(_follow(store, rid, st.name, worker, follow))


@app.command()
def jobs(cluster: Optional[str] = CLUSTER,
         as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
         provider: Optional[str] = PROVIDER):
    """List the cluster's runs: id, job, state, start, duration, exit code."""
    from . import submission
    con = _console()
    st, prov = _cluster_and_provider(cluster, provider)
    rows = submission.table(prov.store(st))
    if as_json:
        con.print_json(rows)
        return
    con.print_table(["id", "job", "state", "started", "duration", "exit"],
                    [[r["id"], r["name"], r["state"], r["started"],
                      "" if r["duration"] is None else f"{r['duration']:.0f}s",
                      "" if r["exit_code"] is None else r["exit_code"]] for r in rows])


@app.command()
def cancel(run_id: str = typer.Argument(..., help="Run id."), cluster: Optional[str] = CLUSTER,
           provider: Optional[str] = PROVIDER):
    """Ask the agent to stop a run (SIGTERM, then SIGKILL after a grace period)."""
    from . import submission
    st, prov = _cluster_and_provider(cluster, provider)
    submission.cancel(prov.store(st), run_id)
    _console().err.print(f"cancel of run {run_id} requested")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def agent(ctx: typer.Context, store: str = typer.Option(..., "--store", help="gs://bucket or a directory.")):
    """Run the host agent (what the startup script runs; also `python -m tpuctl.agent`)."""
    from .agent import main as agent_main
    agent_main(["--store", store, *ctx.args])


@app.command()
def version():
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


def main(argv: Optional[list] = None) -> None:
    try:
        rc = app(args=argv, standalone_mode=False)  # a typer.Exit comes back as its code here
        sys.exit(rc if isinstance(rc, int) else 0)
    except TpuctlError as e:
        if e.kind != "input":
            _debug_log(e)
        _console().print_error(e.message, e.hint)
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        _console().print_error("interrupted", "")
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # noqa: BLE001 - the last line of defence: a message, not a traceback
        import click
        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(e.exit_code)
        path = _debug_log(e)
        if os.environ.get("TPUCTL_DEBUG"):
            traceback.print_exc()
        _console().print_error(f"internal error: {type(e).__name__}: {e}",
                               f"details in {path}; please report it" if path else "please report it")
        sys.exit(1)
