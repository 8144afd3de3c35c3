"""A wire-level fake of Kaggle's public API for the official client (kagglesdk, as the `kaggle` package uses it).

The client picks its endpoint from KAGGLE_API_ENVIRONMENT (kagglesdk/kaggle_env.py): TEST is http://localhost:7777,
a fixed port, so two test runs (or two pytest-xdist workers) could not each have a fake there. The fake listens on
an ephemeral port instead and is reached as the HTTP proxy of that endpoint: kagglesdk sends every call through a
requests session with the environment's settings merged in (kaggle_http_client.py `call`: "Merge environment
settings into session", `merge_environment_settings`), and requests takes its proxy from http_proxy/HTTP_PROXY,
skipping the hosts in no_proxy (requests.readthedocs.io/en/latest/user/advanced/#proxies). `env()` names them; a
proxied request arrives with the absolute URL (http://localhost:7777/api/v1/...), which the fake accepts for that
endpoint only. Every call is `POST {endpoint}/api/v1/{service}/{method}` with the request object's JSON (camelCase field
names, KaggleObject.to_dict), answered with the response object's JSON; an error is a JSON body whose `code` is
>= 400 (kaggle_http_client.py `_prepare_response`). Requests and responses here are built and parsed with
kagglesdk's own types, so a field the real client would not send or read fails here too. Auth is an API token as
`Authorization: Bearer`, or the legacy API key as HTTP basic (`_try_fill_auth`); how the API itself behaves
(slugs, datasets processed after creation, 403 for what is missing, throttling, the live log) is in
`_api_switches`.

Served: blobs.BlobApiService/StartBlobUpload and the PUT to its createUrl (kaggle_api_extended `upload_complete`);
datasets.DatasetApiService CreateDataset, GetDatasetStatus, DeleteDataset; kernels.KernelsApiService SaveKernel,
GetKernelSessionStatus, ListKernelSessionOutput (its file URLs served too), DeleteKernel (a running session stops),
GetAcceleratorQuotaStatistics.

A saved kernel runs as a simulated session, as Kaggle runs a "Save & Run All" version: its script runs in a scratch
directory whose `kaggle/input` holds each attached dataset's files and each attached kernel's last output, and
`kaggle/working` is the output (TPUCTL_KAGGLE_ROOT points the script there: the real one is /kaggle). The session
ends at `session_limit` seconds (killed: ERROR), and TPU time is charged to the weekly quota. What a session finds
is what Kaggle's is reported to be, each undecided detail a switch the tests run both ways:
- `mount_layout`: "datasets" mounts a dataset at input/datasets/<owner>/<slug>/ and a kernel's output at
  input/notebooks/<owner>/<slug>/ (2026 sessions, as public 2026 notebooks print `os.walk('/kaggle/input')`);
  "flat" at input/<slug>/ (older sessions). Which one a given session gets is not documented.
- `unpack_archives`: uploaded archives arrive as folders of their contents, named as the file was (kaggle-cli PR
  #111: the backend unpacks `.zip` uploads, the CLI's `--dir-mode` relies on it; issues #292 and #406: `.tar`/`.tar.gz`
  found unpacked; DatabundleVersionStatus.BLOBS_DECOMPRESSED). How the backend tells an archive is not documented:
  here by its name or by its first bytes, whichever says so. False: kept as uploaded.
- a TPU session runs on the TPU image's interpreter (`tpu_image`): tensorflow-cpu 2.20, no tf-keras (Kaggle/
  docker-python tpu/requirements.in: "re-enable tensorflow-tpu when a compatible libtpu can be found"); its
  simulated TPU (FAKE_TPU_CORES, read by the TensorFlow stand-ins of fakes/pyindex.py) is driven only by a
  tensorflow-tpu loaded through PJRT. Other sessions run on this test environment's interpreter (its TensorFlow).
  The TPU image has libtpu 0.0.17 installed system-wide, outside any environment a session makes (issue 36; the
  image's `jax[tpu]` brings it: Kaggle/docker-python tpu/requirements.in at 0898ca4), and, where `tpu_jax_site`
  names a folder holding a real JAX and Keras 3 (the tests' jax_site fixture), those as the image's too
  (tpu/requirements.in: `jax[tpu]`, `keras>3`); without it, no JAX (the tests that do not need it stay fast).
"""
from __future__ import annotations

import base64
import datetime
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from fakes.procs import kill_marked
from fakes.wire import QuietHandler, Server, serve
from kagglesdk.blobs.types.blob_api_service import ApiStartBlobUploadRequest, ApiStartBlobUploadResponse
from kagglesdk.datasets.types.dataset_api_service import (ApiCreateDatasetRequest, ApiCreateDatasetResponse,
                                                          ApiDeleteDatasetRequest, ApiGetDatasetStatusRequest,
                                                          ApiGetDatasetStatusResponse)
from kagglesdk.kernels.types.kernels_api_service import (ApiAcceleratorQuota,
                                                         ApiDeleteKernelRequest, ApiGetAcceleratorQuotaStatisticsResponse,
                                                         ApiGetKernelSessionStatusRequest,
                                                         ApiGetKernelSessionStatusResponse, ApiKernelSessionOutputFile,
                                                         ApiListKernelSessionOutputRequest,
                                                         ApiListKernelSessionOutputResponse, ApiSaveKernelRequest,
                                                         ApiSaveKernelResponse)
from kagglesdk.datasets.types.dataset_enums import DatabundleVersionStatus
from kagglesdk.kernels.types.kernels_enums import KernelWorkerStatus
from kagglesdk.security.types.oauth_service import IntrospectTokenRequest, IntrospectTokenResponse

ENDPOINT = "localhost:7777"   # kagglesdk's TEST endpoint: what the client asks for, and the fake's URLs name
TOKEN = "KGAT_" + "a1" * 16   # an API token the fake knows (for alice)
TPU_SHAPES = {"TpuV5E8"}
SESSION_MARK = "FAKE_KAGGLE_SESSION"   # in each session process's environment: its directory


class FakeKaggle:
    def __init__(self, root: Path, users: dict[str, str] | None = None):
        self.root = root
        self.users = users or {"alice": "k" * 32}
        self.tokens: dict[str, str] = {TOKEN: "alice"}   # API tokens (Bearer) -> their user
        self._api_switches()
        self.blobs: dict[str, bytes] = {}
        self.datasets: dict[str, dict] = {}          # "owner/slug" -> {"files": {name: bytes}, "private": bool}
        self.kernels: dict[str, dict] = {}           # "owner/slug" -> {"versions": [session...], "request": dict}
        self.calls: list[str] = []
        self.errors: list[str] = []    # requests that failed inside the fake (a test asserts there are none)
        self.session_limit = 3600.0
        self.tpu_allowed = 20 * 3600.0
        self.tpu_used = 0.0
        self.phone_verified = True
        self.mount_layout, self.unpack_archives = "datasets", True   # the session's switches (module docstring)
        self.session_env: dict[str, str] = {}   # what a session's internet serves: the tests' package index
        self.lock = threading.RLock()
        self._ids = itertools.count(1)
        self.httpd: Server | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        fake = self

        class Handler(QuietHandler):
            def do_POST(self):
                fake._serve(self)

            do_PUT = do_GET = do_POST

        self.httpd = serve(Handler)

    def env(self) -> dict[str, str]:
        """What points kagglesdk at this fake (module docstring): its TEST endpoint, through this fake as its proxy.
        Both spellings of each variable, as urllib reads the lowercase one first; no_proxy keeps every other fake
        (all on 127.0.0.1, never "localhost") and the tests' package index off the proxy."""
        assert self.httpd is not None, "start() first"
        proxy = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        return {"KAGGLE_API_ENVIRONMENT": "TEST", "http_proxy": proxy, "HTTP_PROXY": proxy,
                "no_proxy": "127.0.0.1", "NO_PROXY": "127.0.0.1"}

    def stop(self) -> None:
        self.kill_all()
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()

    def reset(self) -> None:
        self._api_switches()
        self.kill_all()
        with self.lock:
            self.blobs.clear()
            self.datasets.clear()
            self.kernels.clear()
            self.calls.clear()
        self.session_limit, self.tpu_allowed, self.tpu_used, self.phone_verified = 3600.0, 20 * 3600.0, 0.0, True
        self.mount_layout, self.unpack_archives = "datasets", True
        self.tpu_jax_site: Path | None = None

    def kill_all(self) -> None:
        for k in list(self.kernels.values()) + [{"versions": self.detached}]:
            for s in k["versions"]:
                if s["proc"] and s["proc"].poll() is None:
                    self._end(s)

    def _api_switches(self) -> None:
        """How the API behaves where the real service was read from its client (each with its source), and a switch
        where no source settles it (the tests pass under each setting):
        - a new kernel's slug is its title slugified (kagglesdk ApiSaveKernelRequest.slug: "The kernel slug must be
          the title lowercased with dashes (-) replacing spaces"; kaggle_api_extended kernels push checks
          python-slugify's `slugify(title)`); SaveKernel's `ref` names it: "/code/owner/slug" or "owner/slug"
          (`ref_style`: which one Kaggle sends is not documented; ApiKernelMetadata.ref is "owner/slug").
        - a dataset is processed after CreateDataset answers (GetDatasetStatus: NOT_YET_PERSISTED, BLOBS_RECEIVED,
          ... READY or FAILED; kagglesdk dataset_enums.DatabundleVersionStatus; the CLI says "is being created" and
          asks to check later): READY after `dataset_processing` seconds; `fail_datasets` datasets made next end
          FAILED. A kernel pushed with a dataset not READY gets it back in `invalid_dataset_sources`
          (ApiSaveKernelResponse; kernels_push_cli prints "not valid dataset sources").
        - something missing answers `missing_status`: 404, or 403 as Kaggle answers for kernels it will not show
          (kaggle_api_extended reads 401/403 as "Permission 'kernels.get' was denied ... most likely a wrong kernel
          slug", and treats 403 and 404 alike elsewhere).
        - throttling: every `throttle_every`-th API call answers 429 with `Retry-After: retry_after` seconds
          (kaggle_api_extended `with_retry` honours it), and `drop_every`-th call closes the connection unanswered
          (a connection error, retried by the client). 0: never. A method named in `lose_answers` is done and its
          answer lost (the connection closes), once; one in `drop_before` is lost before it is done, once.
        - the live log (`LOG_STREAM`, kaggle_api_extended `kernels_logs_stream`): Server-Sent Events while the
          session runs, one `data: {"stream_name", "time", "data"}` per line, ending `data: END_OF_LOG`; after it
          ended, the stored log as JSON (application/json).
        - a deleted dataset's slug and title (`deleted_slugs`; not established, issue 39 item 5): "free" to be made
          again; "taken": CreateDataset refuses it as in use while GetDatasetStatus finds nothing (one report says a
          deleted title stayed taken); "DELETED": GetDatasetStatus answers DELETED (a DatabundleVersionStatus of
          kagglesdk datasets/types/dataset_enums.py) and CreateDataset refuses it.
        - the next session's input (`output_attach_delay`; not established, issue 39 item 5): a kernel whose last
          session ended less than this many seconds ago comes back in SaveKernel's `invalid_kernel_sources`
          (0: attachable at once; float("inf"): never).
        - DeleteKernel of a kernel whose session runs (`delete_stops_session`; not established, KAGGLE_FACTS.md
          "Whether DeleteKernel stops a running session and its quota clock: unverified"): True, the session stops;
          False, it runs on to its end without its kernel, its time still reserved (time_reserved).
        - `latency`: seconds each API call takes before it is answered. Kaggle answers over the internet, in tenths
          of a second; answered at once, two clients of one run would hardly ever overlap."""
        self.latency = 0.0
        self.deleted_slugs, self.deleted = "free", set()
        self.output_attach_delay = 0.0
        self.delete_stops_session, self.detached = True, []
        self.cut_uploads, self.partial = 0, {}   # uploads cut mid-file (blobs.put), and what arrived of them
        self.resumable_uploads = True
        self.ref_style = "code"
        self.dataset_processing = 0.3
        self.fail_datasets = 0
        self.missing_status = int(os.environ.get("FAKE_KAGGLE_MISSING_STATUS", "404"))   # a whole run under 403
        self.throttle_every, self.drop_every, self.retry_after = 0, 0, "0.05"
        self.lose_answers: list[str] = []   # methods whose next answer is lost after the work is done
        self.drop_before: list[str] = []    # methods whose next request is lost before anything is done
        self.api_calls = 0

    def _throttled(self, h: BaseHTTPRequestHandler) -> bool:
        with self.lock:
            self.api_calls += 1
            n = self.api_calls
        if self.drop_every and n % self.drop_every == 0:
            h.close_connection = True   # nothing sent: the client sees the connection end (RemoteDisconnected)
            return True
        if self.throttle_every and n % self.throttle_every == 0:
            data = json.dumps({"code": 429, "message": "Too Many Requests"}).encode()
            h.send_response(429)
            h.send_header("Content-Type", "application/json")
            h.send_header("Retry-After", self.retry_after)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return True
        return False

    def leftovers(self) -> list[str]:
        return sorted([f"dataset {d}" for d in self.datasets] + [f"kernel {k}" for k in self.kernels])

    # -- HTTP -----------------------------------------------------------------------------------------
    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else b""
        path = h.path.split("?", 1)[0]
        if path.startswith("http://"):   # through the proxy (env()): the endpoint's own URL
            host, _, rest = path[len("http://"):].partition("/")
            if host != ENDPOINT:
                return self._error(h, 404, f"this fake serves only http://{ENDPOINT}, not {host}")
            path = "/" + rest
        with self.lock:
            self.calls.append(f"{h.command} {path}")
        if h.command == "PUT" and path.startswith("/upload/"):
            return self._put(h, path[len("/upload/"):], body)
        if h.command == "GET" and path.startswith("/output/"):
            data = self._output_file(path[len("/output/"):])
            return self._send(h, 200 if data is not None else 404, data or b"", "application/octet-stream")
        if not path.startswith("/api/v1/"):
            return self._error(h, 404, f"no route {h.command} {path}")
        time.sleep(self.latency)
        user = self._user(h.headers.get("Authorization", ""))
        if user is None and not path.endswith("/IntrospectToken"):
            return self._error(h, 401, "Unauthenticated: the API key is not valid")
        if self._throttled(h):
            return None
        if h.command == "GET" and path.startswith(LOG_STREAM):
            return self._log_stream(h, path[len(LOG_STREAM):])
        if h.command != "POST":
            return self._error(h, 404, f"no route {h.command} {path}")
        service, method = path[len("/api/v1/"):].split("/", 1)
        handler = getattr(self, f"_{method}", None)
        if handler is None:
            return self._error(h, 404, f"unknown method {service}/{method}")
        if method in self.drop_before:   # the request lost before Kaggle saw it (once per name listed)
            self.drop_before.remove(method)
            h.close_connection = True
            return None
        try:
            status, out = handler(user, json.loads(body or b"{}"))
        except KeyError as e:
            return self._error(h, self.missing_status, f"not found: {e}")
        except Exception as e:  # noqa: BLE001 - a request the types refuse: answered as a server error, and logged
            self.errors.append(f"{method}: {type(e).__name__}: {e}")
            return self._error(h, 500, f"{type(e).__name__}: {e}")
        if method in self.lose_answers:   # done, and the answer lost on the way back (once per name listed)
            self.lose_answers.remove(method)
            h.close_connection = True
            return None
        if status >= 400:
            return self._error(h, status, out)
        return self._send(h, 200, json.dumps(type(out).to_dict(out)).encode())

    def _user(self, auth: str) -> str | None:
        if auth.startswith("Bearer "):   # kaggle_http_client.py BearerAuth
            return self.tokens.get(auth[7:])
        if not auth.startswith("Basic "):
            return None
        name, _, key = base64.b64decode(auth[6:]).decode().partition(":")
        return name if self.users.get(name) == key else None

    def _put(self, h: BaseHTTPRequestHandler, token: str, body: bytes) -> None:
        """The upload URL StartBlobUpload gave, as the kaggle client uses it: a whole PUT, or Google's resumable
        upload protocol, which kaggle_api_extended `upload_complete`/`_resume_upload` speak to it ("Documentation:
        https://developers.google.com/drive/api/guides/manage-uploads#resume-upload"): `Content-Range: bytes */N`
        asks what arrived (200/201: all of it; 308 Resume Incomplete with `Range: bytes=0-K`, no Range when nothing
        did), and `Content-Range: bytes A-B/N` sends the rest from A. `cut_uploads`: the next N uploads that carry
        more than 1 byte keep their first half and answer 503 (a connection cut mid-file). Whether Kaggle's upload URL
        keeps a cut upload's bytes is not established (`resumable_uploads`: True keeps them, False starts over)."""
        rng = h.headers.get("Content-Range", "")
        have = self.partial.get(token, b"")
        if rng.startswith("bytes */"):
            if token in self.blobs:
                return self._send(h, 200, b"{}")
            h.send_response(308)
            if have:
                h.send_header("Range", f"bytes=0-{len(have) - 1}")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return None
        start, total = (int(rng.split()[1].split("-")[0]), int(rng.rsplit("/", 1)[1])) if rng else (0, len(body))
        if start != len(have):
            return self._error(h, 400, f"upload resumed at {start}, {len(have)} bytes are here")
        if self.cut_uploads and len(body) > 1:
            self.cut_uploads -= 1
            self.partial[token] = have + body[:len(body) // 2] if self.resumable_uploads else b""
            return self._error(h, 503, "Service Unavailable")
        if len(have) + len(body) < total:
            self.partial[token] = have + body
            return self._error(h, 400, "upload incomplete")
        self.blobs[token] = have + body
        self.partial.pop(token, None)
        return self._send(h, 200, b"{}")

    @staticmethod
    def _send(h, status, data, ctype="application/json"):
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _error(self, h, status, message):
        self._send(h, status, json.dumps({"code": status, "message": message}).encode())

    # -- blobs ------------------------------------------------------------------------------------------
    def _StartBlobUpload(self, user, body):
        req = ApiStartBlobUploadRequest.from_dict(body)
        token = f"blob-{next(self._ids)}-{req.name}"
        resp = ApiStartBlobUploadResponse()
        resp.token, resp.create_url = token, f"http://{ENDPOINT}/upload/{token}"
        return 200, resp

    # -- datasets -------------------------------------------------------------------------------------
    def _CreateDataset(self, user, body):
        req = ApiCreateDatasetRequest.from_dict(body)
        ref = f"{req.owner_slug}/{req.slug}"
        resp = ApiCreateDatasetResponse()
        if req.owner_slug != user:
            resp.error = f"You do not have permission to create datasets for {req.owner_slug}"
            return 200, resp
        with self.lock:
            if ref in self.datasets or (ref in self.deleted and self.deleted_slugs != "free"):
                resp.error = f"The requested title or slug {req.slug!r} is already in use by a dataset"
                return 200, resp
            files = {}
            for f in req.files:
                name = f.token.split("-", 2)[2]
                files[name] = self.blobs.pop(f.token)
            failed = self.fail_datasets > 0
            self.fail_datasets -= failed
            self.datasets[ref] = {"files": files, "private": req.is_private, "title": req.title,
                                  "made": time.monotonic(), "failed": failed}
        resp.ref, resp.url, resp.status = ref, f"https://www.kaggle.com/datasets/{ref}", "ok"
        return 200, resp

    def _GetDatasetStatus(self, user, body):
        req = ApiGetDatasetStatusRequest.from_dict(body)
        ref = f"{req.owner_slug}/{req.dataset_slug}"
        resp = ApiGetDatasetStatusResponse()
        if ref not in self.datasets and ref in self.deleted and self.deleted_slugs == "DELETED":
            resp.status = DatabundleVersionStatus.DELETED
            return 200, resp
        if ref not in self.datasets:
            return self.missing_status, f"Dataset {ref} not found"
        resp.status = DatabundleVersionStatus[self._dataset_state(ref)]
        return 200, resp

    def _dataset_state(self, ref: str) -> str:
        d = self.datasets[ref]
        steps = ["NOT_YET_PERSISTED", "BLOBS_RECEIVED", "BLOBS_DECOMPRESSED", "INDIVIDUAL_BLOBS_COMPRESSED"]
        done = (time.monotonic() - d["made"]) / self.dataset_processing if self.dataset_processing else len(steps)
        if done < len(steps):
            return steps[int(done)]
        return "FAILED" if d["failed"] else "READY"

    def _DeleteDataset(self, user, body):
        req = ApiDeleteDatasetRequest.from_dict(body)
        ref = f"{req.owner_slug}/{req.dataset_slug}"
        with self.lock:
            if self.datasets.pop(ref, None) is None:
                return self.missing_status, f"Dataset {ref} not found"
            self.deleted.add(ref)
        from kagglesdk.datasets.types.dataset_api_service import ApiDeleteDatasetResponse
        return 200, ApiDeleteDatasetResponse()

    # -- kernels --------------------------------------------------------------------------------------
    def _SaveKernel(self, user, body):
        req = ApiSaveKernelRequest.from_dict(body)
        resp = ApiSaveKernelResponse()
        owner = req.slug.split("/")[0]
        if owner != user:
            resp.error = f"You do not have permission to save kernels for {owner}"
            return 200, resp
        accelerated = bool(req.machine_shape) or req.enable_tpu or req.enable_gpu
        if accelerated and not self.phone_verified:
            resp.error = "Phone verification is required to use accelerators. Verify your phone number in your " \
                         "Kaggle account settings"
            return 200, resp
        if req.machine_shape in TPU_SHAPES and self.tpu_used >= self.tpu_allowed:
            resp.error = "You have exceeded your weekly TPU quota"
            return 200, resp
        missing = [d for d in req.dataset_data_sources if d not in self.datasets
                   or self._dataset_state(d) != "READY"] + [k for k in req.kernel_data_sources if k not in self.kernels
                                                            or not self._attachable(self.kernels[k])]
        if missing:
            resp.invalid_dataset_sources = [d for d in missing if d in req.dataset_data_sources]
            resp.invalid_kernel_sources = [k for k in missing if k in req.kernel_data_sources]
            return 200, resp
        from slugify import slugify
        full = req.slug if req.slug in self.kernels or not req.new_title else f"{owner}/{slugify(req.new_title)}"
        with self.lock:
            k = self.kernels.setdefault(full, {"versions": [], "id": next(self._ids)})
            k["request"] = body
            req.slug = full
            session = self._start(req, len(k["versions"]) + 1)
            k["versions"].append(session)
        resp.ref = f"/code/{full}" if self.ref_style == "code" else full
        resp.url = f"https://www.kaggle.com/code/{full}"
        resp.version_number, resp.kernel_id = len(k["versions"]), k["id"]
        return 200, resp

    def _attachable(self, k: dict) -> bool:
        """Whether a kernel's last output may be attached yet (`output_attach_delay`)."""
        s = k["versions"][-1] if k["versions"] else None
        if s is None or "ended_at" not in s:
            return True   # a running session's kernel gives its previous output: tpuctl never asks for that
        return time.monotonic() - s["ended_at"] >= self.output_attach_delay

    def _start(self, req, version: int) -> dict:
        where = self.root / req.slug.replace("/", "__") / f"v{version}"
        inp, work = where / "kaggle" / "input", where / "kaggle" / "working"
        work.mkdir(parents=True)
        inp.mkdir(parents=True)
        for ref in req.dataset_data_sources:
            d = self._mount(inp, "datasets", ref)
            for name, data in self.datasets[ref]["files"].items():
                if self.unpack_archives and _is_archive(name, data):
                    _unpack(data, d / name)
                else:
                    (d / name).write_bytes(data)
        for ref in req.kernel_data_sources:
            prev = self.kernels[ref]["versions"][-1]
            d = self._mount(inp, "notebooks", ref)
            d.rmdir()
            shutil.copytree(prev["dir"] / "kaggle" / "working", d)
        (where / "script.py").write_text(req.text)
        log = open(where / "log.txt", "wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KAGGLE_", "TPUCTL_", "FAKE_TPU"))}
        env.update(TPUCTL_KAGGLE_ROOT=str(where / "kaggle"), KAGGLE_KERNEL_RUN_TYPE="Batch",
                   KAGGLE_ACCELERATOR=req.machine_shape or "None", **self.session_env)
        env[SESSION_MARK] = str(where)   # what _end finds the session's processes by
        python = sys.executable
        if req.machine_shape in TPU_SHAPES:
            python = str(tpu_image(self.root, self.tpu_jax_site))
            env["FAKE_TPU_CORES"] = "8"
        proc = subprocess.Popen([python, "-u", str(where / "script.py")], cwd=work, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        session = {"dir": where, "proc": proc, "started": time.monotonic(), "started_at": time.time(),
                   "status": "RUNNING", "failure": "",
                   "shape": req.machine_shape, "id": next(self._ids)}
        threading.Thread(target=self._supervise, args=(session,), daemon=True).start()
        return session

    def _mount(self, inp: Path, kind: str, ref: str) -> Path:
        d = inp / kind / ref if self.mount_layout == "datasets" else inp / ref.split("/")[1]
        d.mkdir(parents=True)
        return d

    @staticmethod
    def _end(s: dict) -> None:
        """A session stopped: every process in it goes at once, the job too, though tpuctl runs it in a session of
        its own. A Kaggle session runs in a Docker container (Kaggle/docker-python's README: the image Kaggle runs
        scripts and notebooks in), and stopping a container ends all of its processes. Before the output is read:
        a job left running would write into it while the next session's copy of it is made."""
        kill_marked(SESSION_MARK, str(s["dir"]), wait=10)
        s["proc"].wait()

    def _supervise(self, s: dict) -> None:
        try:
            code = s["proc"].wait(timeout=self.session_limit)
            s["status"], s["failure"] = ("COMPLETE", "") if code == 0 else ("ERROR", f"exit code {code}")
        except subprocess.TimeoutExpired:
            self._end(s)
            s["status"], s["failure"] = "ERROR", "Your notebook was stopped because it exceeded the session time limit"
        s["ended_at"] = time.monotonic()
        if s["shape"] in TPU_SHAPES:
            self.tpu_used += time.monotonic() - s["started"]

    def _kernel(self, user_name: str, slug: str) -> dict:
        return self.kernels[f"{user_name}/{slug}"]

    def _GetKernelSessionStatus(self, user, body):
        req = ApiGetKernelSessionStatusRequest.from_dict(body)
        s = self._kernel(req.user_name, req.kernel_slug)["versions"][-1]
        resp = ApiGetKernelSessionStatusResponse()
        resp.status = KernelWorkerStatus[s["status"]]
        resp.failure_message = s["failure"]
        return 200, resp

    def _ListKernelSessionOutput(self, user, body):
        req = ApiListKernelSessionOutputRequest.from_dict(body)
        k = self._kernel(req.user_name, req.kernel_slug)
        s = k["versions"][-1]
        resp = ApiListKernelSessionOutputResponse()
        if s["status"] in ("QUEUED", "RUNNING"):
            return 200, resp   # output and log come when the session has ended
        work = s["dir"] / "kaggle" / "working"
        files = []
        for p in sorted(work.rglob("*")):
            if p.is_file():
                f = ApiKernelSessionOutputFile()
                f.file_name = p.relative_to(work).as_posix()
                f.url = f"http://{ENDPOINT}/output/{req.user_name}/{req.kernel_slug}/{len(k['versions'])}/" \
                        f"{f.file_name}"
                files.append(f)
        resp.files = files
        resp.log = json.dumps(_entries((s["dir"] / "log.txt").read_text(errors="replace")))
        return 200, resp

    def _output_file(self, rest: str) -> bytes | None:
        user, slug, version, name = rest.split("/", 3)
        try:
            s = self.kernels[f"{user}/{slug}"]["versions"][int(version) - 1]
        except (KeyError, IndexError, ValueError):
            return None
        p = s["dir"] / "kaggle" / "working" / name
        return p.read_bytes() if p.is_file() else None

    def _DeleteKernel(self, user, body):
        req = ApiDeleteKernelRequest.from_dict(body)
        with self.lock:
            k = self.kernels.pop(f"{req.user_name}/{req.kernel_slug}")   # KeyError: answered missing_status
        for s in k["versions"]:
            if s["proc"].poll() is None and self.delete_stops_session:
                self._end(s)
            elif s["proc"].poll() is None:
                self.detached.append(s)
        from kagglesdk.kernels.types.kernels_api_service import ApiDeleteKernelResponse
        return 200, ApiDeleteKernelResponse()

    def _GetAcceleratorQuotaStatistics(self, user, body):
        resp = ApiGetAcceleratorQuotaStatisticsResponse()
        q = ApiAcceleratorQuota()
        q.time_used = datetime.timedelta(seconds=int(self.tpu_used))   # whole seconds: "3600s", as Kaggle sends
        q.total_time_allowed = datetime.timedelta(seconds=int(self.tpu_allowed))
        q.minimum_time_allowed = datetime.timedelta(seconds=int(min(self.tpu_allowed, 20 * 3600)))
        # time_reserved: "Quota reserved by currently-running sessions" (ApiAcceleratorQuota)
        q.time_reserved = datetime.timedelta(seconds=int(sum(
            time.monotonic() - s["started"] for k in list(self.kernels.values()) + [{"versions": self.detached}]
            for s in k["versions"] if s["shape"] in TPU_SHAPES and s["status"] == "RUNNING")))
        resp.tpu_quota = q
        resp.quota_refresh_time = datetime.datetime(2026, 11, 30)
        return 200, resp

    # -- the live log and the token's owner --------------------------------------------------------------
    def _log_stream(self, h: BaseHTTPRequestHandler, rest: str) -> None:
        """GET {LOG_STREAM}{owner}/{slug} (see _api_switches)."""
        key = rest.split("?", 1)[0]
        k = self.kernels.get(key)
        if k is None:
            return self._error(h, self.missing_status, f"kernel {key} not found")
        s = k["versions"][-1]
        log = s["dir"] / "log.txt"
        if s["status"] not in ("QUEUED", "RUNNING"):
            return self._send(h, 200, json.dumps(_entries(log.read_text(errors="replace"))).encode())
        # HTTP/1.1 chunked, as a server streams events (a client reads each chunk as it comes; requests' iter_lines
        # would otherwise wait for 512 bytes), closed at the end
        h.protocol_version, h.close_connection = "HTTP/1.1", True
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("Connection", "close")
        h.end_headers()

        def event(data: bytes) -> None:
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        sent, pending = 0, b""
        try:
            while True:
                running = s["status"] in ("QUEUED", "RUNNING")
                with open(log, "rb") as f:
                    f.seek(sent)
                    new = f.read()
                sent += len(new)
                pending += new
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    entry = {"stream_name": "stdout", "time": 0.0, "data": line.decode(errors="replace") + "\n"}
                    event(f"data: {json.dumps(entry)}\n\n".encode())
                if not running:
                    if pending:
                        entry = {"stream_name": "stdout", "time": 0.0, "data": pending.decode(errors="replace")}
                        event(f"data: {json.dumps(entry)}\n\n".encode())
                    event(b"data: END_OF_LOG\n\n")
                    h.wfile.write(b"0\r\n\r\n")
                    return
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            return

    def _IntrospectToken(self, user, body):
        """security.OAuthService/IntrospectToken (kaggle_creds.py `introspect`, kaggle_api_extended
        `_introspect_token`): `active` and `username` of a token; an unknown one is not active."""
        req = IntrospectTokenRequest.from_dict(body)
        resp = IntrospectTokenResponse()
        owner = self.tokens.get(req.token)
        resp.active = owner is not None
        if owner:
            resp.username = owner
        return 200, resp


LOG_STREAM = "/api/v1/kernels/logs/stream/"


def _entries(text: str) -> list[dict]:
    """Kaggle's stored log: a JSON list of {"stream_name", "time", "data"}, here one entry a line."""
    lines = [line + "\n" for line in text.split("\n")]   # split as the stream splits: at "\n" only
    lines[-1] = lines[-1][:-1]
    return [{"stream_name": "stdout", "time": 0.0, "data": line} for line in lines if line]


def _is_archive(name: str, data: bytes) -> bool:
    """An archive by its name or its first bytes (the module docstring: `unpack_archives`)."""
    return name.endswith((".zip", ".tar", ".tar.gz", ".tgz")) or data[:2] == b"\x1f\x8b" or data[:4] == b"PK\x03\x04" \
        or data[257:262] == b"ustar"


def _unpack(data: bytes, dest: Path) -> None:
    dest.mkdir(parents=True)
    if data[:4] == b"PK\x03\x04":
        zipfile.ZipFile(io.BytesIO(data)).extractall(dest)
    else:
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            t.extractall(dest, filter="data")


_IMAGES: dict[str, Path] = {}
_NOT_IN_IMAGES = ("tensorflow", "tf_keras", "tf-keras", "keras", "tpuctl", "_editable_impl_tpuctl")


def image_python(root: Path, name: str, tensorflow_cpu: bool, libtpu: str = "", jax_site: Path | None = None) -> Path:
    """An image's python, made once per test session: an interpreter whose own site-packages hold this
    environment's packages but its TensorFlow stack (and tpuctl, which no such image has), with the tensorflow-cpu
    stand-in in their place where `tensorflow_cpu` (Kaggle's TPU image; Colab's TPU runtime has no TensorFlow), the
    libtpu stand-in of version `libtpu` installed in it, and `jax_site`'s packages (JAX, Keras 3) after its own."""
    if name not in _IMAGES:
        from fakes import pyindex
        image = root / name
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(image)], check=True)
        site = next(image.glob("lib/python*/site-packages"))
        for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
            if not entry.name.lower().startswith(_NOT_IN_IMAGES):
                (site / entry.name).symlink_to(entry)
        if tensorflow_cpu:
            wheels = pyindex.build(root / f"{name}-wheels")
            zipfile.ZipFile(wheels / f"tensorflow_cpu-{pyindex.KAGGLE_TPU_TF}-py3-none-any.whl").extractall(site)
        if libtpu:
            zipfile.ZipFile(pyindex.libtpu_wheel(root / f"{name}-wheels", libtpu)).extractall(site)
        if jax_site is not None:
            (site / "zz_image_jax.pth").write_text(str(jax_site) + "\n")
        _IMAGES[name] = image / "bin" / "python"
    return _IMAGES[name]


def tpu_image(root: Path, jax_site: Path | None = None) -> Path:
    return image_python(root, "tpu-image-jax" if jax_site else "tpu-image", tensorflow_cpu=True,
                        libtpu=pyindex_libtpu(), jax_site=jax_site)


def pyindex_libtpu() -> str:
    from fakes import pyindex
    return pyindex.KAGGLE_LIBTPU
