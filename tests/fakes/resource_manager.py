"""A wire-level fake of Resource Manager's projects.testIamPermissions (v1), as documented at
cloud.google.com/resource-manager/reference/rest/v1/projects/testIamPermissions: POST
/v1/projects/{resource}:testIamPermissions with {"permissions": [...]} answers {"permissions": [the subset held]}
(the field is omitted when none is held, as proto3 JSON omits empty lists). `held` is what the caller holds
(None: everything asked); `status` makes every call fail with that HTTP status (an API not enabled answers 403)."""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_ROUTE = re.compile(r"^/v1/projects/(?P<project>[^/:]+):testIamPermissions$")


class FakeResourceManager:
    def __init__(self) -> None:
        self.held: set[str] | None = None
        self.status = 200
        self.calls: list[tuple[str, list[str]]] = []

    def start(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):   # quiet
                pass

            def do_POST(self):
                m = _ROUTE.match(self.path.split("?")[0])
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not m:
                    return self._send(404, {"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}})
                fake.calls.append((m["project"], body.get("permissions", [])))
                if fake.status != 200:
                    return self._send(fake.status, {"error": {"code": fake.status, "status": "PERMISSION_DENIED",
                                      "message": "Cloud Resource Manager API has not been used in project"}})
                asked = body.get("permissions", [])
                held = [p for p in asked if fake.held is None or p in fake.held]
                self._send(200, {"permissions": held} if held else {})

            def _send(self, code, doc):
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
