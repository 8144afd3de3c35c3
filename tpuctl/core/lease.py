"""One writer at a time for a cluster's compute, across machines: a lease object in the store (layout.WATCH_LEASE),
changed only by conditional writes (BlobStore.write_if: GCS `ifGenerationMatch`), with an expiry its holder renews.

Watchers hold it while they watch, so a second watcher stands by and a dead one's lease lapses after `ttl`
seconds. `up` and `down` of an armed cluster take it too: they ask the holder to step aside (`wanted_by`), the
holder does so at its next look (after the re-create it may be in the middle of), and hands the lease to them
alone for one `ttl` (`reserved_for`), so a watcher that looks again first cannot take it back.

A lease that cannot be read (deleted, overwritten with something that is not a record, its expiry zeroed) is free:
whoever writes it first on the generation they read holds it (the precondition lets one writer win), its holder
included, whose keeper takes it back the same way rather than stop renewing it.

Expiry is the writer's wall clock: machines whose clocks disagree by more than a fraction of `ttl` (60 s by
default, TPUCTL_LEASE_SECONDS) could both believe they hold it; NTP-synced hosts are well inside that.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable

from . import knobs
from .errors import ErrorKind, TpuctlError
from .store import BlobStore


def ttl_seconds() -> float:
    return knobs.number("TPUCTL_LEASE_SECONDS", 60)


def _free(rec: dict[str, Any] | None, me: str, now: float) -> bool:
    if rec is None:
        return True
    if float(rec.get("expires", 0)) <= now:
        reserved = rec.get("reserved_for")
        return not reserved or reserved == me or float(rec.get("reserved_until", 0)) <= now
    return rec.get("id") == me


class Lease:
    def __init__(self, store: BlobStore, key: str, where: str, ttl: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.key, self.where = store, key, where
        self.ttl = ttl if ttl is not None else ttl_seconds()
        self.clock = clock
        self.id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self.fields: dict[str, Any] = {}

    def _read(self) -> tuple[dict[str, Any] | None, int]:
        raw, gen = self.store.read_generation(self.key)
        try:
            return (json.loads(raw) if raw else None), gen
        except ValueError:
            return None, gen   # unreadable: treated as free, and overwritten by the next holder

    def holder(self) -> dict[str, Any] | None:
        """The record of whoever holds it now, None when nobody does."""
        rec, _ = self._read()
        return rec if rec and float(rec.get("expires", 0)) > self.clock() else None

    def _write(self, gen: int, **extra: Any) -> bool:
        now = self.clock()
        rec = {"id": self.id, "where": self.where, "renewed": now, "expires": now + self.ttl, **self.fields, **extra}
        return self.store.write_if(self.key, json.dumps(rec).encode(), gen)

    def acquire(self) -> bool:
        """Take it if it is free (or already ours); False when someone else holds it."""
        rec, gen = self._read()
        if not _free(rec, self.id, self.clock()):
            return False
        return self._write(gen)

    def renew(self, **fields: Any) -> bool:
        """Keep holding it (with `fields`, e.g. what the holder is doing). False when it is no longer ours, or when
        someone asked for it: then it is handed to them, and the caller must stop acting."""
        self.fields.update(fields)
        rec, gen = self._read()
        if not rec or rec.get("id") != self.id or float(rec.get("expires", 0)) <= self.clock():
            return False
        if rec.get("wanted_by"):
            now = self.clock()
            self.store.write_if(self.key, json.dumps({**rec, "expires": 0, "reserved_for": rec["wanted_by"],
                                                      "reserved_until": now + self.ttl}).encode(), gen)
            return False
        return self._write(gen)

    def release(self) -> None:
        rec, gen = self._read()
        if rec and rec.get("id") == self.id:
            self.store.write_if(self.key, json.dumps({**rec, "expires": 0, "wanted_by": ""}).encode(), gen)

    def take(self, timeout: float, waiting: Callable[[str], None], poll: float = 0.2) -> None:
        """Acquire for a command (`up`, `down`): ask the holder to step aside and wait for it (it finishes the
        re-create it may be doing first). TIMEOUT past `timeout` seconds."""
        deadline = time.monotonic() + timeout
        told = False
        while not self.acquire():
            rec, gen = self._read()
            if rec and float(rec.get("expires", 0)) > self.clock() and rec.get("wanted_by") != self.id:
                self.store.write_if(self.key, json.dumps({**rec, "wanted_by": self.id}).encode(), gen)
            if time.monotonic() >= deadline:
                raise TpuctlError(ErrorKind.TIMEOUT, f"the recovery watcher on {rec.get('where') if rec else '?'} did "
                                  f"not step aside within {timeout:.0f}s",
                                  "look at it (`tpuctl status`), stop it, or wait for its lease to lapse and retry")
            if not told and rec:
                waiting(f"asking the recovery watcher on {rec.get('where', '?')} to step aside"
                        + (f" (it is {rec['doing']})" if rec.get("doing") else ""))
                told = True
            time.sleep(poll)

    def keep(self, also: Callable[[], None] = lambda: None) -> "Keeper":
        """Renew in the background while a long step (a re-create) runs; `also` is called at each renewal."""
        return Keeper(self, also)


class Keeper:
    def __init__(self, lease: Lease, also: Callable[[], None] = lambda: None) -> None:
        self.lease, self.also = lease, also
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="lease-keeper")

    def _run(self) -> None:
        while not self.stop.wait(self.lease.ttl / 3):
            try:
                self.renew()
            except Exception:  # noqa: BLE001 - a failed renewal is retried; a lapsed lease is seen at the next look
                pass
            try:
                self.also()
            except Exception:  # noqa: BLE001 - as above: tried again at the next renewal
                pass

    def renew(self) -> None:
        lease = self.lease
        rec, gen = lease._read()
        if rec and rec.get("id") == lease.id:
            # wanted_by is kept: the holder steps aside once the step it is in is done
            lease._write(gen, wanted_by=rec.get("wanted_by", ""))
        elif _free(rec, lease.id, lease.clock()):
            lease._write(gen)   # damaged or lapsed: taken back, unless another writer took it first

    def __enter__(self) -> "Keeper":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
