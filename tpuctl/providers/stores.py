"""A store from its URI, through the provider that owns the scheme (gs:// is Google Cloud Storage). The host opens
its cluster's store through this module alone, so the agent's wheel carries the store clients and nothing else
of the providers."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.store import BlobStore


def open_store(uri: str) -> "BlobStore":
    if uri.startswith("gs://"):
        from .google.gcs_store import GcsStore
        return GcsStore(uri)
    from ..core.store import LocalStore
    return LocalStore(uri)
