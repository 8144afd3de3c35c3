"""What the host's parts share of the agent, named: each part (claims.py, autostop.py, rounds.py, ...) takes this,
plain values and callables, never the agent itself, so a change to the agent's fields stops at agent.py and each
part is tested with only what it reads (tests/test_host_parts.py). tests/test_structure.py keeps it so: no part
imports agent.py or attempt.py, not even for its types."""
from __future__ import annotations

from typing import Any, Callable, Protocol

from ..core.store import BlobStore

Failed = Callable[[BaseException, str], object]   # a store error reported, and what it was doing (storeguard.py)


class Seat(Protocol):
    """This host's place in its cluster, read live: the agent re-reads the cluster record every tick, and with it
    the host's index across slices (agent.py's read_record), so a part that lives as long as the agent asks each
    time. The agent is one; a test's is a plain object with these fields."""

    @property
    def store(self) -> BlobStore: ...

    @property
    def host(self) -> str: ...

    @property
    def worker(self) -> int:
        """This host's index across every slice."""
        ...

    @property
    def workers(self) -> int:
        """Hosts across every slice."""
        ...

    @property
    def record(self) -> dict[str, Any]:
        """The cluster record (layout.CLUSTER_RECORD) as last read."""
        ...

    @property
    def accelerator(self) -> str: ...
