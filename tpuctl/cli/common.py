"""The typer app and what every command shares: the common options, where settings and the cluster come from,
and lazy access to the console (so `tpuctl --help` imports no rich). The commands are in clusters.py and
runs.py; tpuctl.cli.main is the entry point. The flows they call (control/) are imported inside each command."""
from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, Optional

import typer
from typer.core import TyperCommand

from .. import __version__
from ..core.errors import ExitCode, bad_input

if TYPE_CHECKING:
    from ..core.models import ClusterState
    from ..providers.base import Provider

# `tpuctl --help`'s summary: every provider and framework (issue 40: it named TensorFlow and Cloud TPUs alone).
SUMMARY = ("Train TensorFlow, JAX or PyTorch jobs on TPUs: Google Cloud (gcp), Kaggle (kaggle), Colab (`tpuctl "
           "notebook`) or this machine (local). Start with up, submit, logs, down.")
app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help=SUMMARY,
                  context_settings={"help_option_names": ["-h", "--help"]})


class PassOnCommand(TyperCommand):
    """A command whose trailing arguments belong to something else (the job's command, a remote shell): they go
    after `--` and only there. Everything before `--` is tpuctl's own, so an option it does not know is refused by
    the parser (exit 2) instead of being handed on: `submit JOB --max-restart 1` once ran the job with
    `['--max-restart', '1']` and exit 0. `passes_on` names what the arguments go to, for the usage error's hint."""

    passes_on = "the job"
    example = "-- --epochs 3"
    usage_tail = "[-- ARGS]..."

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:  # type: ignore[override]  # typer's click.Context
        return [*super().collect_usage_pieces(ctx), self.usage_tail]

    def parse_args(self, ctx: typer.Context,  # type: ignore[override]  # typer's click.Context, same object
                   args: list[str]) -> list[str]:
        mine, theirs = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
        super().parse_args(ctx, mine)   # no extra arguments allowed before `--`: the parser's one line, exit 2
        ctx.args = theirs
        return theirs


class ShellCommand(PassOnCommand):
    passes_on = "the command to run there"
    example = "-- ls /tmp"
    usage_tail = "[-- CMD]..."


def pass_on_hint(command: object, where: str) -> str:
    """The usage error's hint for a command that passes arguments on: where those arguments go."""
    return (f"arguments for {getattr(command, 'passes_on')} go after `--` ({where} ... {getattr(command, 'example')}); "
            f"`{where} --help` lists its own options")


# What an option's value is, as `--help` shows it: typer 0.29 prints `<str>`, `<list[str]>`, `<float>` and
# `{job_dir}`, where the rest of the Python CLI world (click, argparse) prints TEXT, INTEGER and JOB_DIR.
METAVARS = {"--give-up-after": "SECONDS", "--autostop": "DURATION", "--max-duration": "DURATION",
            "--valid-until": "DURATION", "--recover-for": "DURATION", "--budget": "USD", "--notify": "URL",
            "--type": "TYPE", "--zone": "ZONE", "--cluster": "NAME", "--project": "PROJECT", "--provider": "PROVIDER",
            "--data": "PATH", "--output": "PATH", "--store": "STORE", "--port": "PORT", "--host": "HOST",
            "--worker": "N", "--slice": "K", "--slices": "N", "--limit": "N", "--chain": "N", "--max-restarts": "N",
            "--max-recoveries": "N", "--bucket": "BUCKET", "--data-uri": "URI", "--embed-limit-mb": "MB"}
_TYPE_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "bool": "BOOLEAN"}


def _plain_metavars(cmd: Any) -> None:
    for p in cmd.params:
        if p.metavar is not None or getattr(p, "is_flag", False):
            continue
        if p.param_type_name == "argument":   # click's own forms: JOB_DIR, [RUN_ID], [RUN_IDS]...
            p.metavar = p.name.upper()
            usage = (p.metavar if p.required else f"[{p.metavar}]") + ("..." if p.nargs != 1 else "")
            p.get_usage_pieces = lambda ctx, usage=usage: [usage]   # typer's: {JOB_DIR}, [RUN_IDS]......
            p.display_type_rich = lambda ctx: None                  # and `JOB_DIR <str>` in the Arguments list
            continue
        named = next((METAVARS[o] for o in p.opts if o in METAVARS), None)
        bare = str(p.bare_type()) if hasattr(p, "bare_type") else ""
        bare = bare[5:-1] if bare.startswith("list[") else bare   # a repeatable option: one value's metavar
        p.metavar = named or _TYPE_NAMES.get(bare, bare.upper() or "VALUE")
    for sub in getattr(cmd, "commands", {}).values():
        _plain_metavars(sub)


def command() -> Any:
    """The command tree typer builds from `app` (what `--help` prints from), with plain metavars."""
    import typer.main
    root = typer.main.get_command(app)
    _plain_metavars(root)
    return root


def _cluster_names(incomplete: str) -> list[str]:
    """Shell completion of -c: the clusters in local state (file names only: nothing is parsed or asked)."""
    from ..core.state import cluster_names
    return [n for n in cluster_names() if n.startswith(incomplete)]


CLUSTER = typer.Option(None, "--cluster", "-c", help="Cluster name (default: the config's, else 'default' or the "
                       "only one there is).",
                       autocompletion=_cluster_names)
PROVIDER = typer.Option(None, "--provider", help="gcp (default), local or kaggle; also TPUCTL_PROVIDER.")
PROJECT = typer.Option(None, "--project", help="Google Cloud project id.")


def _print_version(value: bool) -> None:
    if value:
        print(f"tpuctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_print_version,
                                       help="Print tpuctl's version and exit.")) -> None:
    """Train TensorFlow, JAX or PyTorch jobs on TPUs: Google Cloud (gcp), Kaggle (kaggle), Colab (`tpuctl notebook`)
    or this machine (local). Start with up, submit, logs, down."""


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
    from ..core.state import cluster_names
    names = cluster_names()
    if not names or "default" in names:
        return "default"   # none: `no cluster named 'default'`, whose hint says how to make one
    if len(names) > 1:
        raise bad_input(f"no -c, and {len(names)} clusters here: {', '.join(names)}",
                        f"name one (-c {names[0]}), or set one for every command: TPUCTL_CLUSTER={names[0]} or "
                        "`cluster = \"NAME\"` in ~/.config/tpuctl/config.toml")
    if names[0] not in _said:
        _said.add(names[0])
        console().err.print(f"using cluster {names[0]}, the only one here (-c NAME picks another)", style="dim",
                            markup=False)
    return names[0]


def forget_said() -> None:
    """A new command in the same process (the tests' in-process CLI) says which cluster it uses again."""
    _said.clear()


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


def cluster_and_provider(cluster: Optional[str], provider: Optional[str]) -> "tuple[ClusterState, Provider]":
    from ..providers import registry
    from ..control.status import load
    st = load(cluster_name(cluster))
    if provider and provider != st.spec.provider.value:
        raise bad_input(f"cluster {st.name} uses provider {st.spec.provider.value}, not {provider}",
                        "drop --provider")
    return st, registry.get(st.spec.provider)


def check_worker(st: "ClusterState", worker: int) -> None:
    workers = max(1, st.host.hosts)
    if not 0 <= worker < workers:
        raise bad_input(f"cluster {st.name} has {workers} worker{'s' * (workers > 1)}",
                        f"--worker takes 0 to {workers - 1}")
