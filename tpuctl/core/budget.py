"""A spending cap in dollars (`up --budget USD`) that holds across recoveries: what a cluster's compute has cost,
counting every period it existed (recreations included) at the catalog price `status` shows.

`up` writes layout.BUDGET: {"usd": cap or 0, "hourly": $/h, "periods": [[start, end|0], ...]}; each `up` (the
watcher's re-creations too: control/up.py) rewrites the periods. Worker 0's agent reads it and ends the run and
the compute at 100% (host/autostop.py, as at --max-duration), after a `budget.warning` at 80%; the watcher checks
it between periods (control/watch.py). A budget stop is final: `up` refuses to bring the cluster back until the
budget is raised above what was spent.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Sequence

from . import knobs, layout
from .errors import ErrorKind, TpuctlError, bad_input
from .store import BlobStore

WARN_AT = 0.8
REASON = "budget"


def hourly(catalog: float | None, saved: float = 0.0) -> float | None:
    """The $/hour that every cost is counted at (the budget, `status`'s cost so far, `jobs`' cost column): the
    price `saved` with the cluster's budget at `up` when it has one (what its hosts count the budget and each run's
    cost with, whatever this shell says now); else TPUCTL_PRICE_PER_HOUR when set, in place of the catalog's
    `catalog` (tests make a fake TPU expensive; a user may put in the price they are actually charged); None when
    neither knows."""
    if saved:
        return saved
    return knobs.number("TPUCTL_PRICE_PER_HOUR", 0) or catalog


def parse_usd(text: str) -> float:
    """`--budget 25`, `$25.50`, `0.004` (kept exactly: a cap below a cent is still a cap, where rounding to the cent
    once turned it into 0, which means off: issue 38.7); `off`, `none` and every spelling of zero (0, 0.0, 00, -0):
    no cap."""
    t = text.strip().lower().lstrip("$")
    if t in ("off", "none"):
        return 0.0
    try:
        usd = float(t)
    except ValueError:
        usd = -1.0
    if usd == 0:
        return 0.0
    if not usd > 0 or usd != usd or usd == float("inf"):
        raise bad_input(f"--budget {text!r} is not an amount of dollars", "for example --budget 25 or --budget off")
    return usd


def dollars(usd: float) -> str:
    """An amount as people read it: to the cent, finer only when the cent would change it ($0.004, not $0.00)."""
    return f"${usd:.2f}" if abs(round(usd, 2) - usd) < 1e-9 else f"${usd:.4g}"


def spent(periods: list[list[float]], hourly: float, now: float | None = None, extra: Sequence[Sequence[Any]] = ()) -> float:
    """The compute's periods at `hourly`, plus what else the cluster ran: `extra` ([start, end|0, $/h, what]: the
    recovery watcher's VM, which lives from `up --recover --watcher vm` to `down`, between periods too)."""
    now = time.time() if now is None else now
    return (sum(((end or now) - start) for start, end in periods) / 3600 * hourly
            + sum(((e[1] or now) - e[0]) / 3600 * float(e[2]) for e in extra))


def read(store: BlobStore) -> dict[str, Any]:
    try:
        raw = store.read(layout.BUDGET)
        return dict(json.loads(raw)) if raw else {}
    except (ValueError, TypeError):
        return {}


def save(store: BlobStore, usd: float, hourly: float, periods: list[list[float]],
         extra: list[list[Any]] | None = None) -> None:
    """`extra`: None keeps what the store had (another writer's watcher VM)."""
    extra = read(store).get("extra", []) if extra is None else extra
    store.write(layout.BUDGET, json.dumps({"usd": usd, "hourly": hourly, "periods": periods, "extra": extra,
                                           "time": time.time()}).encode())


def open_extra(store: BlobStore, what: str, hourly: float) -> None:
    """Something besides the compute starts billing (the watcher VM): counted from now until close_extras."""
    doc = read(store)
    extra = list(doc.get("extra", []))
    if doc and not any(e[3] == what and not e[1] for e in extra):
        save(store, float(doc.get("usd") or 0), float(doc.get("hourly") or 0), doc.get("periods", []),
             extra + [[time.time(), 0.0, hourly, what]])


def close_extras(store: BlobStore) -> None:
    """`down` removed them."""
    doc = read(store)
    if any(not e[1] for e in doc.get("extra", [])):
        now = time.time()
        save(store, float(doc.get("usd") or 0), float(doc.get("hourly") or 0), doc.get("periods", []),
             [[e[0], e[1] or now, e[2], e[3]] for e in doc["extra"]])


def save_periods(store: BlobStore, periods: list[list[float]]) -> None:
    """A re-created compute (a new period): the hosts count it from now on. Nothing when `up` never wrote one."""
    doc = read(store)
    if doc:
        save(store, float(doc.get("usd") or 0), float(doc.get("hourly") or 0), periods)


def check_up(usd: float, hourly: float | None, periods: list[list[float]], cluster: str,
             extra: Sequence[Sequence[Any]] = ()) -> str:
    """`up --budget`: refused when the price is unknown or the cap is no more than already spent; else the line
    that says how many hours it buys."""
    if not usd:
        return ""
    if hourly is None:
        raise bad_input("--budget needs the cluster's price, and the catalog has none for it",
                        "set TPUCTL_PRICE_PER_HOUR to the $/hour you are charged, or leave --budget off")
    used = spent(periods, hourly, extra=extra)
    if usd <= used:
        raise TpuctlError(ErrorKind.INPUT, f"cluster {cluster} has already spent ${used:.2f}: a budget of "
                          f"{dollars(usd)} leaves nothing", f"raise it: {raise_command(cluster, used)}")
    if not hourly:
        return f"budget {dollars(usd)}: the compute is free, so it never runs out"
    return f"budget {dollars(usd)}: {dollars(usd - used)} left, {(usd - used) / hourly:.1f} hours at ${hourly:.2f}/hour"


def raise_command(cluster: str, used: float) -> str:
    """The command that brings a cluster whose budget is spent back, with a cap above what it spent."""
    return f"tpuctl up -c {cluster} --budget {max(used * 2, used + 1):.0f}"


def over(doc: dict[str, Any], periods: list[list[float]] | None = None, now: float | None = None) -> tuple[float, str]:
    """(share of the cap spent, why the compute must end now or "")."""
    usd, hourly = float(doc.get("usd") or 0), float(doc.get("hourly") or 0)
    if not usd:
        return 0.0, ""
    used = spent(doc.get("periods", []) if periods is None else periods, hourly, now, doc.get("extra", []))
    # what was spent, then the cap: the note once said the cap as the spend ("$50.00 spent" of $74.86, issue 52.7)
    # a spend is a running sum (6.2983...): shown to the cent, finer only below one
    shown_used = dollars(round(used, 2) if used >= 0.01 else used)
    # "at the stop": what was spent when the stop was decided; `status` counts on until the compute is gone (the
    # note said $55.12 where status said $75.30, and read as a contradiction)
    return used / usd, (f"{REASON}: {shown_used} spent of {dollars(usd)} at the stop" if used >= usd else "")


def shown(doc: dict[str, Any], periods: list[list[float]]) -> dict[str, object]:
    """`status` and `jobs --json`: spent and left (nothing when there is no cap)."""
    usd = float(doc.get("usd") or 0)
    if not usd:
        return {}
    used = spent(periods, float(doc.get("hourly") or 0), extra=doc.get("extra", []))
    out: dict[str, object] = {"budget_usd": usd, "spent_usd": round(used, 4),
                              "left_usd": round(max(usd - used, 0.0), 4)}
    if used >= usd:
        out["budget"] = f"spent: {dollars(used)} of {dollars(usd)}; raise it with `up --budget` to bring the " \
                        "cluster back"
    elif used >= WARN_AT * usd:
        out["budget"] = f"WARNING: {dollars(used)} of {dollars(usd)} spent ({100 * used / usd:.0f}%)"
    return out


class Guard:
    """The host's view (worker 0): the budget read at most every TPUCTL_BUDGET_CHECK seconds (10); `due()` is why
    the compute must end now, or ""; the 80% warning is sent once per cap."""

    def __init__(self, store: BlobStore, cluster: Callable[[], str]) -> None:
        self.store, self.cluster = store, cluster
        self.doc: dict[str, Any] = {}
        self.read_at = 0.0
        self.warned = 0.0        # the cap whose warning this process queued (the store's record makes it once)

    def due(self) -> str:
        if time.monotonic() - self.read_at >= knobs.number("TPUCTL_BUDGET_CHECK", 10):
            self.read_at = time.monotonic()
            try:
                self.doc = read(self.store)
            except Exception:  # noqa: BLE001 - a store outage: the last budget read stands
                pass
        share, why = over(self.doc)
        if share >= WARN_AT and self.warned != self.doc["usd"]:
            from . import notify
            usd = self.warned = float(self.doc["usd"])
            notify.emit(self.store, "budget.warning", f"budget.warning-{usd:.2f}", self.cluster(),
                        budget_usd=usd, spent_usd=round(share * usd, 2))
        return why
