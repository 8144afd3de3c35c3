"""Output a run's end left held because the store was full (logshipper.py, storeguard.py): shipped on a thread of
its own while the agent goes on to the next run. Before, the run stayed `running` for up to TPUCTL_LOG_HOLD_WAIT
(300 s) while it waited, the next run waited behind it, and nothing but the agent's log said the store was full
(issue 38.9). Now the run's status is final at once, its note saying what waits ("store full: 2.1 MB of output
waiting to be shipped"), and it is rewritten when the output is out (note cleared) or given up on (note says how
much was lost); the next run starts with the first CHUNK_ALLOWANCE bytes of its log guaranteed by the floor."""
from __future__ import annotations

import threading
from typing import Callable

from .logshipper import LogShipper


def waiting(shipper: LogShipper) -> str:
    """The run's note while its output waits."""
    problem = shipper.guard.problem
    return f"store full: {shipper.unshipped / 1e6:.1f} MB of output waiting to be shipped" + \
        (f" ({problem.removeprefix('store full: ')})" if problem.startswith("store full: ") else
         f" ({problem})" if problem else "")


class HeldOutput:
    """`changed()` is called when output starts or stops waiting: the agent's heartbeat then says how much waits,
    which `status` shows as the store's problem."""

    def __init__(self, stop: threading.Event, changed: Callable[[], object]) -> None:
        self.stop, self.changed = stop, changed
        self.threads: list[threading.Thread] = []
        self.shippers: list[LogShipper] = []

    def waiting_bytes(self) -> int:
        return sum(s.unshipped for s in self.shippers)

    def drain(self, shipper: LogShipper, say: Callable[[str], object]) -> None:
        """Ship what `shipper` holds in the background; `say(note)` rewrites the run's final status: while it
        waits, then "" once all is out, or what was lost (at TPUCTL_LOG_HOLD_WAIT, or the agent's stop)."""
        def beat(_: str) -> None:
            say(waiting(shipper))

        def run() -> None:
            shipper.settle(self.stop, beat)
            lost = shipper.unshipped
            self.shippers.remove(shipper)
            say(f"{lost} bytes of output were not shipped ({shipper.guard.problem or 'store full'})" if lost else "")
            self.changed()
        self.shippers.append(shipper)
        self.changed()
        self.threads = [t for t in self.threads if t.is_alive()]
        t = threading.Thread(target=run, daemon=True, name="tpuctl-held-output")
        t.start()
        self.threads.append(t)

    def join(self, timeout: float) -> None:
        """At the agent's stop: the held output's last word (what was lost) is written before it exits."""
        for t in self.threads:
            t.join(timeout)
