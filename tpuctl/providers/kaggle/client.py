"""Kaggle's public API through its official client, kagglesdk (what the `kaggle` package calls), imported lazily.
Every call is `POST {endpoint}/api/v1/{service}/{method}` with the request's JSON; the endpoint comes from
KAGGLE_API_ENVIRONMENT (kagglesdk/kaggle_env.py: unset is api.kaggle.com, TEST is localhost:7777, which the tests'
fake serves).

Credentials, as the kaggle client finds them: KAGGLE_USERNAME and KAGGLE_KEY, else `kaggle.json` in
KAGGLE_CONFIG_DIR or ~/.kaggle. They go to Kaggle as HTTP basic auth and nowhere else: never printed, never
uploaded. A kaggle.json readable by group or others is refused (the kaggle client warns about it: "Your Kaggle API
key is readable by other users on this system! To fix this, you can run 'chmod 600 ...'").

Uploads follow kaggle_api_extended's `_upload_blob`: StartBlobUpload answers a token and a URL, the bytes go there
in one PUT, and the token names the file in CreateDataset.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Callable

from ...core.errors import ErrorKind, TpuctlError


def _config_file() -> Path:
    return Path(os.environ.get("KAGGLE_CONFIG_DIR") or Path.home() / ".kaggle") / "kaggle.json"


def credentials() -> tuple[str, str]:
    """(username, key); TpuctlError(PERMISSION) naming what to fix when there are none usable."""
    user, key = os.environ.get("KAGGLE_USERNAME"), os.environ.get("KAGGLE_KEY")
    if user and key:
        return user, key
    path = _config_file()
    if not path.is_file():
        raise TpuctlError(ErrorKind.PERMISSION, f"no Kaggle credentials: {path} does not exist and KAGGLE_USERNAME/"
                          "KAGGLE_KEY are not set",
                          "create an API token at https://www.kaggle.com/settings (Account, API, Create New Token), "
                          f"save it as {path} and run `chmod 600 {path}`")
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TpuctlError(ErrorKind.PERMISSION, f"{path} is readable by other users of this machine",
                          f"run `chmod 600 {path}` (the Kaggle client asks the same)")
    try:
        doc = json.loads(path.read_text())
        return str(doc["username"]), str(doc["key"])
    except (ValueError, KeyError, TypeError):
        raise TpuctlError(ErrorKind.INPUT, f"{path} is not a Kaggle API token (a JSON with username and key)",
                          "download a new one at https://www.kaggle.com/settings") from None


class Kaggle:
    """One authenticated client; each method is one API call (or one upload)."""

    def __init__(self) -> None:
        self.user, self._key = credentials()

    def _client(self) -> Any:
        try:
            from kagglesdk import KaggleClient
        except ImportError:
            raise TpuctlError(ErrorKind.INPUT, "the kaggle package is not installed",
                              "pip install 'tpuctl[kaggle]' (or pip install kaggle)") from None
        return KaggleClient(username=self.user, password=self._key)

    def _call(self, what: str, fn: Callable[[Any], Any]) -> Any:
        import requests
        try:
            with self._client() as client:
                return fn(client)
        except requests.HTTPError as e:
            status = e.response.status_code if e.response is not None else 0
            if status == 401:
                raise TpuctlError(ErrorKind.PERMISSION, f"Kaggle refused the API key of {self.user} ({what})",
                                  "create a new token at https://www.kaggle.com/settings and save it as "
                                  f"{_config_file()}") from None
            if status == 404:
                raise TpuctlError(ErrorKind.NOT_FOUND, f"{what}: not found on Kaggle ({e})") from None
            raise TpuctlError(ErrorKind.ERROR, f"{what}: Kaggle answered {status}: {e}", "try again") from None
        except requests.ConnectionError as e:
            raise TpuctlError(ErrorKind.ERROR, f"{what}: cannot reach Kaggle ({type(e).__name__})",
                              "check the network and try again") from None
        except (ValueError, TypeError, KeyError) as e:   # an answer kagglesdk cannot read: a client too old for it
            raise TpuctlError(ErrorKind.ERROR, f"{what}: Kaggle's answer could not be read ({type(e).__name__}: {e})",
                              "upgrade the kaggle package (pip install -U kaggle)") from None

    # -- account --------------------------------------------------------------------------------------
    def tpu_quota(self) -> tuple[float, float, str]:
        """(seconds used this week, seconds allowed, when it refreshes)."""
        from kagglesdk.kernels.types.kernels_api_service import ApiGetAcceleratorQuotaStatisticsRequest
        r = self._call("read the accelerator quota", lambda c: c.kernels.kernels_api_client
                       .get_accelerator_quota_statistics(ApiGetAcceleratorQuotaStatisticsRequest()))
        q = r.tpu_quota
        used = q.time_used.total_seconds() if q and q.time_used else 0.0
        allowed = q.total_time_allowed.total_seconds() if q and q.total_time_allowed else 0.0
        return used, allowed, str(r.quota_refresh_time or "")

    # -- datasets -------------------------------------------------------------------------------------
    def _upload(self, name: str, data: bytes) -> str:
        import requests
        from kagglesdk.blobs.types.blob_api_service import ApiBlobType, ApiStartBlobUploadRequest
        req = ApiStartBlobUploadRequest()
        req.type, req.name, req.content_length = ApiBlobType.DATASET, name, len(data)
        r = self._call(f"upload {name}", lambda c: c.blobs.blob_api_client.start_blob_upload(req))
        put = requests.put(r.create_url, data=data, timeout=600)
        if put.status_code not in (200, 201):
            raise TpuctlError(ErrorKind.ERROR, f"upload of {name} failed: HTTP {put.status_code}", "submit again")
        return str(r.token)

    def dataset_exists(self, slug: str) -> bool:
        from kagglesdk.datasets.types.dataset_api_service import ApiGetDatasetStatusRequest
        req = ApiGetDatasetStatusRequest()
        req.owner_slug, req.dataset_slug = self.user, slug
        try:
            self._call(f"dataset {slug}", lambda c: c.datasets.dataset_api_client.get_dataset_status(req))
            return True
        except TpuctlError as e:
            if e.kind is ErrorKind.NOT_FOUND:
                return False
            raise

    def create_dataset(self, slug: str, title: str, files: dict[str, bytes]) -> None:
        """A private dataset holding `files` (name -> bytes)."""
        from kagglesdk.datasets.types.dataset_api_service import ApiCreateDatasetRequest, ApiDatasetNewFile
        req = ApiCreateDatasetRequest()
        req.owner_slug, req.slug, req.title, req.is_private, req.license_name = self.user, slug, title, True, "unknown"
        new = []
        for name, data in files.items():
            f = ApiDatasetNewFile()
            f.token = self._upload(name, data)
            new.append(f)
        req.files = new
        r = self._call(f"create dataset {slug}", lambda c: c.datasets.dataset_api_client.create_dataset(req))
        if r.error:
            raise TpuctlError(ErrorKind.REFUSED, f"Kaggle refused dataset {slug}: {r.error}", "")

    def delete_dataset(self, slug: str) -> None:
        from kagglesdk.datasets.types.dataset_api_service import ApiDeleteDatasetRequest
        req = ApiDeleteDatasetRequest()
        req.owner_slug, req.dataset_slug = self.user, slug
        self._delete(f"delete dataset {slug}", lambda c: c.datasets.dataset_api_client.delete_dataset(req))

    # -- kernels --------------------------------------------------------------------------------------
    def push_kernel(self, slug: str, title: str, script: str, machine_shape: str, datasets: list[str],
                    kernels: list[str], internet: bool, timeout: int) -> int:
        """Save a private script kernel and run it (a new version); returns the version number. No docker_image:
        a pinned image silently overrides the TPU VM's environment (Kaggle/kaggle-cli#1197)."""
        from kagglesdk.kernels.types.kernels_api_service import ApiSaveKernelRequest
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
        r = self._call(f"push kernel {slug}", lambda c: c.kernels.kernels_api_client.save_kernel(req))
        if r.error:
            raise TpuctlError(ErrorKind.REFUSED, f"Kaggle refused to run {slug}: {r.error}", _hint(r.error))
        bad = list(r.invalid_dataset_sources or []) + list(r.invalid_kernel_sources or [])
        if bad:
            raise TpuctlError(ErrorKind.REFUSED, f"Kaggle cannot attach {', '.join(bad)} to {slug}",
                              "a dataset may take a minute to be ready after upload: submit again")
        return int(r.version_number or 0)

    def kernel_status(self, slug: str) -> tuple[str, str]:
        """(QUEUED | RUNNING | COMPLETE | ERROR | CANCEL_REQUESTED | CANCEL_ACKNOWLEDGED, failure message)."""
        from kagglesdk.kernels.types.kernels_api_service import ApiGetKernelSessionStatusRequest
        req = ApiGetKernelSessionStatusRequest()
        req.user_name, req.kernel_slug = self.user, slug
        r = self._call(f"status of {slug}", lambda c: c.kernels.kernels_api_client.get_kernel_session_status(req))
        return r.status.name, str(r.failure_message or "")

    def kernel_output(self, slug: str) -> tuple[list[tuple[str, str]], str]:
        """([(file name, url)], the log as text) of the session's output; empty until the session has ended."""
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
                return files, _log_text(log)

    def fetch(self, url: str, dest: Path) -> None:
        import requests
        with requests.get(url, timeout=600, stream=True) as r:
            if r.status_code != 200:
                raise TpuctlError(ErrorKind.ERROR, f"download of {dest.name} failed: HTTP {r.status_code}", "try again")
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.part")
            with open(tmp, "wb") as f:
                for chunk in r.iter_content(1 << 20):
                    f.write(chunk)
            os.replace(tmp, dest)

    def delete_kernel(self, slug: str) -> None:
        """Deletes the kernel (a running session of it stops: the API cancels only by a session id that no response
        carries)."""
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


def _hint(error: str) -> str:
    low = error.lower()
    if "phone" in low:
        return "verify your phone number at https://www.kaggle.com/settings (Kaggle requires it for accelerators)"
    if "quota" in low:
        return "the weekly quota refreshes on Saturday (UTC): `tpuctl status` shows it; or use --type cpu meanwhile"
    return ""


def _log_text(raw: str) -> str:
    """Kaggle's session log is a JSON list of {"stream_name", "time", "data"}; plain text is kept as it is."""
    try:
        entries = json.loads(raw)
        return "".join(str(e.get("data", "")) for e in entries if isinstance(e, dict))
    except ValueError:
        return raw
