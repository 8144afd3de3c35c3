"""Run records in the store, shared by the CLI (submit, logs, jobs, cancel) and the agent.

    tpuctl/runs/<id>/job.json        written once by submit (create-if-absent)
    tpuctl/runs/<id>/claim[-wN]      written once by the agent (worker N) that takes it
    tpuctl/runs/<id>/status[-wN].json  state, exit code, heartbeat, host
    tpuctl/runs/<id>/logs[-wN]/000001.log ...  ordered chunks, each written once
    tpuctl/runs/<id>/cancel          written by `tpuctl cancel`
Run ids sort by submission time, so the latest run is the greatest id.
"""
from __future__ import annotations

import json
import os
import secrets
import time
from typing import Callable

FINAL = {"succeeded", "failed", "cancelled", "lost"}
PREFIX = "tpuctl/runs/"


def new_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def key(run_id: str, name: str) -> str:
    return f"{PREFIX}{run_id}/{name}"


def suffix(worker: int) -> str:
    return "" if worker == 0 else f"-w{worker}"


def chunk_key(run_id: str, worker: int, n: int) -> str:
    return key(run_id, f"logs{suffix(worker)}/{n:06d}.log")


def read_json(store, k: str) -> dict | None:
    raw = store.read(k)
    return json.loads(raw) if raw else None


def job(store, run_id: str) -> dict | None:
    return read_json(store, key(run_id, "job.json"))


def status(store, run_id: str, worker: int = 0) -> dict:
    return read_json(store, key(run_id, f"status{suffix(worker)}.json")) or {"state": "queued"}


def all_ids(store) -> list[str]:
    ids = {k[len(PREFIX):].split("/", 1)[0] for k, _ in store.list(PREFIX) if k.endswith("/job.json")}
    return sorted(ids)


def latest(store) -> str | None:
    ids = all_ids(store)
    return ids[-1] if ids else None


def follow(store, run_id: str, write: Callable[[bytes], None], worker: int = 0, follow: bool = True,
           sleep=time.sleep, max_idle: float | None = None) -> dict:
    """Write every chunk in order, once. While following, poll the next chunk with backoff when idle (so an idle
    run costs a bounded number of store requests) and stop once the run is final and its last chunk is out.
    Returns the final (or current, when not following) status."""
    max_idle = max_idle if max_idle is not None else float(os.environ.get("TPUCTL_LOG_POLL_MAX", "1.0"))
    n, idle = 1, 0.05
    while True:
        data = store.read(chunk_key(run_id, worker, n))
        if data is not None:
            write(data)
            n += 1
            idle = 0.05
            continue
        st = status(store, run_id, worker)
        if st.get("state") in FINAL:
            # The agent writes its last chunk before the final status: drain what is left, then done.
            while (data := store.read(chunk_key(run_id, worker, n))) is not None:
                write(data)
                n += 1
            return st
        if not follow:
            return st
        sleep(idle)   # idle: two requests per poll, polls spaced out to max_idle, so an idle run costs little
        idle = min(idle * 2, max_idle)
