"""The command reference, generated from the CLI itself so it cannot drift from `--help`.

Used two ways: as an MkDocs hook (mkdocs.yml `hooks:`), it fills docs/reference.md's page at build time; run as a
script (`python docs_hooks/reference.py`), it prints the same Markdown. It walks typer's command tree (the click
objects `typer.main.get_command` builds, which is what `--help` itself prints from) and, for every command, shows
its help text, its usage line and each parameter's help record: the very strings `--help` shows.
"""
from __future__ import annotations

from typing import Any, Iterator

MARKER = "<!-- generated: the command reference -->"


def _group(cmd: Any) -> bool:
    return hasattr(cmd, "list_commands")   # typer 0.29 has its own copy of click (typer._click): no isinstance


def _commands(group: Any, ctx: Any, path: list[str]) -> Iterator[tuple[list[str], Any, Any]]:
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or getattr(cmd, "hidden", False):
            continue
        sub = cmd.context_class(cmd, info_name=name, parent=ctx, **cmd.context_settings)
        yield [*path, name], cmd, sub
        if _group(cmd):
            yield from _commands(cmd, sub, [*path, name])


def _text(s: str) -> str:
    """Help text into a table cell: `<str>` kept literal (not read as HTML) outside code spans, pipes escaped."""
    parts = s.replace("\n", " ").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).replace("|", "\\|")


def _params(cmd: Any, ctx: Any) -> list[str]:
    rows = []
    for p in cmd.get_params(ctx):
        record = p.get_help_record(ctx)
        if record is None:
            continue
        names, help_ = record
        names = names.replace("|", "\\|")   # a table cell's pipe, even inside a code span
        rows.append(f"| `{names}` | {_text(help_)} |")
    return rows


def markdown() -> str:
    from tpuctl.cli import clusters   # noqa: F401  (the entry point's module registers every command)
    from tpuctl.cli.common import command
    root = command()   # what `tpuctl --help` prints from
    ctx = root.context_class(root, info_name="tpuctl", **root.context_settings)
    out = ["# Command reference", "",
           "Generated from the CLI itself (`docs_hooks/reference.py` walks the commands `tpuctl --help` lists), "
           "so every command and option here is one the installed tpuctl has. `tpuctl COMMAND --help` prints the "
           "same text.", "",
           "## tpuctl", "", _text(root.help or ""), "", "```", root.get_usage(ctx), "```", "",
           "| option | meaning |", "|---|---|", *_params(root, ctx), ""]
    for path, cmd, sub in _commands(root, ctx, []):
        rows = _params(cmd, sub)
        out += [f"## tpuctl {' '.join(path)}", "", _text(cmd.help or ""), "", "```", cmd.get_usage(sub), "```", ""]
        if rows:
            out += ["| argument or option | meaning |", "|---|---|", *rows, ""]
    return "\n".join(out)


def on_page_markdown(text: str, page: Any, **_: Any) -> str:
    """MkDocs hook: the reference page (the one holding the marker) becomes the generated reference; its note for
    readers on GitHub, where nothing is generated, goes."""
    return markdown() if MARKER in text else text


if __name__ == "__main__":
    print(markdown())
