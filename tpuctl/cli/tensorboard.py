"""`tpuctl tensorboard`: TensorBoard over runs' event files. A run whose outputs are a local directory (the local
provider) is read in place; a run in a bucket has its event files synced into a local cache, again every few
seconds as they grow (only what changed is fetched: download.py), so TensorBoard never needs cloud credentials
of its own or a TensorFlow build with GCS support. TensorBoard runs as a child process; its own output goes to
$TPUCTL_HOME/tensorboard.log."""
from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from ..control import download
from ..core import layout, state
from ..core.errors import ErrorKind, TpuctlError
from ..core.store import BlobStore

EXTRA = "pip install 'tpuctl[tensorboard]'"


def sync_seconds() -> float:
    """How often a bucket's event files are fetched again (TPUCTL_TB_SYNC_SECONDS, 15 s)."""
    return float(os.environ.get("TPUCTL_TB_SYNC_SECONDS", "15"))


def require_installed() -> None:
    if importlib.util.find_spec("tensorboard") is None:
        raise TpuctlError(ErrorKind.INPUT, "TensorBoard is not installed", f"{EXTRA} (it does not need TensorFlow)")


def _events(rel: str) -> bool:
    return ".tfevents." in rel.rsplit("/", 1)[-1]


class Sources:
    """Where TensorBoard reads each run, and the sync that keeps cached runs current."""

    def __init__(self, store: BlobStore, cluster: str, run_ids: list[str]) -> None:
        self.store = store
        self.dirs: dict[str, Path] = {}
        self.cached: list[str] = []
        for rid in run_ids:
            here = Path(store.local_path(layout.run_output(rid)))
            if here.is_dir():
                self.dirs[rid] = here
            else:
                self.dirs[rid] = state.home() / "tensorboard" / cluster / rid
                self.cached.append(rid)

    def sync(self) -> int:
        """Fetch new and grown event files of the cached runs; returns how many files were fetched."""
        fetched = 0
        for rid in self.cached:
            got = download.outputs(self.store, rid, self.dirs[rid], lambda total: (lambda n: None), want=_events,
                                   in_place=True)
            fetched += got.fetched
        return fetched

    def logdir_spec(self) -> str:
        for rid, d in self.dirs.items():
            d.mkdir(parents=True, exist_ok=True)   # TensorBoard shows a run once its first events arrive
        return ",".join(f"{rid}:{d}" for rid, d in self.dirs.items())


def check_port(port: int, host: str) -> int:
    """A port given with --port, refused before TensorBoard starts: out of range, or taken on that address."""
    if not 1 <= port <= 65535:
        raise TpuctlError(ErrorKind.INPUT, f"--port {port} is not a port", "ports run from 1 to 65535; leave --port "
                          "out for the first free one from 6006")
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise TpuctlError(ErrorKind.INPUT, f"--port {port} cannot be used on {host}: {e.strerror}",
                              "pick another, or leave --port out for the first free one from 6006") from None
    return port


def free_port(start: int = 6006) -> int:
    for port in range(start, start + 100):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise TpuctlError(ErrorKind.ERROR, f"no free port in {start}-{start + 99}", "pass --port P")


def serve(sources: Sources, port: int, host: str, ready: Callable[[str], None],
          stopped: Callable[[], bool] = lambda: False) -> int:
    """Run TensorBoard until it exits or the user interrupts; syncs cached runs meanwhile. Returns its exit code."""
    log = state.home() / "tensorboard.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir_spec", sources.logdir_spec(),
                                 "--port", str(port), "--host", host, "--reload_interval", "5"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)   # through the `finally` below: TensorBoard never outlives the CLI
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        url = f"http://{'localhost' if host in ('127.0.0.1', 'localhost') else host}:{port}/"
        announced = False
        next_sync = 0.0
        while proc.poll() is None and not stopped():
            if time.monotonic() >= next_sync:
                sources.sync()
                next_sync = time.monotonic() + sync_seconds()
            if not announced and _listening(host, port):
                ready(url)
                announced = True
            time.sleep(0.2)
        if proc.poll() is not None and proc.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise TpuctlError(ErrorKind.ERROR, f"TensorBoard exited with code {proc.returncode}: "
                              + " / ".join(tail), f"its whole output is in {log}")
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host if host != "0.0.0.0" else "127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
