"""The agent's installable package, uploaded by `up` to the store (layout.agent_package), so every host runs the
same tpuctl as the CLI that made the cluster; the host's start-up script pip-installs it from there.

A wheel, built from this very installation: the tpuctl package plus metadata whose only dependency is what the
agent needs on a host (google-cloud-storage), not the CLI's typer/rich/compute. A wheel and not an sdist because
installing an sdist builds it first, and pip's build isolation would fetch a build backend from the network while
the host boots (PEP 517); a wheel installs by unpacking. Deterministic: sorted entries, fixed timestamps, so the
same tpuctl uploads the same bytes.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import io
import zipfile
from pathlib import Path

from .. import __version__
from ..core import layout

REQUIRES = ["google-cloud-storage>=2.14"]
_DIST_INFO = f"tpuctl-{__version__}.dist-info"


def key() -> str:
    return layout.agent_package(__version__)


def _files() -> list[tuple[str, bytes]]:
    src = Path(__file__).parent.parent   # the tpuctl package
    out = [("tpuctl/" + p.relative_to(src).as_posix(), p.read_bytes()) for p in sorted(src.rglob("*"))
           if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    metadata = "Metadata-Version: 2.1\nName: tpuctl\nVersion: " + __version__ + "\n" + "".join(
        f"Requires-Dist: {r}\n" for r in REQUIRES)
    wheel = "Wheel-Version: 1.0\nGenerator: tpuctl\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return out + [(f"{_DIST_INFO}/METADATA", metadata.encode()), (f"{_DIST_INFO}/WHEEL", wheel.encode())]


@functools.lru_cache(maxsize=1)   # one installation, one wheel: `up` uploads it before each zone it tries
def build() -> bytes:
    """The wheel's bytes (PEP 427: a zip with a RECORD of each file's urlsafe-base64 sha256 and size)."""
    files = _files()
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
