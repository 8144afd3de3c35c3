"""The provider for a name. Implementations are imported lazily, so `--provider local` never loads google-cloud
and `tpuctl --help` loads neither."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.errors import bad_input
from ..core.models import ProviderName

if TYPE_CHECKING:
    from .base import Provider


def get(name: ProviderName | str) -> "Provider":
    try:
        which = ProviderName(name)
    except ValueError:
        raise bad_input(f"unknown provider {name!r}", "use --provider " + " or --provider ".join(
            p.value for p in ProviderName))
    if which is ProviderName.LOCAL:
        from .local import LocalProvider
        return LocalProvider()
    if which is ProviderName.KAGGLE:
        from .kaggle.provider import KaggleProvider
        return KaggleProvider()
    if which is ProviderName.GKE:
        from .gke.provider import GkeProvider
        return GkeProvider()
    from .gcp.provider import GcpProvider
    return GcpProvider()
