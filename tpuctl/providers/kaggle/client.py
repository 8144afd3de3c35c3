"""Kaggle's public API through its official client, kagglesdk (what the `kaggle` package calls), imported lazily.
Every call is `POST {endpoint}/api/v1/{service}/{method}` with the request's JSON; the endpoint comes from
KAGGLE_API_ENVIRONMENT (kagglesdk/kaggle_env.py: unset is api.kaggle.com, TEST is localhost:7777, which the tests'
fake serves as that endpoint's HTTP proxy, from a port of its own: tests/fakes/kaggle.py). Credentials: auth.py.

Every call is retried as kaggle_api_extended's `with_retry` does (up to 10 attempts; a 429 waits its `Retry-After`,
seconds or an HTTP date; a connection error backs off 0.5 s x 1.7^n). A call that makes something (a kernel
version, a dataset) is retried only where the request cannot have arrived (a 429, a refused connection): a lost
answer to SaveKernel retried would start a second session. 403 reads as not found, as the client reads it for
kernels ("Permission 'kernels.get' was denied ... most likely a wrong kernel slug") and treats 403 and 404 alike
elsewhere.

Uploads follow kaggle_api_extended's `_upload_blob`: StartBlobUpload answers a token and a URL, the bytes go there
in one PUT (blobs.py), and the token names the file in CreateDataset. The retry rules are retries.py's.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable

from ...core.errors import ErrorKind, TpuctlError
from . import auth
from .blobs import put
from .retries import ATTEMPTS, backoff, retry_after, unsent

_OWNERS: dict[str, str] = {}   # API token -> its username (IntrospectToken), in this process


class SourceRefused(TpuctlError):
    """SaveKernel answered the previous session's kernel in `invalid_kernel_sources`: its output not attachable (yet)."""


class Unanswered(TpuctlError):
    """A call that makes something was sent and its answer lost: it may have been done."""


class Kaggle:
    """One authenticated client; each method is one API call (or one upload)."""

    def __init__(self) -> None:
        try:   # before any call (a login file's refresh is one): on Python 3.10 the extra installs no client
            import kagglesdk  # noqa: F401
        except ImportError:
            raise missing_client(sys.version_info[:2]) from None
        self.creds = auth.find()
        self.user, self._token = self.creds.user, self.creds.token
        if not self.creds.token and not self.creds.key:   # kaggle auth login's file: its token, refreshed
            self.user, self._token = self._oauth()
        if not self.user:   # asked once a process: each command makes a client per poll
            self.user = _OWNERS.get(self._token) or _OWNERS.setdefault(self._token, self._introspect())

    def client(self) -> Any:
        """A kagglesdk KaggleClient with these credentials (a context manager)."""
        try:
            from kagglesdk import KaggleClient
        except ImportError:
            raise missing_client(sys.version_info[:2]) from None
        if self._token:
            return KaggleClient(api_token=self._token)
        return KaggleClient(username=self.user, password=self.creds.key)

    def _oauth(self) -> tuple[str, str]:
        from kagglesdk import KaggleClient, KaggleCredentials
        with KaggleClient() as client:
            creds = KaggleCredentials.load(client=client, file_path=str(auth.oauth_file()))
            token = self._call("refresh the token of `kaggle auth login`", lambda c: creds.get_access_token()) \
                if creds else None
        if not creds or not token or not creds.get_username():
            raise TpuctlError(ErrorKind.PERMISSION, f"{auth.oauth_file()} holds no usable login", auth.HINT)
        return str(creds.get_username()), str(token)

    def _introspect(self) -> str:
        """The token's username (security.OAuthService/IntrospectToken, as kaggle_api_extended `_introspect_token`)."""
        from kagglesdk.security.types.oauth_service import IntrospectTokenRequest
        req = IntrospectTokenRequest()
        req.token = self._token
        try:
            r = self._call("check the API token", lambda c: c.security.oauth_client.introspect_token(req))
        except TpuctlError as e:
            if e.kind is not ErrorKind.NOT_FOUND:   # 400/403/404: the client reads them as an invalid token
                raise
            r = None
        if r is None or not r.active or not r.username:
            raise TpuctlError(ErrorKind.PERMISSION, f"Kaggle says the API token in {self.creds.source} is not "
                              "valid (revoked or expired)", auth.HINT)
        return str(r.username)

    def _call(self, what: str, fn: Callable[[Any], Any], makes: bool = False) -> Any:
        """One API call with the official client's retries; `makes`: it creates something (see the docstring)."""
        import requests
        for attempt in range(1, ATTEMPTS + 1):
            try:
                with self.client() as client:
                    return fn(client)
            except requests.HTTPError as e:
                status = e.response.status_code if e.response is not None else 0
                if status == 429 and attempt < ATTEMPTS:
                    wait = retry_after(e.response)
                    time.sleep(backoff(attempt) if wait is None else wait)
                    continue
                raise http_error(what, status, e, self.creds.source) from None
            except requests.ConnectionError as e:
                if attempt < ATTEMPTS and (not makes or unsent(e)):
                    wait = backoff(attempt)   # said, not silent: the ten tries take minutes (issue 63.5)
                    print(f"! {what}: cannot reach Kaggle ({type(e).__name__}); retrying ({attempt}/{ATTEMPTS - 1}) "
                          f"in {wait:.1f}s", file=sys.stderr, flush=True)
                    time.sleep(wait)
                    continue
                error = Unanswered if makes else TpuctlError
                raise error(ErrorKind.ERROR, f"{what}: cannot reach Kaggle ({type(e).__name__})",
                            "check the network and try again") from None
            except (ValueError, TypeError, KeyError) as e:   # an answer kagglesdk cannot read: a client too old
                raise TpuctlError(ErrorKind.ERROR, f"{what}: Kaggle's answer could not be read "
                                  f"({type(e).__name__}: {e})", "upgrade the kaggle package (pip install -U kaggle)"
                                  ) from None
        raise AssertionError("unreachable")

    # -- account --------------------------------------------------------------------------------------
    def tpu_quota(self) -> dict[str, float | str]:
        """The TPU's weekly quota in seconds (ApiAcceleratorQuota): used, reserved (by running sessions), allowed,
        minimum (the guaranteed allowance), and `refresh` (when it renews)."""
        from kagglesdk.kernels.types.kernels_api_service import ApiGetAcceleratorQuotaStatisticsRequest
        r = self._call("read the accelerator quota", lambda c: c.kernels.kernels_api_client
                       .get_accelerator_quota_statistics(ApiGetAcceleratorQuotaStatisticsRequest()))
        q = r.tpu_quota

        def secs(name: str) -> float:
            value = getattr(q, name, None) if q else None
            return value.total_seconds() if value else 0.0
        return {"used": secs("time_used"), "reserved": secs("time_reserved"), "allowed": secs("total_time_allowed"),
                "minimum": secs("minimum_time_allowed"), "refresh": str(r.quota_refresh_time or "")}

    # -- datasets -------------------------------------------------------------------------------------
    def _upload(self, name: str, data: bytes) -> str:
        from kagglesdk.blobs.types.blob_api_service import ApiBlobType, ApiStartBlobUploadRequest
        req = ApiStartBlobUploadRequest()
        req.type, req.name, req.content_length = ApiBlobType.DATASET, name, len(data)
        r = self._call(f"upload {name}", lambda c: c.blobs.blob_api_client.start_blob_upload(req))
        put(name, r.create_url, data)
        return str(r.token)

    def dataset_status(self, slug: str) -> str:
        """GetDatasetStatus: a DatabundleVersionStatus name (NOT_YET_PERSISTED ... READY, FAILED; datasets are
        processed after CreateDataset answers, kagglesdk/datasets/types/dataset_enums.py), "" when not there."""
        from kagglesdk.datasets.types.dataset_api_service import ApiGetDatasetStatusRequest
        req = ApiGetDatasetStatusRequest()
        req.owner_slug, req.dataset_slug = self.user, slug
        try:
            r = self._call(f"dataset {slug}", lambda c: c.datasets.dataset_api_client.get_dataset_status(req))
        except TpuctlError as e:
            if e.kind is ErrorKind.NOT_FOUND:
                return ""
            raise
        return str(r.status.name)

    def create_dataset(self, slug: str, title: str, files: dict[str, bytes]) -> None:
        """A private dataset holding `files` (name -> bytes); it is READY some time after (dataset_status)."""
        from kagglesdk.datasets.types.dataset_api_service import ApiCreateDatasetRequest, ApiDatasetNewFile
        req = ApiCreateDatasetRequest()
        req.owner_slug, req.slug, req.title, req.is_private, req.license_name = self.user, slug, title, True, "unknown"
        new = []
        for name, data in files.items():
            f = ApiDatasetNewFile()
            f.token = self._upload(name, data)
            new.append(f)
        req.files = new
        for attempt in range(1, ATTEMPTS + 1):
            try:
                r = self._call(f"create dataset {slug}", lambda c: c.datasets.dataset_api_client.create_dataset(req),
                               makes=True)
                break
            except Unanswered:
                if self.dataset_status(slug):   # it was made: the answer alone was lost
                    return
                if attempt == ATTEMPTS:
                    raise
                time.sleep(backoff(attempt))
        if r.error:
            raise TpuctlError(ErrorKind.REFUSED, f"Kaggle refused dataset {slug}: {r.error}", "")

    def delete_dataset(self, slug: str) -> None:
        from kagglesdk.datasets.types.dataset_api_service import ApiDeleteDatasetRequest
        req = ApiDeleteDatasetRequest()
        req.owner_slug, req.dataset_slug = self.user, slug
        self._delete(f"delete dataset {slug}", lambda c: c.datasets.dataset_api_client.delete_dataset(req))

    # -- kernels --------------------------------------------------------------------------------------
    def push_kernel(self, slug: str, title: str, script: str, machine_shape: str, datasets: list[str],
                    kernels: list[str], internet: bool, timeout: int) -> tuple[str, int]:
        """Save a private script kernel and run it (a new version); returns (its slug as Kaggle's `ref` names it,
        the version number). Kaggle names a new kernel after its title (`ApiSaveKernelRequest.slug`: "The kernel
        slug must be the title lowercased with dashes (-) replacing spaces"), so `title` must slugify to `slug`.
        No docker_image: a pinned image silently overrides the TPU VM's environment (Kaggle/kaggle-cli#1197)."""
        from kagglesdk.kernels.types.kernels_api_service import ApiSaveKernelRequest
        assert slugify(title) == slug, f"title {title!r} does not name kernel {slug}"
        req = ApiSaveKernelRequest()
        req.slug, req.new_title, req.text = f"{self.user}/{slug}", title, script
        req.language, req.kernel_type, req.is_private = "python", "script", True
        req.enable_internet = internet
        if machine_shape:   # unset: no accelerator
            req.machine_shape = machine_shape
        req.enable_tpu = machine_shape.startswith("Tpu")
        req.enable_gpu = machine_shape.startswith("Nvidia")
        req.dataset_data_sources = [f"{self.user}/{d}" for d in datasets]
        req.kernel_data_sources = [f"{self.user}/{k}" for k in kernels]
        if timeout:
            req.session_timeout_seconds = timeout
        for attempt in range(1, ATTEMPTS + 1):
            try:
                r = self._call(f"push kernel {slug}", lambda c: c.kernels.kernels_api_client.save_kernel(req),
                               makes=True)
                break
            except Unanswered:   # pushed or not? Each session is a new kernel: whether it is there says which
                if self._kernel_there(slug):
                    return slug, 1
                if attempt == ATTEMPTS:
                    raise
                time.sleep(backoff(attempt))
        if r.error:
            raise TpuctlError(ErrorKind.REFUSED, f"Kaggle refused to run {slug}: {r.error}", _hint(r.error))
        if r.invalid_dataset_sources:   # kaggle_api_extended kernels_push_cli: "not valid dataset sources"
            raise TpuctlError(ErrorKind.REFUSED, f"Kaggle cannot attach dataset {', '.join(r.invalid_dataset_sources)}"
                              f" to {slug} (not there, or not processed yet)", "submit again in a minute")
        if r.invalid_kernel_sources:
            raise SourceRefused(ErrorKind.REFUSED, f"Kaggle cannot attach the previous session "
                              f"{', '.join(r.invalid_kernel_sources)} to {slug}", "its kernel may have been deleted")
        return ref_slug(str(r.ref or ""), slug), int(r.version_number or 0)

    def kernel_status(self, slug: str) -> tuple[str, str]:
        """(QUEUED | RUNNING | COMPLETE | ERROR | CANCEL_REQUESTED | CANCEL_ACKNOWLEDGED, failure message);
        TpuctlError(NOT_FOUND) when the kernel is not there (404 or 403)."""
        from kagglesdk.kernels.types.kernels_api_service import ApiGetKernelSessionStatusRequest
        req = ApiGetKernelSessionStatusRequest()
        req.user_name, req.kernel_slug = self.user, slug
        r = self._call(f"status of {slug}", lambda c: c.kernels.kernels_api_client.get_kernel_session_status(req))
        return r.status.name, str(r.failure_message or "")

    def _kernel_there(self, slug: str) -> bool:
        try:
            self.kernel_status(slug)
            return True
        except TpuctlError as e:
            if e.kind is ErrorKind.NOT_FOUND:
                return False
            raise

    def kernel_output(self, slug: str) -> tuple[list[tuple[str, str]], list[str]]:
        """([(file name, url)], the log's entries) of the session's output; empty until the session has ended."""
        from kagglesdk.kernels.types.kernels_api_service import ApiListKernelSessionOutputRequest
        files: list[tuple[str, str]] = []
        log, token = "", ""
        while True:
            req = ApiListKernelSessionOutputRequest()
            req.user_name, req.kernel_slug = self.user, slug
            if token:
                req.page_token = token
            r = self._call(f"output of {slug}", lambda c: c.kernels.kernels_api_client.list_kernel_session_output(req))
            files += [(f.file_name, f.url) for f in r.files or []]
            log = log or str(r.log or "")
            token = r.next_page_token
            if not token:
                return files, log_entries(log)

    def delete_kernel(self, slug: str) -> None:
        """Deletes the kernel, which stops a running session of it. CancelKernelSession would stop it without
        deleting, but it takes a kernel_session_id that no response of this API carries (SaveKernel answers the
        kernel's id, GetKernelSessionStatus only a status), so cancel is a delete followed by a check."""
        from kagglesdk.kernels.types.kernels_api_service import ApiDeleteKernelRequest
        req = ApiDeleteKernelRequest()
        req.user_name, req.kernel_slug = self.user, slug
        self._delete(f"delete kernel {slug}", lambda c: c.kernels.kernels_api_client.delete_kernel(req))

    def _delete(self, what: str, fn: Callable[[Any], Any]) -> None:
        """A deletion of what is gone already succeeds (the provider contract's rule for `delete_*`)."""
        try:
            self._call(what, fn)
        except TpuctlError as e:
            if e.kind is not ErrorKind.NOT_FOUND:
                raise


def missing_client(python: tuple[int, ...]) -> TpuctlError:
    """The kaggle package is not there: on Python 3.10 because it cannot be (kaggle 2.2.5 requires Python >= 3.11,
    PyPI metadata; the `kaggle` extra installs nothing there, pyproject.toml)."""
    if python < (3, 11):
        return TpuctlError(ErrorKind.INPUT, f"--provider kaggle needs Python 3.11 or newer (the kaggle client requires "
                           f"it); this is Python {'.'.join(map(str, python))}",
                           "install tpuctl[kaggle] under Python 3.11 or newer")
    return TpuctlError(ErrorKind.INPUT, "the kaggle package is not installed",
                       "pip install 'tpuctl[kaggle]' (or pip install kaggle)")


def http_error(what: str, status: int, e: Exception, source: str) -> TpuctlError:
    if status == 401:
        return TpuctlError(ErrorKind.PERMISSION, f"Kaggle refused the credentials from {source} ({what})", auth.HINT)
    if status in (403, 404):   # the client reads both as "not there" (a wrong slug, something deleted)
        return TpuctlError(ErrorKind.NOT_FOUND, f"{what}: not found on Kaggle (HTTP {status})")
    return TpuctlError(ErrorKind.ERROR, f"{what}: Kaggle answered {status}: {e}", "try again")


def slugify(title: str) -> str:
    """Kaggle's slug for a title: python-slugify's `slugify`, as kaggle_api_extended (kernels push) checks it."""
    from slugify import slugify as python_slugify
    return str(python_slugify(title))


def ref_slug(ref: str, fallback: str) -> str:
    """The kernel slug in SaveKernel's `ref` ("owner/slug", "/code/owner/slug" or its URL)."""
    parts = [p for p in ref.split("?")[0].split("/") if p]
    return parts[-1] if len(parts) >= 2 else fallback


def _hint(error: str) -> str:
    low = error.lower()
    if "phone" in low:
        return "verify your phone number at https://www.kaggle.com/settings (Kaggle requires it for accelerators)"
    if "quota" in low:
        return "the weekly quota refreshes on Saturday (UTC): `tpuctl status` shows it; or use --type cpu meanwhile"
    return ""


def log_entries(raw: str) -> list[str]:
    """Kaggle's session log is a JSON list of {"stream_name", "time", "data"}: each entry's text. Anything else
    reads line by line, as kaggle_api_extended `_iter_blob_lines` does."""
    try:
        entries = json.loads(raw)
        if isinstance(entries, list):
            return [str(e.get("data", "")) for e in entries if isinstance(e, dict)]
    except ValueError:
        pass
    return [line + "\n" for line in raw.splitlines()]
