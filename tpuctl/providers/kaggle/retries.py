"""How a call to Kaggle is retried, as kaggle_api_extended's `with_retry` does: up to ATTEMPTS attempts; a 429 waits
its Retry-After; a connection error backs off 0.5 s x 1.7^n; a call that makes something is sent again only where
it cannot have arrived (client.py)."""
from __future__ import annotations

from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from ...core import knobs

ATTEMPTS = 10   # kaggle_api_extended `with_retry(max_retries=10)`


def retry_after(response: Any) -> float | None:
    """The seconds a 429's Retry-After asks for (RFC 9110 10.2.3: seconds or an HTTP date), None without one."""
    value = response.headers.get("Retry-After") if response is not None else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(value) - datetime.now(timezone.utc)).total_seconds())
    except (TypeError, ValueError):
        return None


def backoff(attempt: int) -> float:
    """kaggle_api_extended `_calculate_backoff_delay`: 0.5 s x 1.7^attempt (TPUCTL_RETRY_BASE replaces 0.5)."""
    return knobs.number("TPUCTL_RETRY_BASE", 0.5) * 1.7 ** attempt


def unsent(e: Exception) -> bool:
    """The request cannot have reached Kaggle: the connection itself was refused or timed out."""
    import requests
    return isinstance(e, requests.ConnectTimeout) or "NewConnectionError" in repr(e) or \
        "Connection refused" in str(e)
