"""The cluster commands: up, status, ls, down (and agent, version); entry.py is the entry point that runs them. The
run commands are in runs.py, what both share in common.py. Commands parse, call the flows (control/) and render; no
cloud logic here. Imports of google-cloud and the providers happen inside commands,
so `tpuctl --help` stays fast.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, List, Optional

import typer

from .. import __version__
from .common import (CLUSTER, PROJECT, PROVIDER, app, cluster_and_provider, cluster_name, console, declined,
                     interactive, settings)
from ..core.errors import ErrorKind, TpuctlError, bad_input

if TYPE_CHECKING:
    from ..core.models import ClusterSpec, ClusterState
    from ..providers.base import PlanRow, Provider, UpFlags

# GKE's own options of `up` (providers/gke/planning.py)
GKE_CLUSTER = typer.Option(None, "--gke-cluster", help="GKE: use this existing Standard cluster (never deleted by "
                           "down) instead of making tpuctl-CLUSTER.")
FLEX_START = typer.Option(False, "--flex-start", help="--api compute: flex-start VMs, ended after --max-duration "
                          "(at most 7d).")
# --api compute's own options of `up` (providers/gcp/compute/gce_requests.py)
FLEX_WAIT = typer.Option(None, "--flex-wait", help="--flex-start, one VM: how long it waits for capacity (default 1h, "
                         "90s to 2h) before Google deletes it and up tries the next zone.")
DISK_SIZE = typer.Option(None, "--disk-size", help="--api compute: boot disk size in GB (default 100).")
DISK_TYPE = typer.Option(None, "--disk-type", help="--api compute: boot disk type (default per TPU family: "
                         "hyperdisk-balanced for tpu7x and v6e, pd-balanced for v5p).")
INTERNAL_IPS = typer.Option(False, "--internal-ips", help="--api compute: no external IP on the TPU VMs (the "
                            "network needs Cloud NAT or Private Google Access).")
API = typer.Option(None, "--api", help="Google Cloud: tpu (the Cloud TPU API, default) or compute (Compute Engine "
                   "VMs and MIGs; always for tpu7x).")
RESERVATION = typer.Option(None, "--reservation", help="--api compute or GKE: the Compute Engine reservation (its "
                           "name) the TPU VMs or node pools consume.")
KUEUE = typer.Option(False, "--kueue", help="GKE: install Kueue (pinned, shipped with tpuctl) with a queue for the "
                    "node pools' TPUs and xpk's priority classes, so runs queue as on a team's cluster. With "
                    "--gke-cluster: only if that cluster has no Kueue, and down leaves it.")
NAMESPACE = typer.Option(None, "--namespace", help="GKE: the Kubernetes namespace of the cluster's runs and of "
                         "--kueue's LocalQueue (made if missing; default: default); submit and its dry run default "
                         "to it.")
KUBE_CONTEXT = typer.Option(None, "--kube-context", help="GKE: reach the cluster's Kubernetes API through this "
                            "kubeconfig context (default: GKE's endpoint and your Google credentials).")


@app.command()
def up(
    type_: Optional[str] = typer.Option(None, "--type", "-t", help="TPU type, e.g. v3-8, v5litepod-8 (or v5e-8: the "
                                        "same chips), v6e-4."),
    zone: List[str] = typer.Option([], "--zone", "-z", help="Zone; repeat or comma-separate to fail over on stockouts."),
    cluster: Optional[str] = CLUSTER,
    project: Optional[str] = PROJECT,
    arch: Optional[str] = typer.Option(None, "--arch", help="vm (TPU VM, default) or node (legacy TPU Node + VM)."),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="TPU runtime (vm) or TensorFlow version (node)."),
    spot: bool = typer.Option(False, "--spot", help="Spot/preemptible capacity: cheaper, can be reclaimed."),
    service_account: Optional[str] = typer.Option(None, "--service-account", help="Identity the TPU workload runs as."),
    bucket: Optional[str] = typer.Option(None, "--bucket", help="Bucket to use or create (default: PROJECT-tpuctl-CLUSTER)."),
    vm_type: Optional[str] = typer.Option(None, "--vm-type", help="Machine type of the legacy node's VM."),
    network: Optional[str] = typer.Option(None, "--network", help="VPC network of the TPU and its VMs (default)."),
    subnetwork: Optional[str] = typer.Option(None, "--subnetwork", help="Subnetwork, in the TPU's region."),
    create_firewall: bool = typer.Option(False, "--create-firewall", help="--network: make the hosts' firewall rule."),
    framework: Optional[str] = typer.Option(None, "--framework",
                                            help="tensorflow (default: TF runtimes), jax or pytorch (base runtimes)."),
    autostop: Optional[str] = typer.Option(None, "--autostop",
                                           help="End the compute after this long with no run (90s, 30m, 2h, 1d, off)."),
    max_duration: Optional[str] = typer.Option(None, "--max-duration",
                                               help="End the compute this long after it was made (30m, 8h, 1d, off)."),
    queued: bool = typer.Option(False, "--queued", help="Ask through a queued resource: waits for capacity."),
    valid_until: Optional[str] = typer.Option(None, "--valid-until",
                                              help="How long a --queued request may wait (2h, 1d) before it expires."),
    flex_start: bool = FLEX_START,
    flex_wait: Optional[str] = FLEX_WAIT,
    disk_size: Optional[int] = DISK_SIZE,
    disk_type: Optional[str] = DISK_TYPE,
    internal_ips: bool = INTERNAL_IPS,
    api: Optional[str] = API,
    slices: Optional[int] = typer.Option(None, "--slices", help="Multislice: N slices of --type (v4 or newer), one "
                                         "run across them (JAX, PyTorch); GKE: one node pool each."),
    gke_cluster: Optional[str] = GKE_CLUSTER,
    image: Optional[str] = typer.Option(None, "--image", help="GKE: the container image the run's pods start from."),
    reservation: Optional[str] = RESERVATION,
    kube_context: Optional[str] = KUBE_CONTEXT,
    kueue: bool = KUEUE,
    namespace: Optional[str] = NAMESPACE,
    recover: bool = typer.Option(False, "--recover", help="Arm recovery: `tpuctl watch` re-creates a preempted TPU."),
    max_recoveries: Optional[int] = typer.Option(None, "--max-recoveries", help="Re-creates allowed (default 5)."),
    recover_for: Optional[str] = typer.Option(None, "--recover-for", help="Stop recovering after this long (1d)."),
    watcher: Optional[str] = typer.Option(None, "--watcher", help="Where the watcher runs: local (default)."),
    notify_to: List[str] = typer.Option([], "--notify", help="Send the cluster's events to this webhook or Apprise URL."),
    budget: Optional[str] = typer.Option(None, "--budget", help="The most its compute may cost, in USD (off)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and print the plan; create nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    provider: Optional[str] = PROVIDER,
) -> None:
    """Create (or adopt) a TPU, a bucket in its region, and the bucket permissions its workload needs."""
    from ..providers import registry
    from ..providers.base import UpFlags
    from ..core import state
    con = console()
    prior = state.load(cluster_name(cluster, pick=False))   # `up -c NAME` again: its provider, unless given
    prov = registry.get(settings().provider(provider or (prior.spec.provider.value if prior else None)))
    flags = UpFlags(tpu_type=type_, zones=zone, project=project, arch=arch,
                    runtime=runtime, spot=spot, service_account=service_account, bucket=bucket, vm_type=vm_type,
                    framework=framework, queued=queued, valid_until=valid_until, flex_start=flex_start,
                    slices=slices, network=network, subnetwork=subnetwork, gke_cluster=gke_cluster, image=image,
                    reservation=reservation, kube_context=kube_context, create_firewall=create_firewall, kueue=kueue,
                    namespace=namespace, api=api, flex_wait=flex_wait, disk_size=disk_size, disk_type=disk_type,
                    internal_ips=internal_ips)
    if prior and prior.spec.provider is prov.name:
        flags.remember(prior.spec)
    # Everything below up to the plan is checked alike with and without --dry-run, before a line is printed: the
    # dry run refuses what `up` refuses (issue 63.3)
    spec, lifecycle_notes = _spec(prov, prior, cluster_name(cluster, pick=False), flags, autostop, max_duration,
                                  provider)
    from .recovery import RecoverFlags, arm as arm_recovery, plan as recovery_plan
    recovery = RecoverFlags.parse(recover, max_recoveries, recover_for, watcher)
    rows = prov.plan(spec)   # a provider refuses here what only the whole spec shows (--flex-start's duration)
    price = prov.price(spec)
    recovery_lines = recovery_plan(spec, prov, recovery)
    from .notices import after_up, before_up
    notices = before_up(spec, prov, prior, budget, notify_to)
    _show_plan(con, spec, rows, _price_text(price), lifecycle_notes + recovery_lines)
    notices.show()
    if dry_run:
        con.err.print("dry run: nothing was created")
        return
    state.remember_provider(prov.name.value)   # a failed `up` still tells the hints which provider is in use
    warnings = prov.preflight(spec)   # no credentials or permissions: say so now, not after a yes
    if recovery.on_vm and prov.watcher_host is not None:
        warnings += prov.watcher_host.check(spec)
    for warning in warnings:
        con.err.print(f"! {warning}", style="yellow", markup=False)
    costs_money = price.hourly != 0.0
    if costs_money and interactive() and not yes and not con.confirm("Create these resources?"):
        declined()
    st = _create(con, spec, prov, prior, lambda made: after_up(made, prov, notices))
    if recovery.recover:
        arm_recovery(st, prov, recovery)
    con.err.print(f"next: tpuctl submit JOB_DIR -c {st.name}    when done: tpuctl down -c {st.name}")


def _create(con: Any, spec: "ClusterSpec", prov: "Provider", prior: "ClusterState | None",
            after: "Callable[[ClusterState], None]") -> "ClusterState":
    """up's making, under the cluster's lock (and the watcher's lease on a cluster made before), then autostop."""
    from ..control import up as up_flow
    from ..control.watch import CommandLease
    from ..core.locks import cluster_lock
    from contextlib import nullcontext
    say = lambda m: con.err.print(f"[yellow]! {m}[/]")  # noqa: E731
    with cluster_lock(spec.name, "up", say), con.Reporter() as rep, \
            (CommandLease(prior, prov, "up", say) if prior else nullcontext()):
        st = up_flow.up(spec, prov, rep)
        after(st)
        if spec.autostop or spec.max_duration:
            who = up_flow.arm(st, prov, lambda s: rep.resource("autostop", "host", s))
            rep.resource("autostop", "host", f"armed: enforced by {who}", final=True)
    con.err.print(f"[green]cluster {st.name} ready[/]: {prov.location(st)}, store {st.spec.store}")
    return st


@app.command()
def status(cluster: Optional[str] = CLUSTER,
           as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
           provider: Optional[str] = PROVIDER) -> None:
    """Show a cluster's resources as the cloud reports them now."""
    con = console()
    st, prov = cluster_and_provider(cluster, provider)
    from ..control import status as status_flow
    info: dict[str, Any] = status_flow.status(st, prov)   # values of several shapes, keyed as status documents
    if as_json:
        con.print_json(info)
        return
    # `v is False`, not `v in (False, ...)`: 0.0 == False, and $0.00 spent is a figure to show (issue 40)
    rows = [[k, "yes" if v is True else str(v)] for k, v in info.items()
            if k not in ("grants", "resources", "problem", "fix", "recoveries") and v is not False
            and v not in ("", None)]
    rows += [[f"recovery {i}", r] for i, r in enumerate(info.get("recoveries", []), 1)]
    for kind, res in info["resources"].items():
        if kind in ("boot_logs", "workers"):
            for host, line in res.items():
                rows.append([f"{'boot' if kind == 'boot_logs' else 'agent'} {host}", line])
            continue
        _resource_row(rows, kind, res)
    for g in info["grants"]:
        rows.append(["grant", g])
    con.print_table(["field", "value"], rows)
    if info["problem"]:
        con.err.print(f"[bold red]! {info['problem']}[/]")
    if info["fix"]:
        con.err.print(f"[dim]fix:[/] {info['fix']}" if info["problem"] else f"[dim]{info['fix']}[/]")


def _resource_row(rows: list[list[str]], kind: str, res: dict[str, Any]) -> None:
    """A resource's row, or, when a row of that name is there already (the local store: its path, then its
    state), what the resource adds to that row: one row per name."""
    mine = next((r for r in rows if r[0] == kind), None)
    fields = [f"{k}={v}" for k, v in res.items() if v not in ("", None) and (mine is None or str(v) != mine[1])]
    if mine is None:
        rows.append([kind, " ".join(fields)])
    elif fields:
        mine[1] += f" ({' '.join(fields)})"


@app.command("ls")
def ls_(as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
        project: Optional[str] = PROJECT) -> None:
    """List clusters in local state and every tpuctl-labelled TPU in the project (orphans flagged)."""
    from ..providers import registry
    from ..core.models import ProviderName
    con = console()
    from ..control import inventory
    rows = inventory.ls([registry.get(p) for p in ProviderName], settings().project(project),
                      lambda m: con.err.print(f"[yellow]! {m}[/]"))
    if as_json:
        con.print_json(rows)
        return
    if not rows:   # the way the user makes clusters, not always Google Cloud's (issue 52)
        from ..core.state import how_to_make
        con.err.print(f"no clusters here; {how_to_make('NAME', 'one')}", markup=False)
        return
    def note(r: dict[str, object]) -> str:
        if r["orphan"]:
            return f"ORPHAN {r['kind']} {r['name']}: no local state; remove: {r['remove']}"
        if r.get("past_deadline"):
            return f"PAST ITS DEADLINE ({r['past_deadline']}) and still billing: {r['remove']}"
        if r["phase"] == "down":
            kept = f"{con.human_bytes(int(str(r['store_bytes'])))} kept" if r["store_bytes"] is not None else "kept"
            return f"{kept}; --delete-bucket on down removes it"
        return "; ".join(str(x) for x in (r.get("watcher"), r.get("orphan_data")) if x)
    spend = any(r.get("budget") for r in rows)   # the column only when some cluster has a budget
    con.print_table(["cluster", "provider", "type", "zone", "state", "store"] + ["budget"] * spend + ["note"],
                    [[r["cluster"], r["provider"], r["type"], r["zone"], r["phase"], r["store"]]
                     + [str(r.get("budget", ""))] * spend + [note(r)] for r in rows],
                    keep=("cluster",), drop=("store", "provider", "zone", "type"))


@app.command()
def down(cluster: Optional[str] = CLUSTER,
         delete_bucket: bool = typer.Option(False, "--delete-bucket", help="Also delete the bucket and its contents."),
         yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
         project: Optional[str] = typer.Option(None, "--project",
                                               help="Without local state: find the cluster by its labels here."),
         provider: Optional[str] = PROVIDER) -> None:
    """Delete what `up` made: TPU, VM, the grants it added; the bucket only with --delete-bucket."""
    from ..core.models import Phase
    con = console()
    try:
        st, prov = cluster_and_provider(cluster, provider)
    except TpuctlError as e:
        if e.kind is not ErrorKind.NOT_FOUND:
            raise
        name = cluster_name(cluster)
        st, prov = _from_labels(name, project, provider, TpuctlError(e.kind, e.message, _not_here(name, project)))
    already = st.phase is Phase.DOWN
    if already and not delete_bucket:
        from ..control.down import remove_orphans
        with con.Reporter() as rep:
            remove_orphans(st, prov, rep)
        con.err.print(f"cluster {st.name} is already down; its {prov.store_noun} {st.spec.store} is kept "
                      f"(`tpuctl down -c {st.name} --delete-bucket` removes it)")
        return
    what = ", ".join(([] if already else prov.teardown_list(st))
                     + ([f"{len(st.grants)} bucket grants"] if st.grants else [])
                     + ([f"{prov.store_noun} {st.spec.store} and all its contents"] if delete_bucket else []))
    if not yes:
        if not interactive():
            raise bad_input(f"down would delete {what}; refusing without confirmation", "pass --yes")
        if not con.confirm(f"Delete {what}?"):
            declined()
    from ..control import down as down_flow
    from ..control.watch import CommandLease
    from ..core.locks import cluster_lock
    say = lambda m: con.err.print(f"[yellow]! {m}[/]")  # noqa: E731
    with cluster_lock(st.name, "down", say), con.Reporter() as rep, CommandLease(st, prov, "down", say):
        from ..core import state
        # as it is now (an `up` may have just run), or as found by its labels when there is no state
        down_flow.down(state.load(st.name) or st, prov, rep, delete_bucket)
    con.err.print(f"[green]cluster {st.name} is down[/]")


def _not_here(name: str, project: Optional[str]) -> str:
    """`down -c NAME` of a cluster this machine does not know: what to check, never how to make it (issue 52)."""
    from ..core.state import cluster_names, providers_used
    names = [n for n in cluster_names() if n != name]
    said = "check the name: `tpuctl ls` lists the clusters here" if names else "nothing here to take down"
    used = providers_used()
    if used and not used & {"gcp", "gke"}:   # only this machine's or Kaggle's: no project holds one
        return said
    return said + ("; one made on another machine: `tpuctl down -c " + name + " --project PROJECT` finds it by its "
                   "labels" if not project else f"; `tpuctl ls --project {project}` lists what carries tpuctl's label")


def _from_labels(name: str, project: Optional[str], provider: Optional[str],
                 missing: TpuctlError) -> "tuple[ClusterState, Provider]":
    """No local state: the cluster as its labelled resources describe it (ls names this way for orphans)."""
    from ..providers import registry
    prov = registry.get(settings().provider(provider))
    proj = settings().project(project)
    if prov.inventory is None or not proj:
        raise missing
    from ..control import inventory
    st = inventory.from_labels(name, proj, prov)
    if st is None:
        raise TpuctlError(ErrorKind.NOT_FOUND, f"no cluster named {name!r}, here or labelled in project {proj}",
                          "`tpuctl ls --project P` lists what carries tpuctl's label")
    console().err.print(f"no local state for {name}: found by its labels in project {proj}")
    return st, prov


def _price_text(price: Any) -> str:
    """The catalog's price, or TPUCTL_PRICE_PER_HOUR where it is set: what every cost and the budget count at (the
    plan said "cost free" for a local cluster whose budget counted $2/hour)."""
    from ..core import budget
    hourly = budget.hourly(price.hourly)
    return price.text if hourly == price.hourly else f"${hourly:.2f}/hour (TPUCTL_PRICE_PER_HOUR)"


def _show_plan(con: Any, spec: "ClusterSpec", rows: "list[PlanRow]", price: str, recovery: list[str]) -> None:
    """up's plan: what it makes and where, what it costs, what ends it, what recovers it."""
    from ..core.lifecycle import show_duration
    con.err.print(f"[bold]Plan for cluster {spec.name}[/]" + (f" (project {spec.project}):" if spec.project else ":"))
    for row in rows:
        con.err.print(f"  {row.kind:<6} {row.name}  [dim]{row.where}[/]")
    con.err.print(f"  cost   {price} while it exists")
    if spec.autostop:
        con.err.print(f"  stop   the host ends the compute after {show_duration(spec.autostop)} with no run")
    if spec.max_duration:
        con.err.print(f"  stop   the host ends the compute {show_duration(spec.max_duration)} after it is made")
    for line in recovery:
        con.err.print(f"  {line}")


def _spec(prov: "Provider", prior: "ClusterState | None", name: str, flags: "UpFlags", autostop: Optional[str],
          max_duration: Optional[str], provider: Optional[str]) -> "tuple[ClusterSpec, list[str]]":
    """up's spec from its flags and the config, refused where an existing cluster of that name is something else;
    with the plan's lines for limits given as off."""
    try:
        spec = prov.make_spec(name, flags)
    except TpuctlError as e:   # `up -c NAME --type ...` where NAME is a local cluster: the name is the mistake
        if prior is None or provider or "apply to" not in e.message:
            raise
        raise bad_input(f"cluster {name} already exists (provider {prior.spec.provider.value}), and {e.message}",
                        f"to make another cluster, name it: `tpuctl up -c OTHER ...`; to replace this one, "
                        f"`tpuctl down -c {name}` first") from None
    notes = _lifecycle(spec, autostop, max_duration)
    if prior:
        from ..control.up import check_compatible
        check_compatible(spec, prior)   # an existing cluster's name with other flags (another provider, type, ...)
    return spec, notes


def _lifecycle(spec: "ClusterSpec", autostop: Optional[str], max_duration: Optional[str]) -> list[str]:
    """--autostop / --max-duration (or the config's autostop / max_duration); when neither is given on a re-run,
    the cluster keeps what it had. Returns the plan's lines for a limit given as 0 or off (issue 63.3: `--max-duration
    0` is no limit, said so rather than left silent)."""
    from ..core import state
    from ..core.lifecycle import parse_duration
    prior = state.load(spec.name)
    cfg = settings()
    notes = []
    for attr, flag, key, value, what in (
            ("autostop", "--autostop", "autostop", autostop, "nothing ends an idle host"),
            ("max_duration", "--max-duration", "max_duration", max_duration, "no deadline")):
        given = cfg.setting(key, value, None)
        setattr(spec, attr, parse_duration(str(given), flag) if given is not None
                else (getattr(prior.spec, attr) if prior else 0))
        if given is not None and not getattr(spec, attr):
            notes.append(f"stop   {what} ({flag} {given} turns it off): the compute runs until `tpuctl down`")
    return notes


from . import runs, results, recovery, notices, webui, drill  # noqa: E402,F401 - registers the run commands after the cluster ones (--help's order)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def agent(ctx: typer.Context, store: str = typer.Option(..., "--store", help="gs://bucket or a directory.")) -> None:
    """Run the host agent (what the startup script runs; also `python -m tpuctl.agent`)."""
    from ..agent import main as agent_main
    agent_main(["--store", store, *ctx.args])


@app.command()
def version() -> None:
    """Print tpuctl's version."""
    print(__version__)
