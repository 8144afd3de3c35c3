"""gcp-storage-emulator behind a thin proxy that adds what the emulator lacks and tests rely on:

- bucket `location`, `labels` and `iamConfiguration` are kept as sent on insert (the emulator reads back `US`);
- `ifGenerationMatch` is enforced (the emulator ignores it): 0 answers 412 when the object exists, N when its
  generation is not N, on uploads and reads alike, as real GCS does (cloud.google.com/storage/docs/
  request-preconditions);
- objects.get honours `generation` ("If present, selects a specific revision of this object (as opposed to the
  latest version, the default)": cloud.google.com/storage/docs/json_api/v1/objects/get): without object versioning
  only the live generation exists, so a request for one since overwritten or deleted answers 404, on metadata and
  media reads alike (the emulator ignores the parameter);
- object resources carry GCS's `mediaLink`, `.../download/storage/v1/b/B/o/NAME?generation=N&alt=media` (the
  emulator's, pointed back at this proxy as GCS's points at the endpoint the client uses): python-storage downloads
  a blob that has one through it (`Blob._get_download_url`), so a blob from `get_blob` reads exactly generation N;
- objects.list answers in pages, as GCS does and the emulator does not: at most `maxResults` items, never more than
  1,000, in name order, with a `nextPageToken` when more remain (cloud.google.com/storage/docs/json_api/v1/objects/
  list); `listed` keeps how many items each listing answered, so a test can tell a short read from a full one;
- a fault queue: fake.faults["POST /storage/v1/b"].append((503, "backendError")) fails the next matching call
  (matched against the call as `calls` records it, so an upload can be picked by its object's name);
- identities: `listen_as(member)` opens another port on which every request is made as that member (a simulated
  TPU host's service account; emulator clients send no credentials, so the port tells hosts apart). Such requests
  need a bucket-level grant, and a grant takes effect only `iam_delay` seconds after the setIamPolicy that made
  it, as Google documents ("IAM changes ... typically take 2 minutes, sometimes 7 or more", cloud.google.com/iam/
  docs/access-change-propagation): before that, 403 with Cloud Storage's wording. Object access needs
  roles/storage.objectAdmin; reading the bucket's metadata needs roles/storage.legacyBucketReader (objectAdmin
  lacks storage.buckets.get, GCP_FACTS §4). The main port is the project owner: never refused.
  How long propagation takes is the test's choice: `iam_delay` by the clock, and with `iam_after_a_refused_read`
  also not before the member has been refused an object read since the grant (Google gives no bound to hold the
  code to, so a test that needs the refusal seen first gets it however loaded the machine is, and waits no longer).
The real google-cloud-storage client talks to the proxy (STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT).
"""
from __future__ import annotations

import collections
import http.client
import json
import re
import socket
import threading
import time
import urllib.parse

from gcp_storage_emulator.server import create_server
from fakes.wire import QuietHandler, serve

_KEPT = ("location", "labels", "iamConfiguration")
_OBJECT_ROLE = "roles/storage.objectAdmin"
_BUCKET_READER_ROLE = "roles/storage.legacyBucketReader"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeGcs:
    def __init__(self, latency: float = 0.0):
        self.latency = latency   # seconds added to every request, as a distant GCS would
        self.meta = {}
        self.faults = collections.defaultdict(list)
        self.calls = []
        self.bytes_in = collections.Counter()
        self.lock = threading.Lock()
        self.create_lock = threading.Lock()
        self.emulator = None
        self.httpd = None
        self.upstream = None
        self.iam_delay = 0.0
        self.iam_after_a_refused_read = False
        self.refused_reads = {}    # bucket -> {member: time of its latest refused object read}
        self.granted = {}          # bucket -> {(role, member): time the grant was written}
        self.after_iam_set = None  # called once a setIamPolicy has been applied, before its answer goes back
        self.lost = collections.Counter()   # text -> the next N requests whose recorded call contains it are
                                            # applied, then answered 503 (as a lost answer looks to the client)
        self.identity_servers = []
        self.listed = []   # items answered by each objects.list page

    def start(self) -> str:
        up_port = _free_port()
        self.emulator = create_server("127.0.0.1", up_port, in_memory=True)
        self.emulator.start()
        self.upstream = ("127.0.0.1", up_port)
        self.httpd = self._serve(None)
        return f"http://127.0.0.1:{self.httpd.server_port}"

    def listen_as(self, member: str) -> str:
        """A URL whose requests are all made as `member` ("serviceAccount:EMAIL")."""
        server = self._serve(member)
        self.identity_servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    def _serve(self, identity):
        fake = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def _go(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, headers, data = fake.forward(self.command, self.path, dict(self.headers), body, identity)
                upstream = f"{fake.upstream[0]}:{fake.upstream[1]}".encode()
                if any(k.lower() == "content-type" and "json" in v for k, v in headers):   # mediaLink, selfLink
                    data = data.replace(upstream, f"127.0.0.1:{self.server.server_port}".encode())
                self.send_response(status)
                for k, v in headers:
                    if k.lower() == "location":   # resumable session URLs must come back through the proxy
                        v = v.replace(f"{fake.upstream[0]}:{fake.upstream[1]}",
                                      f"127.0.0.1:{self.server.server_port}")
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _go

        return serve(Handler)

    def stop(self):
        for server in [self.httpd, *self.identity_servers]:
            server.shutdown()
            server.server_close()
        self.emulator.stop()

    def stop_identities(self):
        for server in self.identity_servers:
            server.shutdown()
            server.server_close()
        self.identity_servers.clear()

    def wipe(self):
        self.emulator.wipe()
        self.meta.clear()
        self.granted.clear()
        self.refused_reads.clear()

    def _upstream(self, method, path, headers, body):
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        headers = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection")}
        conn.request(method, path, body=body or None, headers=headers)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, r.getheaders(), data

    @staticmethod
    def _json_error(code, reason, message=""):
        return code, [("Content-Type", "application/json")], json.dumps(
            {"error": {"code": code, "message": message or reason, "errors": [{"reason": reason}]}}).encode()

    def _refusal(self, identity, method, url):
        """403 unless `identity` holds the role this request needs, granted at least iam_delay seconds ago (and,
        with iam_after_a_refused_read, before a read of an object was refused to it)."""
        m = re.match(r"^(?:/upload|/download)?/storage/v1/b/([^/]+)(/.*)?$", url.path)
        if not m:
            return None
        bucket, rest = m.group(1), m.group(2) or ""
        role, permission = ((_OBJECT_ROLE, "storage.objects." + ("get" if method == "GET" else "create"))
                            if rest.startswith("/o") else (_BUCKET_READER_ROLE, "storage.buckets.get"))
        with self.lock:
            since = self.granted.get(bucket, {}).get((role, identity))
            refused = self.refused_reads.get(bucket, {}).get(identity)
        if since is not None and time.monotonic() - since >= self.iam_delay and (
                not self.iam_after_a_refused_read or (refused is not None and refused >= since)):
            return None
        if self.iam_after_a_refused_read and rest.startswith("/o") and method == "GET":
            with self.lock:
                self.refused_reads.setdefault(bucket, {})[identity] = time.monotonic()
        email = identity.split(":", 1)[1]
        return self._json_error(403, "forbidden", f"{email} does not have {permission} access to the Google Cloud "
                                f"Storage {'object' if rest else 'bucket'}. Permission '{permission}' denied on "
                                "resource (or it may not exist).")

    def _note_policy(self, bucket, body):
        """setIamPolicy: remember when each (role, member) first appeared; a removed one is gone at once."""
        now = time.monotonic()
        bindings = json.loads(body or b"{}").get("bindings", [])
        wanted = {(b["role"], m) for b in bindings for m in b.get("members", [])}
        with self.lock:
            old = self.granted.get(bucket, {})
            self.granted[bucket] = {k: old.get(k, now) for k in wanted}

    def forward(self, method, path, headers, body, identity=None):
        status, hdrs, data = self._forward(method, path, headers, body, identity)
        url = urllib.parse.urlsplit(path)
        named = re.search(rb'"name":\s*"([^"]+)"', body or b"") if url.path.startswith("/upload/") else None
        call = f"{method} {url.path}" + (f" {named.group(1).decode()}" if named else "")
        with self.lock:
            key = next((k for k in self.lost if self.lost[k] and k in call), None)
            if key and status < 300:
                self.lost[key] -= 1   # applied, and then the answer is lost: the client sees a passing error
                return self._json_error(503, "backendError", "Backend Error")
        return status, hdrs, data

    def _forward(self, method, path, headers, body, identity=None):
        if self.latency:
            time.sleep(self.latency)
        url = urllib.parse.urlsplit(path)
        route = f"{method} {url.path}"
        query = urllib.parse.parse_qs(url.query)
        named = re.search(rb'"name":\s*"([^"]+)"', body or b"") if url.path.startswith("/upload/") else None
        with self.lock:
            # uploads are recorded with the object's name: "POST /upload/storage/v1/b/B/o NAME"
            call = f"{route} {named.group(1).decode()}" if named else route
            self.calls.append(call)
            self.bytes_in[route] += len(body or b"")
            for key in list(self.faults):
                if self.faults[key] and call.startswith(key):
                    return self._json_error(*self.faults[key].pop(0))
        if identity is not None:
            refused = self._refusal(identity, method, url)
            if refused:
                return refused
        iam = re.match(r"^/storage/v1/b/([^/]+)/iam$", url.path)
        if iam and method == "PUT":
            status, hdrs, data = self._upstream(method, path, headers, body)
            if status == 200:
                self._note_policy(iam.group(1), body)
                if self.after_iam_set:
                    self.after_iam_set()
            return status, hdrs, data
        if method == "POST" and url.path == "/storage/v1/b":
            sent = json.loads(body or b"{}")
            name = sent.get("name")
            status, hdrs, data = self._upstream(method, path, headers, body)
            if status == 200:
                self.meta[name] = {k: sent[k] for k in _KEPT if k in sent}
                if "location" in self.meta[name]:
                    self.meta[name]["location"] = self.meta[name]["location"].upper()
            return status, hdrs, self._overlay(name, data)
        at_generation = method == "GET" and query.get("generation") and not query.get("softDeleted")
        if query.get("ifGenerationMatch") or at_generation:
            with self.create_lock:  # check and write (or read) as one step, as GCS does
                gone = self._generation_gone(url, query) if at_generation else None
                if gone:
                    return gone
                if query.get("ifGenerationMatch"):
                    return self._if_generation(method, path, headers, body, url, query)
                return self._plain(method, path, headers, body, url)
        return self._plain(method, path, headers, body, url)

    def _generation_gone(self, url, query):
        """404 for a read of a generation that is not the live one (see the module's note on `generation`)."""
        in_path = re.search(r"/b/([^/]+)/o/(.+)$", url.path)
        if not in_path:
            return None
        bucket, obj = in_path.group(1), urllib.parse.unquote(in_path.group(2))
        st, _, data = self._upstream("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(obj, safe='')}", {}, b"")
        if st == 200 and str(json.loads(data).get("generation")) == query["generation"][0]:
            return None
        return self._json_error(404, "notFound", f"No such object: {bucket}/{obj}")

    def _if_generation(self, method, path, headers, body, url, query):
        """An upload names its object in the query (media uploads) or the JSON metadata part (multipart,
        resumable); a read or delete in its path."""
        upload = re.search(r"/b/([^/]+)/o$", url.path)
        named = re.search(rb'"name":\s*"([^"]+)"', body or b"")
        in_path = re.search(r"/b/([^/]+)/o/(.+)$", url.path)
        if upload:
            bucket, obj = upload.group(1), query.get("name", [None])[0] or (named.group(1).decode() if named else None)
        elif in_path:
            bucket, obj = in_path.group(1), urllib.parse.unquote(in_path.group(2))
        else:
            return self._plain(method, path, headers, body, url)
        if obj is not None:
            st, _, data = self._upstream("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(obj, safe='')}",
                                         {}, b"")
            have = json.loads(data).get("generation", "0") if st == 200 else "0"
            if str(have) != query["ifGenerationMatch"][0]:
                return self._json_error(412, "conditionNotMet", "At least one of the pre-conditions you "
                                        "specified did not hold.")
        return self._plain(method, path, headers, body, url)

    def _plain(self, method, path, headers, body, url):
        parts = url.path.split("/")
        status, hdrs, data = self._upstream(method, path, headers, body)
        if len(parts) == 5 and parts[1:4] == ["storage", "v1", "b"]:
            if method == "DELETE" and status < 300:
                self.meta.pop(parts[4], None)
                with self.lock:
                    self.granted.pop(parts[4], None)   # a deleted bucket's policy goes with it
            elif method == "GET":
                data = self._overlay(parts[4], data)
        elif len(parts) == 6 and parts[5] == "o" and method == "GET" and status == 200:
            data = self._page(data, urllib.parse.parse_qs(url.query))
        elif url.path == "/storage/v1/b" and method == "GET" and status == 200:
            # buckets.list answers full bucket resources, labels included (storage/docs/json_api/v1/buckets/list)
            doc = json.loads(data)
            for b in doc.get("items", []):
                b.update(self.meta.get(b.get("name"), {}))
            data = json.dumps(doc).encode()
        return status, hdrs, data

    def _page(self, data, query):
        doc = json.loads(data)
        items = sorted(doc.get("items", []), key=lambda o: o["name"])
        token = query.get("pageToken", [""])[0]
        if token:
            after = bytes.fromhex(token).decode()
            items = [o for o in items if o["name"] > after]
        size = min(int(query.get("maxResults", ["1000"])[0]), 1000)
        doc["items"] = items[:size]
        doc.pop("nextPageToken", None)
        if len(items) > size:
            doc["nextPageToken"] = doc["items"][-1]["name"].encode().hex()
        with self.lock:
            self.listed.append(len(doc["items"]))
        return json.dumps(doc).encode()

    def _overlay(self, name, data):
        if name not in self.meta:
            return data
        try:
            doc = json.loads(data)
        except ValueError:
            return data
        doc.update(self.meta[name])
        return json.dumps(doc).encode()
