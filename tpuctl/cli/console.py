"""The only module that imports rich: the Reporter (resource states with elapsed time) and tables.

Everything here writes to stderr except `print_json` and `print_table`, which are the command's output (stdout).
"""
from __future__ import annotations

import json
import sys
import threading
import time

from typing import TYPE_CHECKING, Callable

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.cells import cell_len
from rich.markup import escape
from rich.table import Table

from ..core import sizes

if TYPE_CHECKING:
    from rich.progress import Progress   # imported when a transfer starts: it is slow to import

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


_FINAL = {"READY", "RUNNING", "GRANTED", "REVOKED", "DELETED", "ADOPTED"}


human_bytes = sizes.human_bytes   # decimal units, as the transfer bars below (rich's DownloadColumn) show them


class Reporter:
    """On a terminal: a live board, one row per resource with its state and elapsed time, and a byte progress bar
    under it while data uploads. Elsewhere: one line per state change, so CI logs and pipes stay readable."""

    def __init__(self, console: Console = err) -> None:
        self.c = console
        self.rows: dict[tuple[str, str], tuple[str, float, float | None]] = {}
        self.lock = threading.Lock()
        self.live: Live | None = None
        self.bar: "Progress | None" = None

    def __enter__(self) -> "Reporter":
        if self.c.is_terminal:
            self.live = Live(console=self.c, refresh_per_second=4, transient=False, get_renderable=self._board)
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.bar = None
            self.live.stop()
            self.live = None

    def _board(self) -> RenderableType:
        t = Table.grid(padding=(0, 2))
        now = time.monotonic()
        with self.lock:
            rows = list(self.rows.items())
        for (kind, name), (st, start, end) in rows:
            done = end is not None
            elapsed = (end if end is not None else now) - start
            t.add_row(f"[bold]{kind}[/]", name, f"[{'green' if done else 'yellow'}]{st}{'' if done else '…'}[/]",
                      f"{elapsed:.0f}s")
        return Group(t, self.bar) if self.bar is not None else t

    def resource(self, kind: str, name: str, state: str, final: bool | None = None) -> None:
        """A resource changed state; `final` marks it settled (default: READY, RUNNING, DELETED, ...)."""
        now = time.monotonic()
        if final is None:
            final = state.upper() in _FINAL
        with self.lock:
            row = self.rows.get((kind, name))
            start = row[1] if row else now
            if row and row[0] == state:
                return
            self.rows[(kind, name)] = (state, start, now if final else None)
        if not self.live:
            self.c.print(f"  {kind:<6} {name}  {state}  ({now - start:.0f}s)")

    def transfer(self, total: int, verb: str = "upload", what: str = "data") -> Callable[[int], None]:
        """A byte progress bar (size, speed, time left) for a transfer of `total` bytes of `what` (the run's data,
        a run's outputs); returns advance(n)."""
        if not self.live:
            self.c.print(f"  {what}: {verb}ing {human_bytes(total)}")
            return lambda n: None
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn
        bar = Progress(f"  {verb} {what}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                       console=self.c, auto_refresh=False)
        task = bar.add_task(verb, total=total)
        lock = threading.Lock()
        self.bar = bar

        def advance(n: int) -> None:
            with lock:
                bar.advance(task, n)
        return advance

    def info(self, message: str) -> None:
        self.c.print(message, style="dim")

    def warn(self, message: str) -> None:
        self.c.print(f"[yellow]! {message}[/]")


def print_error(message: str, hint: str) -> None:
    # escaped: messages quote user input and commands ("tpuctl[tensorboard]", "[env]") that rich would take as tags
    err.print(f"[bold red]error:[/] {escape(message)}")
    if hint:
        err.print(f"[dim]hint:[/] {escape(hint)}")


def print_json(data: object) -> None:
    from ..core import jobfiles   # strict JSON: a NaN a job or a host wrote comes out as null, never as NaN
    sys.stdout.write(jobfiles.dumps(data, indent=2, sort_keys=True) + "\n")


def print_table(columns: list[str], rows: list[list[str]], keep: tuple[str, ...] = (),
                drop: tuple[str, ...] = ()) -> None:
    """`keep`: columns never cut (ids that are copied from here); `drop`: the columns a terminal too narrow for the
    whole table goes without, first first, before any cell of `keep` would be cut (a stderr line names them)."""
    cells = [[str(x) for x in r] for r in rows]
    if out.is_terminal:
        columns, cells, dropped = _fit(columns, cells, out.width, drop)
        if dropped:
            err.print(f"(too narrow for {', '.join(dropped)}; --json has all)", style="dim")
    t = Table(box=None, pad_edge=False, header_style="bold")
    for i, c in enumerate(columns):
        whole = max([cell_len(c)] + [cell_len(r[i]) for r in cells]) if c in keep else None
        t.add_column(c, no_wrap=c in keep, min_width=whole)
    for r in cells:
        t.add_row(*r)
    if out.is_terminal:
        out.print(t)
        return
    # into a pipe or a file (`tpuctl jobs | grep`), whole rows: no terminal width to fit, so no cell is cut short
    # (rich sizes a table by the console's width, not print's)
    width, out.width = out.width, 1000
    try:
        out.print(t)
    finally:
        out.width = width


def _fit(columns: list[str], rows: list[list[str]], width: int, drop: tuple[str, ...]
         ) -> tuple[list[str], list[list[str]], list[str]]:
    """Leaves out the `drop` columns, in order, until the table's natural width (each column as wide as its widest
    cell, two spaces between columns) fits `width`: those with no value in any row first, unsaid. Returns the columns,
    rows and what was left out that had values."""
    def natural(cols: list[int]) -> int:
        return sum(max([cell_len(columns[i])] + [cell_len(r[i]) for r in rows]) for i in cols) + 2 * (len(cols) - 1)
    shown = list(range(len(columns)))
    dropped = []
    empty = [n for n in drop if n in columns and not any(r[columns.index(n)] for r in rows)]
    for name in empty + [n for n in drop if n not in empty]:
        if natural(shown) <= width:
            break
        if name in columns:
            shown.remove(columns.index(name))
            dropped += [] if name in empty else [name]
    return [columns[i] for i in shown], [[r[i] for i in shown] for r in rows], dropped


def confirm(question: str) -> bool:
    # markup off: rich would read "[y/N]" as a style tag and print nothing of it
    return err.input(f"{question} [y/N] ", markup=False).strip().lower() in ("y", "yes")
