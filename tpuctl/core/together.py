"""Calls made at once, as one step: what `up` uses where Google lets several creations run side by side (Compute
Engine's MIGs and their templates, GKE's node pools)."""
from __future__ import annotations

from typing import Any, Callable, Sequence


def together(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Each call in a thread of its own, every one waited for (none left in flight, its outcome unknown, when
    another fails or Ctrl-C comes); the first failure in call order raised, else the answers in order."""
    if len(calls) == 1:
        return [calls[0]()]
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import wait as wait_all
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(c) for c in calls]
        wait_all(futures)
    for f in futures:
        failed = f.exception()
        if failed is not None:
            raise failed
    return [f.result() for f in futures]
