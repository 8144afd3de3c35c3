"""The agent's installable package, uploaded by `up` to the store (layout.agent_package), so every host runs the
same tpuctl as the CLI that made the cluster; the host's start-up script pip-installs it from there.

A wheel, built from this very installation. It holds what the host runs and nothing else: the import closure of
`tpuctl.agent` (the host's entry point), `tpuctl.runtime` (what its jobs import) and
`tpuctl.host.session` (what a Kaggle session or a tpuctl notebook runs), function-level imports
included, with each package's __init__; so host/, the core modules they use and the store clients, never cli/ or
control/. Its metadata's only dependency is what the agent needs on a host (google-cloud-storage), not the CLI's
typer/rich/compute. A wheel and not an sdist because installing an sdist builds it first, and pip's build
isolation would fetch a build backend from the network while the host boots (PEP 517); a wheel installs by
unpacking. Deterministic: sorted entries, fixed timestamps, so the same tpuctl uploads the same bytes.
"""
from __future__ import annotations

import ast
import base64
import functools
import hashlib
import io
import zipfile
from pathlib import Path

from .. import __version__
from ..core import layout
from .google.gcs_store import STORAGE

REQUIRES = [STORAGE]   # the store client range gcs_store relies on
_DIST_INFO = f"tpuctl-{__version__}.dist-info"
ENTRY_POINTS = ("tpuctl.agent", "tpuctl.runtime", "tpuctl.host.session")   # session: what a Kaggle session runs

# The recovery watcher's VM (`up --recover --watcher vm`) runs `tpuctl.watcher`, which re-creates the TPU through
# `up`'s code path: the agent's modules too (it uploads the agent package, built from what it has installed, as
# any `up` does: the same bytes), the start-up script template, and the TPU and Compute clients.
WATCHER = ENTRY_POINTS + ("tpuctl.watcher",)
WATCHER_REQUIRES = REQUIRES + ["google-cloud-tpu>=1.18", "google-cloud-compute>=1.18"]


def key(entry_points: tuple[str, ...] = ENTRY_POINTS) -> str:
    return layout.agent_package(__version__) if entry_points == ENTRY_POINTS else layout.watcher_package(__version__)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, module: str, known: set[str] | frozenset[str] = frozenset(),
               typing_too: bool = False) -> set[str]:
    """Every module the file imports when it runs, anywhere in it (function-level imports too; not those under `if
    TYPE_CHECKING:` unless `typing_too`: a type-only import still ties the modules together, tests/test_structure.py),
    as absolute names. `from P import m` of a module m in `known` imports m (P's __init__ is implied); of anything
    else, it imports P."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    typing_only = set() if typing_too else \
        {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
         for stmt in block.body for n in ast.walk(stmt)}   # never imported at run time
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                base = ".".join(anchor[:len(anchor) - node.level + 1] + ([base] if base else []))
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return out


def modules(src: Path) -> dict[str, Path]:
    """Every module of the tpuctl package rooted at src: dotted name -> file."""
    found = {}
    for p in sorted(src.rglob("*.py")):
        parts = ("tpuctl",) + p.relative_to(src).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return found


def host_closure(src: Path, entry_points: tuple[str, ...] = ENTRY_POINTS) -> dict[str, Path]:
    """The modules the host may import: `entry_points` and everything they reach, with their packages."""
    known = modules(src)
    taken: dict[str, Path] = {}
    todo = list(entry_points)
    while todo:
        mod = todo.pop()
        if mod in taken or mod not in known:
            continue
        taken[mod] = known[mod]
        parts = mod.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += imports_of(known[mod], mod, set(known))
    return taken


def _files(entry_points: tuple[str, ...]) -> list[tuple[str, bytes]]:
    src = Path(__file__).parent.parent   # the tpuctl package
    out = [("tpuctl/" + p.relative_to(src).as_posix(), p.read_bytes())
           for p in sorted(host_closure(src, entry_points).values())]
    requires = REQUIRES
    if entry_points != ENTRY_POINTS:
        from .gcp.startup import templates_dir
        out += [(f"tpuctl/templates/{t.name}", t.read_bytes()) for t in sorted(templates_dir().glob("*.sh"))]
        requires = WATCHER_REQUIRES
    metadata = "Metadata-Version: 2.1\nName: tpuctl\nVersion: " + __version__ + "\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    wheel = "Wheel-Version: 1.0\nGenerator: tpuctl\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return out + [(f"{_DIST_INFO}/METADATA", metadata.encode()), (f"{_DIST_INFO}/WHEEL", wheel.encode())]


@functools.lru_cache(maxsize=2)   # one installation, one wheel each: `up` uploads it before each zone it tries
def build(entry_points: tuple[str, ...] = ENTRY_POINTS) -> bytes:
    """The wheel's bytes (PEP 427: a zip with a RECORD of each file's urlsafe-base64 sha256 and size)."""
    files = _files(entry_points)
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files) + f"{_DIST_INFO}/RECORD,,\n"
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files + [(f"{_DIST_INFO}/RECORD", record.encode())]:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return raw.getvalue()
