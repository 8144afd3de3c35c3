"""Reading what a run's job or host wrote (metrics.json, status.json, job.json, tpu-metrics.json), which tpuctl must
not trust: each file parsed alone and defensively, so one run's bad file is that run's problem, said on its row, and
never the cluster's (`jobs`, `logs`, the page).

- At most a cap of bytes is read (a 54 MB metrics.json made every page load it whole, 2.1 GB held); past it the file
  is not parsed and its run says so.
- NaN, Infinity, -Infinity (Python's json takes them; JSON, RFC 8259 section 6, has no such numbers) and numbers
  that overflow a float (1e400, a 400-digit integer: float() raises OverflowError on it) read as None, so a figure
  that is not a number is dropped, never shown, and never written back out as invalid JSON.
- Nesting deeper than Python's recursion limit raises RecursionError in json.loads (no ValueError): read as
  unreadable.
- A file that is a link leading out of a local store is refused by LocalStore (its keys stay inside its root).

`finite` makes any value safe to print as strict JSON (`jobs --json`, every answer of `tpuctl ui`).
No third-party import here: the CLI and the agent read this module."""
from __future__ import annotations

import json
import math
from typing import Any

from . import knobs

DIGITS = 18   # an integer longer than this is no step, time or byte count a job writes: read as None


def cap_bytes() -> int:
    """The most of one run file read (TPUCTL_RUN_FILE_MAX_BYTES, 4 MiB: a metrics.json at its cap of 300 points
    per metric holds some 10 KB a metric)."""
    return knobs.count("TPUCTL_RUN_FILE_MAX_BYTES", 4 * 2 ** 20)


class Unreadable(ValueError):
    """A run file that cannot be used, with why in words a row shows."""


def _float(text: str) -> float | None:
    v = float(text)
    return v if math.isfinite(v) else None


def _int(text: str) -> int | None:
    return int(text) if len(text.lstrip("-")) <= DIGITS else None


def loads(raw: bytes | str) -> Any:
    """JSON as a job may have written it, non-numbers as None (above); Unreadable when it is no JSON at all."""
    try:
        return json.loads(raw, parse_constant=lambda name: None, parse_float=_float, parse_int=_int)
    except RecursionError:
        raise Unreadable("nested too deeply") from None
    except ValueError as e:   # UnicodeDecodeError is one
        raise Unreadable(f"not JSON ({str(e)[:80]})") from None


def read(store: Any, key: str, cap: int | None = None) -> bytes | None:
    """The file's bytes (None: absent), read no further than `cap` (default cap_bytes()); Unreadable when it is
    larger, or a link out of the store. A store that can read a part (LocalStore.read_head) reads no more."""
    cap = cap_bytes() if cap is None else cap
    name = key.rsplit("/", 1)[-1]
    try:
        head = getattr(store, "read_head", None)
        raw = head(key, cap + 1) if head is not None else store.read(key)
    except ValueError as e:   # LocalStore: a key (a link) that leads out of its root
        raise Unreadable(f"{name} is a link out of the store") from e
    if raw is not None and len(raw) > cap:
        raise Unreadable(f"{name} is larger than {cap:,} bytes (TPUCTL_RUN_FILE_MAX_BYTES): not read")
    return raw


def read_object(store: Any, key: str, cap: int | None = None) -> dict[str, Any] | None:
    """read() and loads(), a JSON object or Unreadable; None when absent."""
    raw = read(store, key, cap)
    if raw is None:
        return None
    name = key.rsplit("/", 1)[-1]
    try:
        doc = loads(raw)
    except Unreadable as e:
        raise Unreadable(f"{name} is unreadable: {e}") from None
    if not isinstance(doc, dict):
        raise Unreadable(f"{name} is unreadable: not a JSON object")
    return doc


def finite(value: Any, depth: int = 0) -> Any:
    """`value` with every float that is not finite as None (json.dumps would write NaN, which no strict parser
    takes), tuples as lists; what lies deeper than 64 levels is cut off (no figure tpuctl shows is)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth > 64:
        return None
    if isinstance(value, dict):
        return {str(k): finite(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v, depth + 1) for v in value]
    return value


def dumps(value: Any, **kw: Any) -> str:
    """Strict JSON: finite() first, then json.dumps refusing what would still not be JSON."""
    return json.dumps(finite(value), allow_nan=False, default=str, **kw)
