"""What the agent does when its store fails under it: a full disk under a local store, a bucket outage or a quota
error on a TPU host. Nothing of it may end the agent or leave a run `running` for good.

- Records (heartbeats, statuses) are small and always tried: a failed one is logged and tried again (a final
  status until it is written, agent.write_status).
- Log chunks may fill a store only down to a floor (TPUCTL_STORE_FLOOR_BYTES, 1 MiB, where the store can say how
  much room it has: a local directory), which is left for records and for the first CHUNK_ALLOWANCE bytes of each
  later run, so after a run whose log filled the disk the next run still shows its first lines and settles. Output
  the store cannot take is held in memory up to a bound (logshipper.py) and shipped when room returns: a training
  job is worth more than its log, so it is never ended for it; what a run's end leaves unshipped is said in its
  status.
- A failure is reported once per episode (the agent's log and the run's status: "store full: N bytes free"), and
  its end once ("store writable again").
- The floor is also held back as a file (core/store.RESERVE, created while there is room for it and the floor):
  what fills the disk may be the job's own checkpoints, which no floor stops, and at 0 bytes free a run stayed
  `running` 16-38 s after its job ended and the next run did not start (issue 52.7). The first record refused
  for want of room deletes the reserve and is tried again at once, so the run settles and the queue moves on;
  the reserve is made again once the store has room.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ..core.store import RESERVE, BlobStore, floor_bytes, is_full

CHUNK_ALLOWANCE = 64 * 1024


class StoreGuard:
    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self.problem = ""   # what is wrong now, for statuses; "" when the store takes writes

    def free(self) -> int | None:
        return self.store.free_bytes()

    def _reserve(self) -> Path | None:
        """Where the reserve lives: a store that can say its room (a local directory) only."""
        if self.free() is None:
            return None
        path = Path(self.store.local_path(RESERVE))
        return path if path.parent.is_dir() else None

    def keep_reserve(self) -> None:
        """Hold the floor back as a file, when the store has room for it and for the floor besides."""
        path = self._reserve()
        free = self.free()
        if path is None or free is None or path.exists() or free < 2 * floor_bytes():
            return
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(os.urandom(floor_bytes()))   # real blocks (zeros may be stored sparse or compressed)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)   # no room after all: the floor alone keeps what it can

    def release(self) -> bool:
        """Give the reserve's room to records: True when there was one to give."""
        path = self._reserve()
        if path is None or not path.exists():
            return False
        path.unlink(missing_ok=True)
        print(f"tpuctl agent: store full: released the {floor_bytes()}-byte reserve kept for records, so runs "
              "settle and the queue moves on", file=sys.stderr, flush=True)
        return True

    def describe(self, e: BaseException) -> str:
        if is_full(e):
            free = self.free()
            return "store full" + (f": {free} bytes free" if free is not None else "")
        return f"store error: {type(e).__name__}: {e}"

    def failed(self, e: BaseException, what: str) -> bool:
        """Report a refused write; True when room was made for it (the reserve released): try it again at once."""
        problem = self.describe(e)
        if not self.problem:
            print(f"tpuctl agent: {problem} ({what}); retrying, the agent keeps serving",
                  file=sys.stderr, flush=True)
        self.problem = problem
        return is_full(e) and self.release()

    def held(self, free: int) -> None:
        if not self.problem:
            print(f"tpuctl agent: store full: {free} bytes free, below the {floor_bytes()}-byte floor kept for "
                  "records; holding log output until there is room", file=sys.stderr, flush=True)
        self.problem = f"store full: {free} bytes free"

    def wrote(self, log: bool = False) -> None:
        """A write went through: the episode is over, unless the store is full and this was only a record (which
        the floor leaves room for)."""
        if self.problem and (log or not self.problem.startswith("store full")):
            free = self.free() if self.problem.startswith("store full") else None
            if free is not None and free < floor_bytes():
                return   # a new run's first lines fit the allowance below the floor: the store is still full
            print("tpuctl agent: store writable again", file=sys.stderr, flush=True)
            self.problem = ""
            self.keep_reserve()

    def room_for_log(self, size: int, shipped: int) -> bool:
        """Whether a log chunk of `size` bytes may be written by a run that has shipped `shipped` bytes so far."""
        free = self.free()
        if free is None or shipped + size <= CHUNK_ALLOWANCE and size < free:
            return True
        if free - size >= floor_bytes():
            return True
        self.held(free)
        return False
