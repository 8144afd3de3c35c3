"""Warm restarts: JAX's persistent compilation cache for a job, on the host's disk, so a restart (a preemption, a
crash, `--max-restarts`, a `tpuctl drill`) loads the compiled programs instead of compiling them again.

- Where: `<agent home>/compile-cache/<key>/`, kept across the attempts of a run and across runs of the same job on
  this host. The key is a hash of the job's code (its package's sha256), its environment (jobenv's directory, a hash
  of its requirements and the TensorFlow/JAX asked for) and the JAX, jaxlib and libtpu versions the agent sees, so
  jobs whose code or versions differ never share a directory. (JAX's own key already covers the program, jaxlib,
  the platform and its version, XLA flags and the topology: jax/_src/cache_key.py; ours keeps one job's entries
  together, to bound and ship them.)
- How: the job's environment gets JAX's own variables, which JAX reads as its flags' defaults (jax/_src/config.py:
  each `*_state` flag takes `os.getenv(NAME.upper())`; jax 0.10.2): JAX_COMPILATION_CACHE_DIR; and, as JAX's
  "Persistent compilation cache" page's quick start does to cache every program,
  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 (the default, 1 s, leaves a small CPU compile out) and
  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1 (no size floor, no filesystem override); JAX_COMPILATION_CACHE_MAX_SIZE
  bounds it (JAX deletes the least recently used entries past it). A value the job sets itself wins.
  https://docs.jax.dev/en/latest/persistent_compilation_cache.html
- A host made again (a preempted TPU VM, a new pod) has an empty disk: the cache comes back from the cluster's
  store (tpuctl/compile-cache/<key>.tar.gz), written by worker 0 only (JAX itself writes entries from process 0
  only: jax/_src/compiler.py `_cache_write`, "Only write cache entries from the first process"), after each exit of
  the job when entries were added, within the same bound.
- Off: `submit --no-compile-cache`, or TPUCTL_COMPILE_CACHE=0 in the job's [env].
- PyTorch/XLA has a persistent cache too (`torch_xla.runtime.initialize_cache(path)`, called by the job itself
  before any computation: pytorch/xla torch_xla/runtime.py); tpuctl runs no PyTorch job yet, so it sets nothing.
"""
from __future__ import annotations

import hashlib
import io
import os
import tarfile
from importlib import metadata
from pathlib import Path
from typing import Callable

from ..core import knobs, layout
from ..core.runs import RunSpec
from ..core.store import BlobStore

OFF_ENV = "TPUCTL_COMPILE_CACHE"     # "0" in the job's env: no cache (submit --no-compile-cache)
DIR_ENV = "JAX_COMPILATION_CACHE_DIR"
VERSIONED = ("jax", "jaxlib", "libtpu", "libtpu-nightly", "jax-cuda12-plugin")
SHIPPED = ".shipped"      # the entries the store's copy holds (restored from it, or shipped to it)
DEFAULT_BYTES = 4 << 30   # BERT-base's programs take tens of MB; a bound, not a target


def enabled(job: RunSpec) -> bool:
    return job.env.get(OFF_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def limit_bytes() -> int:
    return int(knobs.number("TPUCTL_COMPILE_CACHE_BYTES", DEFAULT_BYTES))


def versions() -> str:
    """The JAX stack's versions as this interpreter sees them ("" for those not installed)."""
    found = []
    for name in VERSIONED:
        try:
            found.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ",".join(found)


def key(job: RunSpec, env_dir: Path | None) -> str:
    h = hashlib.sha256()
    for part in (job.package, env_dir.name if env_dir else "", versions()):
        h.update(hashlib.sha256(part.encode()).digest())
    return h.hexdigest()[:16]


def local_dir(home: Path, cache_key: str) -> Path:
    return home / "compile-cache" / cache_key


def environment(home: Path, store: BlobStore, job: RunSpec, env_dir: Path | None) -> dict[str, str]:
    """JAX's cache variables for the job (empty when off), the directory filled from the store first when this
    host has none of it (a host made again)."""
    if not enabled(job) or job.env.get(DIR_ENV):
        return {}
    cache_key = key(job, env_dir)
    d = local_dir(home, cache_key)
    d.mkdir(parents=True, exist_ok=True)
    if not _entries(d):
        restore(store, cache_key, d)
    return {DIR_ENV: str(d), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
            "JAX_COMPILATION_CACHE_MAX_SIZE": str(limit_bytes())}


def _entries(d: Path) -> dict[str, int]:
    """The cache's files, name -> size (JAX's entries and its `-atime` files; temporaries left out)."""
    try:
        return {p.name: p.stat().st_size for p in d.iterdir() if p.is_file() and not p.name.startswith(".")}
    except OSError:
        return {}


def restore(store: BlobStore, cache_key: str, d: Path) -> int:
    """Entries unpacked from the store's copy into `d`; 0 when there is none (or it is unreadable: a cold start)."""
    try:
        raw = store.read(layout.compile_cache(cache_key))
    except Exception:   # noqa: BLE001 - an unreadable store means a cold start, said by the store's own checks
        return 0
    if not raw:
        return 0
    n = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
            for member in tar.getmembers():
                name = os.path.basename(member.name)
                f = tar.extractfile(member) if member.isfile() and name == member.name else None
                if f is None or name.startswith("."):
                    continue   # only plain files at the top: a crafted name never leaves the directory
                (d / name).write_bytes(f.read())
                n += 1
    except (tarfile.TarError, OSError, EOFError):
        return n
    (d / SHIPPED).write_text("\n".join(_entries(d)))
    return n


def ship(store: BlobStore, home: Path, env: dict[str, str], worker: int,
         note: Callable[[str], None] = lambda _: None) -> bool:
    """Worker 0's cache, packed to the store when it holds entries the store's copy lacks (SHIPPED lists those
    shipped or restored), the least recently used left out past the bound; called before each (re)start of the job
    and at the attempt's end, so a host made again finds what the last attempt compiled. True when written; a store
    error is said in the run's log and never ends the run. A directory the job named itself (its own
    JAX_COMPILATION_CACHE_DIR) is the job's: never shipped."""
    where = env.get(DIR_ENV, "")
    d = Path(where)
    if worker != 0 or not where or d.parent != home / "compile-cache":
        return False
    now = _entries(d)
    if not now or set(now) <= _shipped(d):
        return False
    kept = _within_bound(d, now, limit_bytes())
    try:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for name in kept:
                tar.add(d / name, arcname=name)
        store.write(layout.compile_cache(d.name), buf.getvalue())
        (d / SHIPPED).write_text("\n".join(now))
    except Exception as e:   # noqa: BLE001 - a cache is an optimisation: the run goes on without it
        note(f"tpuctl: the compile cache was not copied to the store ({type(e).__name__}: {e})")
        return False
    return True


def _shipped(d: Path) -> set[str]:
    try:
        return set((d / SHIPPED).read_text().split())
    except OSError:
        return set()


def _within_bound(d: Path, entries: dict[str, int], bound: int) -> list[str]:
    """The most recently used entries whose sizes sum to at most `bound`."""
    def used(name: str) -> float:
        try:
            return (d / name).stat().st_mtime
        except OSError:
            return 0.0
    kept, total = [], 0
    for name in sorted(entries, key=used, reverse=True):
        if total + entries[name] > bound:
            continue
        kept.append(name)
        total += entries[name]
    return kept

