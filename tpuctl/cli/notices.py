"""`up --notify URL` and `up --budget USD` (what `up` checks and prints before it creates anything, and writes into
the store after), and `tpuctl notify test`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, List, Optional

import typer

from .common import CLUSTER, Group, app, cluster_and_provider, console, settings
from ..core.errors import ErrorKind, TpuctlError, bad_input

if TYPE_CHECKING:
    from ..core.models import ClusterSpec, ClusterState
    from ..providers.base import Provider

notify_app = typer.Typer(cls=Group, no_args_is_help=True, help="Notifications: `tpuctl notify test -c NAME` sends one.")
app.add_typer(notify_app, name="notify")


@dataclass
class Notices:
    urls: list[str] = field(default_factory=list)
    keep_urls: bool = True          # no --notify given: the cluster keeps what it had
    usd: float = 0.0
    hourly: float = 0.0
    lines: list[str] = field(default_factory=list)   # the plan's budget and notify lines

    def show(self) -> None:
        for line in self.lines:
            console().err.print(line, markup=False)


def before_up(spec: ClusterSpec, prov: Provider, prior: ClusterState | None, usd_flag: Optional[str],
              notify_flags: List[str]) -> Notices:
    """--notify and --budget (or the config's `notify` and `budget`; on a re-run without them, what the cluster
    had), checked before the plan is printed and anything is made: a budget no more than already spent is refused.
    The plan's lines are `show()`n after the plan."""
    from ..core import budget, notify   # here: notify brings urllib.request and http.client, which help does not need
    cfg = settings()
    given = notify_flags or cfg.setting("notify", None, None)
    asked = [given] if isinstance(given, str) else list(given or [])
    off = notify.is_off(asked)     # `--notify off` clears the cluster's URLs, as `--budget off` clears its cap
    urls = [] if off else notify.check_urls(asked)
    out = Notices(urls=urls, keep_urls=not urls and not off)
    store_doc = _prior_budget(prior, prov)
    # a --budget given wins even empty: `--budget ""` (a variable unset in a script) is refused, never off (52.7)
    raw = usd_flag if usd_flag is not None else cfg.setting("budget", None, None)
    out.usd = budget.parse_usd(str(raw)) if raw is not None else float(store_doc.get("usd") or 0)
    hourly = budget.hourly(prov.price(spec).hourly)
    line = budget.check_up(out.usd, hourly, prior.periods if prior else [], spec.name, store_doc.get("extra", []))
    out.hourly = hourly or 0.0
    if line:
        out.lines.append(f"  {line}")   # the line starts "budget $5.00: ..." (it said "budget budget")
    out.lines += [f"  notify {notify.mask(u)}" for u in urls]
    if off:
        out.lines.append("  notify off: the cluster's notification URLs are removed (a run's own --notify still "
                         "holds)")
    return out


def _prior_budget(prior: ClusterState | None, prov: Provider) -> dict[str, Any]:
    """The cap the cluster had, with its periods made current: a stop by its host closes the last one."""
    if prior is None:
        return {}
    from ..control import armed
    from ..control.status import stopped_by_host
    from ..core import budget
    try:
        store = prov.store(prior)
        armed.sync(prior, store)
        stopped_by_host(prior, prov)
        return budget.read(store)
    except TpuctlError:
        return {}


def after_up(st: ClusterState, prov: Provider, n: Notices) -> None:
    from ..core import budget, notify
    store = prov.store(st)
    if not n.keep_urls:
        notify.save_cluster_urls(store, n.urls)
    budget.save(store, n.usd, n.hourly, st.periods)


@notify_app.command("test")
def test(cluster: Optional[str] = CLUSTER,
         url: List[str] = typer.Option([], "--notify", help="Send to this URL instead of the cluster's.")) -> None:
    """Send one notification (event `test`) to the cluster's URLs and wait for the answer."""
    import time
    from ..core import notify
    st, prov = cluster_and_provider(cluster, None)
    store = prov.store(st)
    urls = notify.check_urls(url) or notify.cluster_urls(store)
    if not urls:
        raise bad_input(f"cluster {st.name} has no notification URL", f"tpuctl up -c {st.name} --notify URL")
    body = {"event": "test", "cluster": st.name, "run": "", "time": time.time()}
    message = {"text": notify.text_of("test", st.name, "", {}), "tpuctl": body}
    con = console()
    failed = 0
    for u in urls:
        # one try, with the full TPUCTL_NOTIFY_TIMEOUT (10 s) for the answer: a receiver answering in 150 ms or more
        # was reported NOT delivered when the retry window of 0 s capped the request at 0.1 s (issue 38.4)
        ok, said = notify.try_once(u, message)
        con.err.print(f"{notify.mask(u)}: " + (f"delivered ({said})" if ok else f"NOT delivered: {said}"),
                      markup=False)
        failed += not ok
    if failed:
        raise TpuctlError(ErrorKind.ERROR, f"{failed} of {len(urls)} notification URL(s) did not take the message",
                          "check the URL (the receiver's answer is above); `tpuctl up -c NAME --notify URL` replaces "
                          "them, --notify off removes them")
