"""Recovery from preemption on the command line: `up --recover` (its flags are checked and applied here), `tpuctl
watch`, and what `down` asks of a watcher. The watcher itself is control/watch.py."""
from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import typer

from ..core import knobs
from .common import CLUSTER, app, cluster_and_provider, console, interrupted
from ..core.errors import bad_input

if TYPE_CHECKING:
    from ..core.models import ClusterSpec, ClusterState
    from ..providers.base import Provider



@dataclass
class RecoverFlags:
    recover: bool = False
    max_recoveries: int = 0
    recover_for: int = 0
    # armed.WATCHERS once parse() has seen --recover; "" without it. control.armed is imported by the commands that
    # use it, not at module level: it brings the store and the run records, which `tpuctl --help` does not need.
    watcher: str = ""

    @property
    def on_vm(self) -> bool:
        from ..control.armed import ON_VM
        return self.watcher == ON_VM

    @classmethod
    def parse(cls, recover: bool, max_recoveries: Optional[int], recover_for: Optional[str],
              watcher: Optional[str]) -> "RecoverFlags":
        from ..control.armed import DEFAULT_MAX_RECOVERIES, ON_MACHINE, WATCHERS
        from ..core.lifecycle import parse_duration
        if not recover:
            given = [f for f, v in (("--max-recoveries", max_recoveries), ("--recover-for", recover_for),
                                    ("--watcher", watcher)) if v is not None]
            if given:
                raise bad_input(f"{given[0]} applies only with --recover", f"add --recover, or drop {given[0]}")
            return cls()
        if max_recoveries is not None and max_recoveries < 1:
            raise bad_input(f"--max-recoveries {max_recoveries} must be at least 1", "e.g. --max-recoveries 5")
        if watcher is not None and watcher not in WATCHERS:
            raise bad_input(f"--watcher {watcher!r} is not one of {', '.join(WATCHERS)}",
                            "--watcher local: `tpuctl watch -c NAME --detach` on a machine that stays on; --watcher "
                            "vm: a small VM in the cluster's region runs it")
        return cls(True, max_recoveries or DEFAULT_MAX_RECOVERIES,
                   parse_duration(recover_for, "--recover-for") if recover_for else 0, watcher or ON_MACHINE)


def plan(spec: "ClusterSpec", prov: "Provider", flags: RecoverFlags) -> list[str]:
    """The plan's lines for recovery; for a watcher VM, checks (before anything is made) that the identity it would
    run as may re-create the TPU: warnings come back, a certain refusal raises."""
    if not flags.recover:
        return []
    if prov.self_recovery:
        raise bad_input(f"--recover does not apply to --provider {prov.name.value}: {prov.self_recovery}",
                        "leave --recover out; give `tpuctl submit --max-restarts N` instead")
    lines = [f"watch  re-created when preempted, up to {flags.max_recoveries} times, by `tpuctl watch`"]
    if flags.on_vm:
        host = prov.watcher_host
        if host is None:
            raise bad_input(f"--watcher vm: the {prov.name.value} provider has no VM to run the watcher on",
                            f"run `tpuctl watch -c {spec.name} --detach` on this machine instead (--watcher local)")
        zones = [host.zone(spec, z) for z in spec.zones]   # each zone it may be made in: refused before anything
        zone = zones[0] if zones else ""
        lines = [f"watch  VM {host.name(spec)} in {zone} re-creates the TPU when preempted, up to "
                 f"{flags.max_recoveries} times; {host.price(zone)}"]
    return lines


def arm(st: "ClusterState", prov: "Provider", flags: RecoverFlags) -> None:
    from ..control import armed
    from ..core.lifecycle import show_duration
    con = console()
    until = time.time() + flags.recover_for if flags.recover_for else 0.0
    store = prov.store(st)
    doc = armed.arm(store, st, flags.max_recoveries, until, flags.watcher)
    con.err.print(f"armed for recovery: up to {flags.max_recoveries} re-creates"
                  + (f" within {show_duration(flags.recover_for)}" if flags.recover_for else "")
                  + (f", for run {doc['run']}" if doc["run"] else ", for the next run submitted"))
    if not flags.on_vm or prov.watcher_host is None:
        con.err.print(f"start its watcher on a machine that stays on: tpuctl watch -c {st.name} --detach")
        return
    from ..control.watch import start_watcher_vm
    with con.Reporter() as rep:
        where = start_watcher_vm(st, prov, prov.watcher_host, rep)
    from ..core import budget
    budget.open_extra(store, "watcher VM", prov.watcher_host.hourly)   # it bills between periods too
    con.err.print(f"watcher running on {where}: `tpuctl status -c {st.name}` shows when it last looked")


def _watch_files(name: str) -> tuple[str, str]:
    from ..core.state import home
    d = home() / "watchers"
    d.mkdir(parents=True, exist_ok=True)
    return str(d / f"{name}.log"), str(d / f"{name}.pid")


@app.command()
def watch(cluster: Optional[str] = CLUSTER,
          detach: bool = typer.Option(False, "--detach", "-d",
                                      help="Run in the background (log and pid file under tpuctl's state dir).")
          ) -> None:
    """Watch a cluster armed with `up --recover`: re-create its TPU when it is preempted, until its run ends. On a
    Kaggle cluster: move its runs on, session after session, until they end."""
    from ..control import armed, watch as watch_flow
    con = console()
    st, prov = cluster_and_provider(cluster, None)
    if prov.self_recovery:
        con.err.print(f"{st.name}: nothing for a tpuctl watcher to re-create: {prov.self_recovery}")
        if prov.remote_runs is None:
            return
    if prov.remote_runs is not None and not detach:
        return _advance_until_done(st, prov)
    if prov.remote_runs is None and not armed.live(armed.read(prov.store(st))):
        raise bad_input(f"cluster {st.name} is not armed for recovery",
                        f"arm it: tpuctl up -c {st.name} --recover")
    if detach:
        log, pid_file = _watch_files(st.name)
        with open(log, "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "tpuctl", "watch", "-c", st.name], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        with open(pid_file, "w") as f:
            f.write(str(proc.pid))
        con.err.print(f"watcher for {st.name} running in the background (pid {proc.pid}); its log: {log}")
        return
    try:
        with con.Reporter() as rep:
            why = watch_flow.Watcher(st, prov, rep).run()
    except KeyboardInterrupt:
        raise interrupted(f"stopped watching {st.name} (its lease is given up): the cluster and its runs keep "
                          "running, and stay armed, but nothing re-creates the compute if it is lost until a watcher "
                          f"runs again: tpuctl watch -c {st.name} --detach") from None
    con.err.print(f"watch of {st.name} ended: {why}")


def _advance_until_done(st: "ClusterState", prov: "Provider") -> None:
    """A cluster whose runs execute on a service (Kaggle): move every unfinished run on (its next session when one
    ends at the time limit) until none is left."""
    from ..control import submission
    from ..core import runindex
    con = console()
    store = prov.store(st)
    poll = knobs.number("TPUCTL_KAGGLE_POLL", 5)
    try:
        while True:
            submission.refresh(st, prov, store)
            left = runindex.unfinished(store)
            if not left:
                con.err.print(f"no unfinished run on {st.name}: the watch is over")
                return
            time.sleep(poll)
    except KeyboardInterrupt:
        raise interrupted(f"stopped watching {st.name}: its runs' current sessions keep running on Kaggle; a session "
                          "that ends at its time limit starts the next only while something watches: tpuctl watch "
                          f"-c {st.name} --detach") from None


def detached_pid(name: str) -> int:
    """The pid of this machine's background watcher of `name`, or 0."""
    from ..core.processes import running
    _, pid_file = _watch_files(name)
    try:
        pid = int(open(pid_file).read())
    except (OSError, ValueError):
        return 0
    return pid if running(pid) else 0
