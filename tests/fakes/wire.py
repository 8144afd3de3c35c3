"""What every HTTP fake is built on: one server (Server, serve) and request handler (QuietHandler) that keep the
suite's log quiet (no access lines, no traceback for a client that dropped its connection; tests/test_fakes_wire.py),
and what it answers with: a JSON body, and Google's REST error shape
(cloud.google.com/apis/design/errors: {"error": {"code", "message", "status"}})."""
from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def send_json(handler, code: int, doc) -> None:
    data = json.dumps(doc).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def send_error(handler, code: int, status: str, message: str) -> None:
    send_json(handler, code, {"error": {"code": code, "message": message, "status": status}})


class QuietHandler(BaseHTTPRequestHandler):
    """The request handler every fake's derives from: no access line on stderr for each request
    (BaseHTTPRequestHandler.log_message writes one, and log_error goes through it too), so the suite's log shows
    what matters. A fake's errors still print: they end in Server.handle_error."""

    def log_message(self, format, *args) -> None:
        pass


class Server(ThreadingHTTPServer):
    """The HTTP server of every fake. A client that drops its connection mid-request (a simulated host powered off,
    a poll given up, a killed job) is the field's normal, not the fake's error: socketserver prints a traceback for
    it (BaseServer.handle_error, from ThreadingMixIn.process_request_thread), which read as failures in CI's log.
    Every ConnectionError (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) is such a drop; any other
    error still prints."""
    daemon_threads = True   # (ThreadingHTTPServer's own): a request still held open never holds up the test's exit

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def serve(handler) -> Server:
    """`handler` (a QuietHandler class) served on an ephemeral port of 127.0.0.1, in a daemon thread."""
    server = Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serve_json(handle):
    """A JSON HTTP fake on an ephemeral port: handle(method, path without query, body) -> (code, document), or
    (code, (status, message)) for an error in Google's shape. Returns the server (its URL: url_of(server))."""
    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def _go(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            code, doc = handle(self.command, self.path.split("?")[0], body)
            if code >= 400:
                send_error(self, code, doc[0], doc[1])
            else:
                send_json(self, code, doc)
        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _go

    return serve(Handler)


def url_of(server) -> str:
    return f"http://127.0.0.1:{server.server_port}"
