"""How tpuctl's command line is parsed and shown beyond what typer does by itself: the commands whose trailing
arguments go to something else (after `--`, and only there), and the metavars `--help` prints."""
from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand


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


def plain_metavars(cmd: Any) -> None:
    """Every option and argument of `cmd` and its subcommands given the metavar `--help` shows for it."""
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
        plain_metavars(sub)
