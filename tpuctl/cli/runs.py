"""The commands that start and stop runs: submit (and its dry run), notebook, cancel; ssh to a run's host; following
a run's log (submit and logs). Registered on the app when clusters.py imports this module; what a run shows (logs,
download, tensorboard, jobs) is results.py's."""
from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, List, Optional

import typer

from .common import (CLUSTER, PROVIDER, app, check_run_ids, check_worker, cluster_and_provider, cluster_name,
                     console, interrupted)
from .parsing import PassOnCommand, ShellCommand
from ..core.errors import ErrorKind, ExitCode, TpuctlError, bad_input

if TYPE_CHECKING:
    from ..core.jobspec import JobSpec
    from ..core.models import ClusterState
    from ..providers.base import Provider
    from ..core.store import BlobStore


def follow_run(store: "BlobStore", run_id: str, st0: "ClusterState", prov: "Provider", worker: int = 0,
               follow: bool = True, give_up_after: float = 900.0,
               all_hosts: list[tuple[int, str]] | None = None) -> int:
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
    finally:
        if remote is not None:   # a `watch` need not wait for this follower's lease to lapse
            remote.let_go(run_id)
    if follow:
        code = st.exit_code
        con = console()
        if _has_outputs(store, run_id):   # a run that wrote nothing has nothing to fetch
            con.err.print(f"outputs: {store.local_path(layout.run_output(run_id))}/  "
                          f"fetch them: tpuctl download {run_id} -c {cluster}")
        # last, and saying whose code it is: the job's own 2 is not tpuctl's "bad input" (issue 52; a script tells
        # them apart by the run's state: docs/troubleshooting.md)
        con.err.print(f"run {run_id} {st.state.value}"
                      + (f" (job exit code {code})" if code is not None else
                         f" (no job exit code: tpuctl exits {int(ExitCode.ERROR)})")
                      + (f": {st.note}" if st.state is runs.RunState.ENDED and st.note else ""))
        return code if code is not None else int(ExitCode.ERROR)
    return int(ExitCode.OK)


def _has_outputs(store: "BlobStore", run_id: str) -> bool:
    """Whether the run wrote any output; True when the store cannot say (the run's end and its code matter more
    than a hint, and the download may still work)."""
    from ..core import layout
    try:
        return bool(store.list(layout.run_output(run_id) + "/", limit=1))
    except (TpuctlError, OSError):
        return True


@app.command(cls=PassOnCommand)
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
           no_compile_cache: bool = typer.Option(False, "--no-compile-cache", help="Give the job no persistent "
                                                 "JAX compilation cache (by default a restart loads the programs "
                                                 "the job compiled before: docs/recovery.md)."),
           max_restarts: Optional[int] = typer.Option(None, "--max-restarts", help="Restart the job up to N times "
                                                      "when it exits 42 (tpuctl.runtime.RESTART_CODE) or dies by a "
                                                      "signal tpuctl did not send, as xpk does (default 0; GKE: the "
                                                      "JobSet's maxRestarts, default 5, which node disruptions "
                                                      "count against too)."),
           stall_after: Optional[str] = typer.Option(None, "--stall-after", help="Call the run stalled when its "
                                                     "step (or, before its first step, its output) has not moved for "
                                                     "this long, e.g. 20m (10s and up; off: never). Default: the "
                                                     "larger of 15m and 10x the median step time, and 45m before "
                                                     "the first step (installs and the first compile)."),
           on_stall: str = typer.Option("restart", "--on-stall", help="What a stall does, after every host's "
                                        "stacks are saved (`tpuctl logs RUN --stacks`) and run.stalled is sent: "
                                        "notify (only), restart (a new attempt, within --max-restarts; then stop) "
                                        "or stop (the run ends `stalled`)."),
           notify_to: List[str] = typer.Option([], "--notify", help="Send this run's events to a webhook or "
                                               "Apprise URL (repeatable), besides the cluster's."),
           tpu_type: Optional[str] = typer.Option(None, "--type", help="GKE dry run without a cluster: the TPU type "
                                                  "of the manifest (--provider gke --manifest FILE)."),
           slices: Optional[int] = typer.Option(None, "--slices", help="GKE dry run: slices of the manifest."),
           manifest_file: Optional[str] = typer.Option(None, "--manifest", help="GKE, with --dry-run: write the "
                                                       "Kubernetes objects the run would create to FILE (YAML; - for "
                                                       "stdout)."),
           queue: Optional[str] = typer.Option(None, "--queue", help="GKE: the Kueue LocalQueue the run waits in "
                                               "(default: the namespace's only one, where the cluster runs Kueue)."),
           priority: Optional[str] = typer.Option(None, "--priority", help="GKE: the run's PriorityClass (Kueue "
                                                  "admits and preempts by it), e.g. medium."),
           namespace: Optional[str] = typer.Option(None, "--namespace", help="GKE: the Kubernetes namespace of the "
                                                   "run's JobSet and pods, and of its LocalQueue (default: the "
                                                   "cluster's, `up --namespace`, else default)."),
           provider: Optional[str] = PROVIDER) -> None:
    """Package JOB_DIR, sync its data, run it on the cluster and follow its logs; exits with the job's code.
    Arguments after `--` are appended to the job's command."""
    from ..core import jobspec
    from ..control import submission
    from ..core.notify import check_urls
    con = console()
    urls = check_urls(notify_to)
    stall = _stall_after(stall_after)
    if on_stall not in ("notify", "restart", "stop"):
        raise bad_input(f"--on-stall {on_stall!r} is not notify, restart or stop", "e.g. --on-stall stop")
    job = jobspec.load(job_dir, data)          # the job's own mistakes first, before any cluster is looked for
    say_left_out(job)                          # links out of the job are refused here too
    jobspec.check_launchable(job.command, list(ctx.args), job.env)   # what no host could start
    if no_compile_cache:
        job.env["TPUCTL_COMPILE_CACHE"] = "0"   # the host's switch (host/compilecache.py), also a job's own [env]
    if manifest_file is not None or tpu_type is not None or slices is not None:
        from ..providers.gke.runs import DEFAULT_RESTARTS
        _gke_manifest(job, cluster, provider, tpu_type, slices, DEFAULT_RESTARTS if max_restarts is None else
                      max_restarts, manifest_file, dry_run, queue, priority, namespace)
        offline = cluster is None and tpu_type is not None   # --provider gke --type: no local cluster looked up
        with contextlib.redirect_stdout(sys.stderr if manifest_file == "-" else sys.stdout):   # stdout: the YAML
            _submit_preview(job, None if offline else cluster, provider, offline=offline, pod_runs=True)
        return
    if dry_run:   # what the real submit refuses of this cluster, refused here too (issue 63.3)
        target = _dry_run_cluster(cluster, provider)
        if target is not None:
            _check_run_flags(*target, job, chain, keep_inputs, max_restarts, queue, priority, namespace)
        _submit_preview(job, cluster, provider)
        return
    st, prov = cluster_and_provider(cluster, provider)
    restarts = _check_run_flags(st, prov, job, chain, keep_inputs, max_restarts, queue, priority, namespace)
    with con.Reporter() as rep:
        if down:   # refused before the run exists when the host could not end the compute after it
            from ..control.up import arm
            arm(st, prov, lambda s: rep.resource("--down", "host", s))
        run_id, _ = submission.submit(st, prov, job, list(ctx.args), rep.transfer, rep, down_after=down,
                                      sessions=chain or 0, keep_inputs=keep_inputs, max_restarts=restarts,
                                      notify_urls=urls, queue=queue or "", priority=priority or "",
                                      stall_after=stall, on_stall=on_stall, namespace=namespace or "")
    if detach:
        print(run_id)
        return
    con.err.print(f"run {run_id} submitted; following its log (Ctrl-C stops following, not the run)")
    raise typer.Exit(follow_run(prov.store(st), run_id, st, prov, give_up_after=give_up_after))


@app.command()
def cancel(run_id: str = typer.Argument(..., help="Run id."), cluster: Optional[str] = CLUSTER,
           provider: Optional[str] = PROVIDER) -> None:
    """Ask the agent to stop a run (SIGTERM, then SIGKILL after a grace period)."""
    from ..control import submission
    check_run_ids(run_id)
    st, prov = cluster_and_provider(cluster, provider, run_id)
    store = prov.store(st)
    if prov.remote_runs is not None:
        rid = submission.resolve_run(store, run_id)
        prov.remote_runs.cancel(st, store, rid)
        console().err.print(f"run {rid} cancelled")
        return
    console().err.print(f"cancel of run {submission.cancel(store, run_id)} requested")


def say_left_out(job: "JobSpec") -> None:
    """What the package leaves out because `tpuctl download` wrote it (core/downloaded.py), said before anything is
    sent: outputs fetched into the job directory are never shipped back with it (issue 52)."""
    from ..core import packaging
    from ..core.sizes import human_bytes
    for d in packaging.left_out(job.root, job.data):
        where = "the job directory" if d.directory == "." else f"{d.directory}/"
        console().err.print(f"! left out of the package: {d.files} file{'s' * (d.files != 1)} "
                            f"({human_bytes(d.bytes)}) in {where} that `tpuctl download` wrote; list "
                            f"{'them' if d.directory == '.' else d.directory + '/'} in {job.root.name}/.tpuctlignore "
                            "to leave them out without this note", style="yellow", markup=False)


def _dry_run_cluster(cluster: Optional[str], provider: Optional[str]) -> "tuple[ClusterState, Provider] | None":
    """The cluster a dry run would submit to, when there is one to check against (a dry run needs none)."""
    from ..core import state
    try:
        name = cluster_name(cluster)
    except TpuctlError:   # several clusters and none named
        return None
    if state.load(name) is None:
        return None
    return cluster_and_provider(cluster, provider)


def _check_run_flags(st: "ClusterState", prov: "Provider", job: "JobSpec", chain: Optional[int], keep_inputs: bool,
                     max_restarts: Optional[int], queue: Optional[str], priority: Optional[str],
                     namespace: Optional[str] = None) -> int:
    """submit's flags against the cluster, offline: the real submit and its dry run ask the same; returns the
    restarts the run gets."""
    from ..control import submission
    if chain is not None and (prov.remote_runs is None or chain < 1):
        raise bad_input(f"--chain {chain}: " + ("must be at least 1" if prov.remote_runs else
                        f"cluster {st.name}'s runs do not run in sessions"),
                        "--chain applies to --provider kaggle clusters, e.g. --chain 5")
    if keep_inputs and prov.remote_runs is None:
        raise bad_input(f"--keep-inputs: cluster {st.name}'s runs have no input dataset to keep",
                        "--keep-inputs applies to --provider kaggle clusters")
    restarts = max_restarts if max_restarts is not None else \
        prov.remote_runs.default_restarts if prov.remote_runs is not None else 0
    _check_max_restarts(restarts, st, prov)
    submission.check_offline(st, prov, job, queue or "", priority or "", namespace or "")
    return restarts


def _stall_after(text: Optional[str]) -> float:
    """--stall-after in seconds: 0 (not given) for the default rule, -1 for off (host/stall.py)."""
    from ..core.lifecycle import parse_duration
    if text is None:
        return 0.0
    seconds = parse_duration(text, "--stall-after")
    if seconds == 0:
        return -1.0
    if seconds < 10:
        raise bad_input(f"--stall-after {text} is under 10 seconds", "e.g. --stall-after 20m (10s and up, or off)")
    return float(seconds)


def _check_max_restarts(n: int, st: "ClusterState", prov: "Provider") -> None:
    """--max-restarts is the host agent's to honour: a service's sessions (Kaggle) chain by CONTINUE_CODE instead."""
    if n < 0:
        raise bad_input(f"--max-restarts {n} must be 0 or more", "e.g. --max-restarts 3")
    if n and prov.remote_runs is not None and not prov.remote_runs.restarts:
        raise bad_input(f"--max-restarts: cluster {st.name}'s runs run in a service's sessions, not under tpuctl's "
                        "agent", "a job there continues in the next session by exiting tpuctl.runtime.CONTINUE_CODE")


def _gke_manifest(job: "JobSpec", cluster: Optional[str], provider: Optional[str], tpu_type: Optional[str],
                  slices: Optional[int], max_restarts: int, path: Optional[str], dry_run: bool, queue: Optional[str],
                  priority: Optional[str], namespace: Optional[str] = None) -> None:
    """`--manifest FILE` (with --type/--slices when no GKE cluster is named): the run's JobSet, written offline.
    With `--provider gke --type T` and no -c no local cluster is looked up (any there is of another run)."""
    from ..core import state
    if not dry_run:
        raise bad_input("--type, --slices and --manifest belong to a GKE dry run",
                        "tpuctl submit JOB --dry-run --provider gke --type v6e-16 --manifest run.yaml")
    from ..providers.gke import dryrun, frameworks
    frameworks.check_job(job.name, job.framework, job.env, job.keras_backend)
    if path is None:
        return   # `--dry-run --provider gke --type T`: the plan alone, no manifest asked for (issue 63.5)
    if cluster is None and tpu_type is not None:
        name, st = dryrun.NO_CLUSTER, None
    else:
        name = cluster_name(cluster)
        st = state.load(name)
    n = dryrun.write(path, name, st, cluster is not None, provider, tpu_type, slices, max_restarts, queue or "",
                     priority or "", namespace or "")
    console().err.print(f"wrote {n} Kubernetes object{'s' * (n > 1)} to "
                        f"{'stdout' if path == dryrun.STDOUT else path}")


def _keras_backend(job: "JobSpec", store: "Optional[BlobStore]") -> str:
    """A Keras job's backend as its host would pick it (core/backends.py) from the cluster's record: forced, or from
    the runtime, or (this machine) whether TensorFlow imports here; TensorFlow is installed for it only on that
    backend, which the preview once promised a Keras job headed for JAX (issue 52.7)."""
    import importlib.util
    from ..core import backends, layout, runs
    name, where = backends.forced(job.env, job.keras_backend)
    if name:
        return f"keras    {name} (forced by {where})"
    record = runs.read_json(store, layout.CLUSTER_RECORD) if store is not None else None
    if not record:
        return ("keras    backend picked where the run runs: JAX on a base runtime, GPUs, Multislice, Kaggle and "
                "Colab; TensorFlow on a tpu-vm-tf runtime (docs/backends.md)")
    accelerator = str(record.get("tpu_type") or "cpu")
    name, why = backends.for_host(record, accelerator, importlib.util.find_spec("tensorflow") is not None)
    return f"keras    {name} ({why})"


def _submit_preview(job: "JobSpec", cluster: Optional[str], provider: Optional[str], offline: bool = False,
                    pod_runs: bool = False) -> None:
    """`offline`: no cluster is looked up; `pod_runs`: the run is a GKE pod's (what it runs said, not a TPU VM's)."""
    from ..core import state
    from ..control import submission
    con = console()
    try:
        name: Optional[str] = None if offline else cluster_name(cluster)
    except TpuctlError:   # several clusters and none named: a dry run needs none (everything is counted)
        name = None
    st = state.load(name) if name else None
    store = None
    if st is not None:
        try:
            store = cluster_and_provider(cluster, provider)[1].store(st)
        except TpuctlError as e:   # no credentials, say: still show what is known offline
            con.err.print(f"[yellow]! cannot compare with cluster {st.name}'s store: {e.message}[/]")
    large = submission.large_job_warning(job)   # as submit warns (issue 63.6)
    if large:
        con.err.print(f"! {large}", style="yellow", markup=False)
    with con.Reporter() as rep:
        p = submission.preview(job, store, lambda total: rep.transfer(total, "hash"))
    human = con.human_bytes
    print(f"job      {job.name}: {job.command}")
    backend = "" if pod_runs or job.framework.value != "keras" else _keras_backend(job, store)
    if pod_runs:
        from ..providers.gke.frameworks import POD_RUNS
        print(f"pod      {POD_RUNS}")
    elif backend:
        print(backend)
    if not pod_runs and job.tensorflow and (not backend or backend.startswith("keras    tensorflow")):
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


@app.command(cls=ShellCommand)
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


@app.command(cls=PassOnCommand)
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
    say_left_out(job)
    doc = nb.build(job, list(ctx.args), data_uri, embed_limit_mb)
    target = Path(output or f"{job.name}.ipynb")
    from .common import cannot_write, writable_dir
    if target.is_dir():
        raise bad_input(f"-o {target} is a folder", f"name the notebook file, e.g. -o {target / (job.name + '.ipynb')}")
    writable_dir(target.parent, "-o", target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)   # `-o out/job.ipynb` makes out/, as download -o does
        target.write_text(json.dumps(doc, indent=1))
    except OSError as e:
        raise cannot_write(e, target, "-o") from None
    console().err.print(f"[green]{target}[/]: {target.stat().st_size / 1e6:.1f} MB, the job, "
                        f"{'its data' if not data_uri else 'the data from ' + data_uri} and tpuctl inside; on Colab: "
                        "File, Upload notebook, Runtime, Change runtime type, v5e-1 TPU, Run all")
