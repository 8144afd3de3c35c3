"""Provider registry: imported lazily so `--provider local` never loads google-cloud."""
from __future__ import annotations


def get(name: str, project: str = ""):
    if name == "local":
        from .local import LocalProvider
        return LocalProvider()
    from .gcp.provider import GcpProvider
    return GcpProvider(project)
