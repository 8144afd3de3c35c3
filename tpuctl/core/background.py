"""A daemon thread with a result, for resources made at the same time (a TPU takes minutes, a bucket seconds)."""
from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Background(Generic[T]):
    """Ctrl-C in the main thread is never stuck behind a worker's long wait: result() joins in short slices."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._result: list[T] = []
        self._error: BaseException | None = None
        self._t = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._t.start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._result.append(fn())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            self._error = e

    def result(self) -> T:
        while self._t.is_alive():
            self._t.join(0.2)
        if self._error is not None:
            raise self._error
        return self._result[0]
