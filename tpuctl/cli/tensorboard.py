"""`tpuctl tensorboard`: TensorBoard over runs' event files. A run whose outputs are a local directory (the local
provider) is read in place; a run in a bucket has its event files synced into a local cache, again every few
seconds as they grow (only what changed is fetched: download.py), so TensorBoard never needs cloud credentials
of its own or a TensorFlow build with GCS support. TensorBoard runs as a child process; its own output goes to
$TPUCTL_HOME/tensorboard.log."""
from __future__ import annotations

import importlib.util
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from ..control import download
from ..core import knobs, layout, state
from ..core.errors import ErrorKind, TpuctlError
from ..core.store import BlobStore

EXTRA = "pip install 'tpuctl[tensorboard]'"


def sync_seconds() -> float:
    """How often a bucket's event files are fetched again (TPUCTL_TB_SYNC_SECONDS, 15 s)."""
    return knobs.number("TPUCTL_TB_SYNC_SECONDS", 15)


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


# TensorBoard's line once it has bound its port (tensorboard/program.py, TensorBoardServer.print_serving_message):
# "TensorBoard 2.20.0 at http://localhost:6006/ (Press CTRL+C to quit)".
_SERVING = re.compile(rb"TensorBoard \S+ at \S+?:(\d+)/? \(Press CTRL\+C")


# Werkzeug's words when the port TensorBoard found free was bound by another program before it could bind it
# (werkzeug/serving.py BaseWSGIServer.__init__: on EADDRINUSE it prints them and exits 1, so TensorBoard's scan of
# ports from 6006, which moves on only on its own TensorBoardPortInUseError, ends there): two TensorBoards started
# at once, as two `tpuctl tensorboard` can be. Started again, its scan passes the port now taken.
_PORT_RACE = "is in use by another program"
PORT_RACES = 3


def serve(sources: Sources, port: Optional[int], host: str, ready: Callable[[str], None],
          stopped: Callable[[], bool] = lambda: False) -> int:
    """Run TensorBoard until it exits or the user interrupts; syncs cached runs meanwhile. Returns its exit code.
    Without a port, TensorBoard takes the first free one from 6006 itself (program.py: with no --port it tries 100
    in turn, binding each): a port tpuctl probed and released could be taken by another TensorBoard before this one
    bound it, and the other's would then be announced as this one's. One that lost that race (_PORT_RACE) before it
    served is started again, up to PORT_RACES times."""
    log = state.home() / "tensorboard.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)   # through the `finally` below: TensorBoard never outlives the CLI
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        race = 0
        while True:
            proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir_spec",
                                     sources.logdir_spec(), *(["--port", str(port)] if port is not None else []),
                                     "--host", host, "--reload_interval", "5"],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            try:
                output = _Output(proc, log)
                announced = _watch(proc, output, sources, host, ready, stopped)
                if proc.poll() is None or proc.returncode == 0:
                    return 0
                output.thread.join(5)
                if port is None and not announced and race < PORT_RACES and \
                        any(_PORT_RACE in line for line in output.tail):
                    race += 1
                    continue
                raise TpuctlError(ErrorKind.ERROR, f"TensorBoard exited with code {proc.returncode}: "
                                  + " / ".join(output.tail), f"its whole output is in {log}")
            finally:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _watch(proc: subprocess.Popen[bytes], output: _Output, sources: Sources, host: str, ready: Callable[[str], None],
           stopped: Callable[[], bool]) -> bool:
    """Syncs the runs while TensorBoard runs and tpuctl is not stopped; says its address once it listens there.
    Whether it did."""
    announced = False
    next_sync = 0.0
    while proc.poll() is None and not stopped():
        if time.monotonic() >= next_sync:
            sources.sync()
            next_sync = time.monotonic() + sync_seconds()
        bound = None if announced else output.port
        if bound is not None and _listening(host, bound):
            ready(f"http://{'localhost' if host in ('127.0.0.1', 'localhost') else host}:{bound}/")
            announced = True
        time.sleep(0.2)
    return announced


class _Output:
    """TensorBoard's output, copied line by line into the log (which other `tpuctl tensorboard` commands of this
    home append to as well), and the port it says it bound, read from its own lines only."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.port: Optional[int] = None
        self.tail: list[str] = []
        self.thread = threading.Thread(target=self._copy, args=(proc, log), daemon=True)
        self.thread.start()

    def _copy(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        assert proc.stdout is not None
        with open(log, "ab") as out:
            for line in proc.stdout:
                out.write(line)
                out.flush()
                self.tail = (self.tail + [line.decode(errors="replace").strip()])[-3:]
                m = _SERVING.search(line)
                if m and self.port is None:
                    self.port = int(m.group(1))


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host if host != "0.0.0.0" else "127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
