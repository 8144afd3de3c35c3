"""Ctrl-C held off while a few store writes must all happen or none: a run's entries once its job.json is written,
and the removal of what a stopped submit wrote (a second Ctrl-C, as impatient hands press it, must not leave half
of either)."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def held() -> Iterator[list[int]]:
    """SIGINT inside the block is noted (the list holds it afterwards) instead of raised. Only the main thread can
    set signal handlers: elsewhere the block runs as it is."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    before = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, before)
