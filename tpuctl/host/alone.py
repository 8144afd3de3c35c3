"""A host that stalls alone (issue 60 item 4): in a run across hosts, the stall (stall.py, over the run's one
metrics.json, which worker 0 writes) is the whole run's; which host held it back is told by each host's own
output, the bytes of log its agent shipped to the store (layout.run_logs): a host whose job wrote nothing through
the stall while every other host's wrote is the one the others waited for (a data loader or a TPU that hung there
alone). Twice in a row on the same host, the host is marked sick (failures.mark_sick, the record the TPU failures
write), and the recovery watcher replaces it as it does a lost host (control/watch.py).

The logs are listed every quarter window (not every poll: a listing per host per host), only for a run across
hosts; a host's output is compared from the first sample taken after the run's last progress (plus one sample's
slack: a line shipped just before it is not counted) to the stall."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core import layout, runs
from ..core.store import BlobStore


def shipped(store: BlobStore, run_id: str, worker: int) -> int:
    """The bytes of output worker N's agent has shipped for the run so far."""
    return sum(size for _, size in store.list(layout.run_logs(run_id, worker)))


def silent_alone(samples: list[tuple[float, list[int]]], since: float, slack: float) -> int | None:
    """The one worker whose output did not move from the first sample after `since + slack` to the last while every
    other worker's did; None when none, several, or too few samples tell."""
    base = next((s for s in samples if s[0] >= since + slack), None)
    if base is None or base is samples[-1] or len(base[1]) < 2:
        return None
    now = samples[-1][1]
    silent = [w for w, (a, b) in enumerate(zip(base[1], now)) if a == b]
    return silent[0] if len(silent) == 1 else None


@dataclass
class Outputs:
    """Each worker's shipped output, sampled while the job runs (Doctor.check calls `sample`)."""
    store: BlobStore
    run_id: str
    workers: int
    samples: list[tuple[float, list[int]]] = field(default_factory=list)
    next_at: float = 0.0

    def sample(self, now: float, every: float, keep: float) -> None:
        """Every `every` seconds; samples older than `keep` seconds go."""
        if self.workers < 2 or now < self.next_at:
            return
        self.next_at = now + every
        try:
            self.samples.append((now, [shipped(self.store, self.run_id, w) for w in range(self.workers)]))
        except Exception:  # noqa: BLE001 - a store hiccup: the next sample
            return
        while len(self.samples) > 2 and self.samples[1][0] < now - keep:
            del self.samples[0]

    def alone(self, since: float, every: float) -> int | None:
        return silent_alone(self.samples, since, every)


def host_of(store: BlobStore, worker: int) -> str:
    """Worker N's host, as its agent's heartbeat names it ("" when none does)."""
    return next((str(b.get("host")) for b in runs.heartbeats(store) if b.get("worker") == worker and b.get("host")),
                "")


def twice_in_a_row(stalls: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's last two stalls when both were held back by the same host alone: the later record, else None. A
    stall is told by its restart and its count since (`--on-stall notify` stalls again without a restart): every
    host that saw it records it under the same pair."""
    last: dict[tuple[int, int], dict[str, Any]] = {}
    for s in stalls:   # oldest first
        last[(int(s.get("restarts", 0)), int(s.get("stall", 1)))] = s
    two = [last[k] for k in sorted(last)][-2:]
    if len(two) < 2 or not all(s.get("alone_host") for s in two):
        return None
    return two[1] if two[0]["alone_host"] == two[1]["alone_host"] else None
