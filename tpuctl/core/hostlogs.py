"""Every host's output of one run, interleaved (`logs -f --all-hosts`): each complete line prefixed with the host
it came from, `[sK/wW] ` (slice K, worker W), as xpk users ask of one run over many hosts. A line is written once
it is complete (a host's unfinished last line waits for its newline, or for the run's end), so lines of two hosts
never mix."""
from __future__ import annotations

import time
from typing import Callable

from . import knobs, layout, runs
from .runs import RunStatus
from .store import BlobStore


def hosts(slices: int, hosts_per_slice: int, framework: str) -> list[tuple[int, str]]:
    """(store index, prefix) of each host that runs a run: worker 0 alone for TensorFlow (it runs one program),
    every host of every slice otherwise; a host's store index is K x hosts_per_slice + W (host/agent.py)."""
    if framework == "tensorflow":
        return [(0, "[s0/w0] ")]
    return [(k * hosts_per_slice + w, f"[s{k}/w{w}] ") for k in range(slices) for w in range(hosts_per_slice)]


def follow_all(store: BlobStore, run_id: str, who: list[tuple[int, str]], write: Callable[[bytes], None],
               follow: bool = True, sleep: Callable[[float], None] = time.sleep,
               watch: Callable[[RunStatus], None] = lambda st: None) -> RunStatus:
    """As runs.follow, over every host in `who`; returns worker 0's final (or current) status."""
    max_idle = knobs.number("TPUCTL_LOG_POLL_MAX", 1.0)
    chunk = {i: 1 for i, _ in who}
    rest = {i: b"" for i, _ in who}
    idle = 0.05

    def drain() -> bool:
        got = False
        for i, prefix in who:
            while (data := store.read(layout.log_chunk(run_id, i, chunk[i]))) is not None:
                chunk[i] += 1
                got = True
                lines = (rest[i] + data).split(b"\n")
                rest[i] = lines.pop()
                if lines:
                    write(b"".join(prefix.encode() + line + b"\n" for line in lines))
        return got

    while True:
        if drain():
            idle = 0.05
            continue
        statuses = [runs.status(store, run_id, i) for i, _ in who]
        if all(st.state.final for st in statuses) or not follow:
            drain()   # an agent writes its last chunk before its final status
            for i, prefix in who:
                if rest[i]:   # a last line without its newline
                    write(prefix.encode() + rest[i] + b"\n")
            return statuses[0]
        watch(statuses[0])
        sleep(idle)
        idle = min(idle * 2, max_idle)
