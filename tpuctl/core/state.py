"""Where tpuctl keeps what it made: one JSON file per cluster under $TPUCTL_HOME (default: XDG state dir)."""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from typing import Callable

from .errors import TpuctlError, bad_input
from .models import ClusterState


def home() -> Path:
    if os.environ.get("TPUCTL_HOME"):
        return Path(os.environ["TPUCTL_HOME"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(base) / "tpuctl"


def _path(name: str) -> Path:
    return home() / "clusters" / f"{name}.json"


def load(name: str) -> ClusterState | None:
    p = _path(name)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        return None
    try:
        # json.loads takes bytes and decodes them as UTF-8: binary garbage is a UnicodeDecodeError, a ValueError
        return ClusterState.from_json(json.loads(raw))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise bad_input(f"state file {p} is unreadable ({type(e).__name__}: {e})",
                        f"if the cluster's resources are gone, delete {p}; else restore it from a backup")


def save(st: ClusterState) -> None:
    p = _path(st.name)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(st.to_json(), indent=2, sort_keys=True))
    os.replace(tmp, p)  # atomic: a crash never leaves half a state file
    _remember_provider(st.spec.provider.value)


def _used_path() -> Path:
    return home() / "providers-used"


def _remembered() -> set[str]:
    try:
        return set(_used_path().read_text().split())
    except OSError:
        return set()


def remember_provider(provider: str) -> None:
    """An `up` of `provider` about to make something, which may fail before any state is saved: the hints that say
    how to make a cluster then name that provider's way, not the local provider's (issue 63.5)."""
    home().mkdir(parents=True, exist_ok=True)
    _remember_provider(provider)


def _remember_provider(provider: str) -> None:
    """Note that a cluster of `provider` was made here: the hints that say how to make one follow the providers the
    user works with even once every cluster is gone (`down --delete-bucket` removes a cluster's state). Appended, one
    name a line: two processes noting the same provider at once write it twice, which reads the same."""
    if provider not in _remembered():
        with open(_used_path(), "a") as f:
            f.write(provider + "\n")


def providers_used() -> set[str]:
    """The providers of the clusters made on this machine, those since removed included."""
    return _remembered() | {st.spec.provider.value for st in all_clusters()}


def next_stamp(ms: int) -> int:
    """`ms`, or one past the last stamp handed out on this machine if that is later: run ids (runs.new_id) made
    by processes submitting at once, or across a clock step back, stay in the order they were made. Without a
    writable state directory the clock alone orders them."""
    path = home() / "last-run-stamp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return ms
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        last = os.read(fd, 32).strip()
        ms = max(ms, int(last) + 1) if last.isdigit() else ms
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(ms).encode())
        return ms
    finally:
        os.close(fd)


def remove(name: str) -> None:
    _path(name).unlink(missing_ok=True)


def cluster_names() -> list[str]:
    d = home() / "clusters"
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def live_cluster_names() -> list[str]:
    """The clusters here not taken down (a down cluster's state is kept for `up` to bring it back)."""
    from .models import Phase
    return [st.name for st in all_clusters() if st.phase is not Phase.DOWN]


def all_clusters(unreadable: Callable[[TpuctlError], None] = lambda e: None) -> list[ClusterState]:
    """Every cluster with a readable state file; each unreadable one is reported, not fatal to the rest."""
    out = []
    for name in cluster_names():
        try:
            st = load(name)
        except TpuctlError as e:
            unreadable(e)
            continue
        if st:
            out.append(st)
    return out


def how_to_make(name: str, what: str = "it") -> str:
    """The `up` command that makes cluster NAME, for the provider the user works with: the one their clusters use,
    or used (all local: `--provider local`), else each provider's. A hint with Google Cloud flags for someone who has
    only ever made local clusters sent them the wrong way (issue 40), also after those clusters were removed (issue
    52); a provider set in the config file or TPUCTL_PROVIDER first. `what`: what the command makes ("it", "one")."""
    from .config import setting   # the provider the user set (config file, TPUCTL_PROVIDER) says it all
    configured = setting("provider", None, None)
    used = {str(configured)} if configured else providers_used()
    ways = {"local": f"tpuctl up --provider local -c {name}",
            "kaggle": f"tpuctl up --provider kaggle --type v5e-8 -c {name}",
            "gcp": f"tpuctl up --type v5litepod-8 --zone us-west4-a -c {name}",
            "gke": f"tpuctl up --provider gke --type v6e-16 --zone us-east5-b -c {name}"}
    if len(used) == 1 and used <= ways.keys():
        return f"`{ways[used.pop()]}` makes {what}"
    return (f"make {what}: `{ways['local']}` (this machine), `{ways['gcp']}` (Google Cloud), `{ways['kaggle']}` "
            f"(Kaggle) or `{ways['gke']}` (GKE)")
