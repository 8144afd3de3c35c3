"""BlobStore (tpuctl/store.py) over a GCS bucket. Create-if-absent is `if_generation_match=0` (412 when present);
`write_if` is `if_generation_match=N`: "Request proceeds if the generation of the target resource matches the value
used in the precondition. If the values don't match, the request fails with a 412 Precondition Failed response"
(cloud.google.com/storage/docs/request-preconditions).

403s are retried for a few minutes: bucket grants take ~2 minutes, sometimes 7+, to apply (GCP_FACTS §4), and the
agent on a fresh TPU VM starts right after `up` made them.
"""
from __future__ import annotations

import base64
import os
import time
from typing import Any, Callable

from ...core import knobs
from ...core.errors import ErrorKind, TpuctlError
from ...core.store import partial_name
from . import clients
from .operations import call

_FORBIDDEN_GRACE = 420.0
# The google-cloud-storage range this module relies on (the CLI's, the agent wheel's and the host script's, through
# agent_package): from 3.0 every upload, conditional or not, is retried on transient errors by default
# (googleapis/python-storage#1400, "Retry by default for uploads"; before it only uploads with if_generation_match
# were, as DEFAULT_RETRY_IF_GENERATION_SPECIFIED, #480), and a retried conditional upload whose first try landed
# answers 412, which create/write_if read back as theirs. Below 4: the last major release changed these defaults.
STORAGE = "google-cloud-storage>=3.0,<4"
# `python -c SATISFIED REQUIREMENT`, for the host's start-up script and the GKE pod's: an installed distribution meets
# REQUIREMENT (PEP 508, read by packaging, or by pip's own copy of it where packaging is not installed), and its
# version is printed; exit 1 otherwise. An image that holds the store client already is spared a pip run (a second
# or two of resolving) at every boot and every pod start. No single quote: the scripts pass it as -c '...'.
SATISFIED = """import sys
from importlib.metadata import version
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
req = Requirement(sys.argv[1])
have = version(req.name)
print(have)
sys.exit(not req.specifier.contains(have, prereleases=True))"""


def _retry_forbidden(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    grace = knobs.number("TPUCTL_FORBIDDEN_GRACE", _FORBIDDEN_GRACE)
    deadline = time.monotonic() + grace
    while True:
        try:
            return call(fn, *args, **kwargs)
        except TpuctlError as e:
            if e.kind is not ErrorKind.PERMISSION or time.monotonic() > deadline:
                raise
            time.sleep(min(10.0, grace / 40))


class GcsStore:
    def __init__(self, uri: str, project: str | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.bucket_name = self.uri[len("gs://"):].split("/", 1)[0]
        project = project or os.environ.get("GOOGLE_CLOUD_PROJECT") or None
        self.bucket = clients.storage(project).bucket(self.bucket_name)

    def read(self, key: str) -> bytes | None:
        try:
            return _retry_forbidden(self.bucket.blob(key).download_as_bytes, what=f"read {key}")
        except TpuctlError as e:
            if e.kind is ErrorKind.NOT_FOUND:
                return None
            raise

    def read_head(self, key: str, limit: int) -> bytes | None:
        """At most the first `limit` bytes (core/jobfiles.py: a run's files are read no further than a cap): a
        ranged read, `Range: bytes=0-(limit-1)` ("Range ... the portion of the object to return": Cloud Storage's
        request headers, cloud.google.com/storage/docs/xml-api/reference-headers#range), which python-storage's
        download_as_bytes(start, end) sends, its end inclusive. A server that answers the whole object is cut here."""
        try:
            data = _retry_forbidden(self.bucket.blob(key).download_as_bytes, start=0, end=limit - 1,
                                    what=f"read {key}")
        except TpuctlError as e:
            if e.kind is ErrorKind.NOT_FOUND:
                return None
            raise
        return bytes(data[:limit])

    def write(self, key: str, data: bytes) -> None:
        _retry_forbidden(self.bucket.blob(key).upload_from_string, data, what=f"write {key}")

    def create(self, key: str, data: bytes) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        def once() -> bool:
            try:
                self.bucket.blob(key).upload_from_string(data, if_generation_match=0)
                return True
            except PreconditionFailed:
                # 412: it exists. Ours when it holds our bytes: a first try applied whose answer was lost, then the
                # client's retry met the precondition (claims and records carry host and time, so another writer's
                # never match).
                return bool(self.read(key) == data)
        return _retry_forbidden(once, what=f"create {key}")

    def read_generation(self, key: str) -> tuple[bytes | None, int]:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        def once() -> tuple[bytes | None, int]:
            # The generation from the metadata, then the live object's bytes on the condition that it is still at
            # that generation: rewritten between the two, it answers 412; deleted, 404; either way it is read again,
            # so bytes and generation always belong together. The download goes through `bucket.blob(key)`, which
            # has no mediaLink: python-storage 3.17 `Blob._get_download_url` builds .../o/KEY?alt=media from the
            # name (adding `generation=` only for a blob that has one) and `ifGenerationMatch` from the argument.
            # The blob `get_blob` returns would download through its mediaLink, which real GCS pins to the listed
            # generation (`...?generation=N&alt=media`): once N is overwritten that URL answers 404 (objects.get:
            # `generation` "selects a specific revision of this object"), and a lease two writers race on would
            # read as missing (issue 27.4).
            while True:
                meta = self.bucket.get_blob(key)
                if meta is None:
                    return None, 0
                gen = int(meta.generation)
                try:
                    return self.bucket.blob(key).download_as_bytes(if_generation_match=gen), gen
                except (PreconditionFailed, NotFound):
                    continue
        return _retry_forbidden(once, what=f"read {key}")

    def write_if(self, key: str, data: bytes, generation: int) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        def once() -> bool:
            try:
                self.bucket.blob(key).upload_from_string(data, if_generation_match=generation)
                return True
            except PreconditionFailed:
                # As for create: a first try applied whose answer was lost reads back as ours (a lease record holds
                # its holder's id and times, so another writer's never matches).
                return bool(self.read(key) == data)
        return _retry_forbidden(once, what=f"write {key}")

    def _blobs(self, prefix: str, limit: int | None = None) -> list[Any]:
        # GCS lists in lexicographic key order, a page (up to 1,000 objects) a request, the client following page
        # tokens; max_results ends the listing after `limit` objects: the newest-first index reads one short page.
        client = self.bucket.client
        return _retry_forbidden(lambda: list(client.list_blobs(self.bucket_name, prefix=prefix, max_results=limit)),
                                what=f"list {prefix}")

    def list(self, prefix: str, limit: int | None = None) -> list[tuple[str, int]]:
        return sorted((b.name, b.size or 0) for b in self._blobs(prefix, limit))

    def free_bytes(self) -> int | None:
        return None   # a bucket has no size limit; a quota or outage shows as a failed write

    def delete(self, key: str) -> None:
        try:
            _retry_forbidden(self.bucket.blob(key).delete, what=f"delete {key}")
        except TpuctlError as e:
            if e.kind is not ErrorKind.NOT_FOUND:
                raise

    def stats(self, prefix: str) -> dict[str, tuple[int, str]]:
        return {b.name: (b.size or 0, base64.b64decode(b.md5_hash).hex() if b.md5_hash else "")
                for b in self._blobs(prefix)}

    def upload_file(self, path: str, key: str, progress: Callable[[int], None]) -> None:
        blob = self.bucket.blob(key)
        size = os.path.getsize(path)
        if size > 16 << 20:
            blob.chunk_size = 16 << 20  # resumable upload in 16 MiB chunks: a dropped connection resends one chunk
        _retry_forbidden(blob.upload_from_filename, path, checksum="md5", what=f"upload {key}")
        progress(size)

    def download_file(self, key: str, path: str, progress: Callable[[int], None]) -> None:
        tmp = os.path.join(os.path.dirname(path) or ".", partial_name())
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        blob = self.bucket.blob(key)
        try:
            # checksum "auto": the client checks what arrived against the object's crc32c (md5 without the C
            # extension) and raises on a mismatch; crc32c also covers composite objects, which carry no md5
            _retry_forbidden(blob.download_to_filename, tmp, checksum="auto", what=f"download {key}")
            size = os.path.getsize(tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        progress(size)

    def copy(self, src: str, dst: str) -> None:
        """A server-side copy (objects.rewrite): the bytes never leave Cloud Storage."""
        _retry_forbidden(self.bucket.copy_blob, self.bucket.blob(src), self.bucket, dst, what=f"copy {src} to {dst}")

    def local_path(self, key: str) -> str:
        return f"{self.uri}/{key}"
