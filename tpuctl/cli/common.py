"""The typer app and what every command shares: the common options, where settings and the cluster come from,
and lazy access to the console (so `tpuctl --help` imports no rich). The commands are in clusters.py and
runs.py; tpuctl.cli.main is the entry point. The flows they call (control/) are imported inside each command."""
from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, Optional

import typer
from typer.core import TyperGroup

from .. import __version__
from ..core.errors import ErrorKind, ExitCode, TpuctlError, bad_input

if TYPE_CHECKING:
    from pathlib import Path

    from ..core.models import ClusterState
    from ..providers.base import Provider


class Group(TyperGroup):
    """A typer group whose own flags that were not given read False without typer's parameter coercion.

    typer 0.29 coerces every parameter value through a pydantic TypeAdapter (typer/core.py
    _TyperParameter.process_value, typer/_coercion.py build_runtime_param, which imports typer/_adapters.py and so
    pydantic), skipping only "bool flags that already yield bools". A group's --help, --install-completion and
    --show-completion have no default (None), so `tpuctl COMMAND --help` imported pydantic for the group's unset
    flags: ~120 ms of CPU, double the cost of `tpuctl --help`. False is what an unset flag means to their callbacks
    (each returns at once on a false value), and a bool skips the coercion. `cls=` is typer's documented way to give
    an app its own group class (typer/main.py, Typer's `cls` parameter: "should be a subtype of TyperGroup")."""

    def get_params(self, ctx: Any) -> list[Any]:   # typer's own copy of click's Context and Parameter
        params = super().get_params(ctx)
        for p in params:
            if getattr(p, "is_flag", False) and p.default is None:
                p.default = False
        return params


# `tpuctl --help`'s summary: every provider and framework (issue 40: it named TensorFlow and Cloud TPUs alone).
SUMMARY = ("Train TensorFlow, JAX or PyTorch jobs on TPUs: Google Cloud (gcp), GKE (gke), Kaggle (kaggle), Colab "
           "(`tpuctl notebook`) or this machine (local). Start with up, submit, logs, down.")
app = typer.Typer(cls=Group, add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help=SUMMARY,
                  context_settings={"help_option_names": ["-h", "--help"]})


def command() -> Any:
    """The command tree typer builds from `app` (what `--help` prints from), with plain metavars."""
    import typer.main
    from .parsing import plain_metavars
    root = typer.main.get_command(app)
    plain_metavars(root)
    return root


def _cluster_names(incomplete: str) -> list[str]:
    """Shell completion of -c: the clusters in local state (file names only: nothing is parsed or asked)."""
    from ..core.state import cluster_names
    return [n for n in cluster_names() if n.startswith(incomplete)]


CLUSTER = typer.Option(None, "--cluster", "-c", help="Cluster name (default: the config's, else 'default' or the "
                       "only one there is).",
                       autocompletion=_cluster_names)
PROVIDER = typer.Option(None, "--provider", help="gcp (default), local, kaggle or gke; also TPUCTL_PROVIDER.")
PROJECT = typer.Option(None, "--project", help="Google Cloud project id.")


def _print_version(value: bool) -> None:
    if value:
        print(f"tpuctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_print_version,
                                       help="Print tpuctl's version and exit.")) -> None:
    """Train TensorFlow, JAX or PyTorch jobs on TPUs: Google Cloud (gcp), GKE (gke), Kaggle (kaggle), Colab
    (`tpuctl notebook`) or this machine (local). Start with up, submit, logs, down."""


def settings() -> ModuleType:
    from ..core import config   # lazily: tomllib and configparser are not needed to print help
    return config


def cluster_name(flag: Optional[str], pick: bool = True) -> str:
    """-c, else the `cluster` setting (TPUCTL_CLUSTER, the config file), else, when `pick`, the cluster there is:
    `default` if it exists, else the only one (said on stderr, once), else the one line listing them. `up` does not
    pick: without -c it makes (or re-makes) `default`."""
    from ..core.models import check_cluster_name
    if flag == "":
        raise bad_input("empty cluster name (-c \"\")", "drop -c to use the cluster 'default', or name one: -c bert")
    name = settings().setting("cluster", flag, None)
    return check_cluster_name(name if name is not None else _the_cluster() if pick else "default")


_said: set[str] = set()


def _the_cluster() -> str:
    from ..core.state import cluster_names, live_cluster_names
    names = cluster_names()
    if not names or "default" in names:
        return "default"   # none: `no cluster named 'default'`, whose hint says how to make one
    live = live_cluster_names()   # a cluster taken down (its state kept) is no one's default (issue 63.5)
    only = "the only one here" if not live or len(live) == len(names) else "the only one here not down"
    names = live if live else names
    if len(names) > 1:
        raise bad_input(f"no -c, and {len(names)} clusters here: {', '.join(names)}",
                        f"name one (-c {names[0]}), or set one for every command: TPUCTL_CLUSTER={names[0]} or "
                        "`cluster = \"NAME\"` in ~/.config/tpuctl/config.toml")
    if names[0] not in _said:
        _said.add(names[0])
        console().err.print(f"using cluster {names[0]}, {only} (-c NAME picks another)", style="dim", markup=False)
    return names[0]


def forget_said() -> None:
    """A new command in the same process (the tests' in-process CLI) says which cluster it uses again."""
    _said.clear()


def check_run_ids(*run_ids: Optional[str]) -> None:
    """A run id given empty or blank is a usage error, never "the latest run": `tpuctl cancel "$RUN"` with RUN unset
    in a script must not cancel whatever ran last. Checked before the cluster is looked up."""
    for run_id in run_ids:
        if run_id is not None and not run_id.strip():
            raise bad_input(f"empty run id ({run_id!r})", "give a run id (`tpuctl jobs` lists them), or leave it "
                            "out where the command takes the latest run")


def console() -> ModuleType:
    from . import console
    return console


def interactive() -> bool:
    return sys.stdin.isatty()


_answered: list[bool] = []


def interrupted(message: str) -> typer.Exit:
    """A Ctrl-C the command answers itself, saying what stopped and what keeps running: exit 130, and `main` adds
    nothing (typer turns any other Ctrl-C into a silent exit 130, which `main` then explains)."""
    console().err.print(f"\n{message}")
    _answered.append(True)
    return typer.Exit(ExitCode.INTERRUPTED)


def interrupt_answered() -> bool:
    """Whether the command answered a Ctrl-C itself; asking forgets it (a process may run several commands)."""
    said = bool(_answered)
    _answered.clear()
    return said


def declined() -> None:
    console().err.print("nothing changed")
    raise typer.Exit(ExitCode.ERROR)   # docs/troubleshooting.md's exit table: 1 also means "declined"


def cluster_and_provider(cluster: Optional[str], provider: Optional[str],
                         run_id: Optional[str] = None) -> "tuple[ClusterState, Provider]":
    """`run_id`: a command about one run, without -c or a `cluster` setting, uses the one cluster that has it."""
    from ..providers import registry
    from ..control.status import load
    found = _cluster_of_run(run_id) if run_id and cluster is None and \
        settings().setting("cluster", None, None) is None else None
    st = load(found or cluster_name(cluster))
    if provider and provider != st.spec.provider.value:
        raise bad_input(f"cluster {st.name} uses provider {st.spec.provider.value}, not {provider}",
                        "drop --provider")
    return st, registry.get(st.spec.provider)


def _cluster_of_run(run_id: str) -> Optional[str]:
    """The one cluster here (not down) whose store has the run (a whole id, or a unique start or end of one), when
    there are several to pick from (issue 63.5: a unique run id needs no -c); None: the usual pick applies."""
    from ..core.state import live_cluster_names, load as load_state
    from ..control.submission import resolve_run
    from ..providers import registry
    live = live_cluster_names()
    if len(live) < 2:
        return None
    found = []
    for name in live:
        st = load_state(name)
        if st is None:
            continue
        try:
            resolve_run(registry.get(st.spec.provider).store(st), run_id)
        except TpuctlError as e:
            if e.kind is ErrorKind.INPUT:   # ambiguous there: it has the run, and says so once asked with -c
                found.append(name)
            continue
        except Exception:  # noqa: BLE001 - a store that cannot be asked now (no credentials, no network): not it
            continue
        found.append(name)
    if len(found) > 1:
        raise bad_input(f"run {run_id} matches runs on {len(found)} clusters: {', '.join(found)}",
                        f"name the cluster: -c {found[0]}")
    if found and found[0] not in _said:
        _said.add(found[0])
        console().err.print(f"run {run_id} is on cluster {found[0]}", style="dim", markup=False)
    return found[0] if found else None


def check_worker(st: "ClusterState", worker: int) -> None:
    workers = max(1, st.host.hosts)
    if not 0 <= worker < workers:
        raise bad_input(f"cluster {st.name} has {workers} worker{'s' * (workers > 1)}",
                        f"--worker takes 0 to {workers - 1}")


def writable_dir(path: "Path", flag: str, named: "Path | None" = None) -> None:
    """A folder the user named (-o), or the folder it would be made in: one that cannot be is their input, said
    with the path and the fix, never an internal error (issue 63.4). Made by the command itself, later. `named`:
    what the user named, when `path` is the folder of a file."""
    import os
    shown = named or path
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:   # exists() is False below a file, too
        probe = probe.parent
    if not probe.is_dir():
        raise bad_input(f"{flag} {shown}: {probe} is a file, not a folder", f"pass {flag} a path whose folders are "
                        "folders, or remove that file")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise bad_input(f"{flag} {shown}: {probe} is not writable by you", f"pass {flag} a folder you may write to")


def cannot_write(e: OSError, path: "Path", flag: str) -> Exception:
    """An OSError writing under a path the user named: their input's fault (a read-only or special file system),
    said as one line; any other error is returned as it is."""
    where = str(e.filename or "")
    if where and (where == str(path) or where.startswith(str(path).rstrip("/") + "/") or
                  str(path).startswith(where.rstrip("/") + "/")):
        return bad_input(f"{flag} {path}: cannot write {where} ({e.strerror})",
                         f"pass {flag} a folder you may write to")
    return e
