"""The fakes' one HTTP server base (fakes/wire.py): a client that drops its connection (a host powered off, a poll
given up, a killed job) prints nothing into the suite's log, nor does a request; a fake's own error still prints."""
from __future__ import annotations

import socket
import struct
import threading
import urllib.request

from fakes.wire import QuietHandler, serve, url_of

BODY = b"x" * (4 << 20)   # more than the sockets' buffers take, so the server's writes meet the closed connection


def _serving(do_get):
    """A fake whose GET is do_get(handler), and an event set once a request has been handled to its end (its
    error, if any, reported: ThreadingMixIn.process_request_thread calls shutdown_request last)."""
    class Handler(QuietHandler):
        def do_GET(self):
            do_get(self)
    server = serve(Handler)
    ended = threading.Event()
    shutdown = server.shutdown_request
    server.shutdown_request = lambda request: (shutdown(request), ended.set())
    return server, ended


def _drop(server):
    """A request whose client resets its connection before reading the answer (SO_LINGER 0: close sends RST)."""
    s = socket.create_connection(("127.0.0.1", server.server_port))
    s.sendall(b"GET / HTTP/1.1\r\nHost: fake\r\n\r\n")
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_a_client_that_drops_its_connection_prints_nothing(capfd):
    def slow_answer(h):
        got.wait(10)
        h.send_response(200)
        h.send_header("Content-Length", str(len(BODY) * 4))
        h.end_headers()
        for _ in range(4):
            h.wfile.write(BODY)
    got = threading.Event()
    server, ended = _serving(slow_answer)
    try:
        _drop(server)
        got.set()   # the client is gone: the handler writes into a reset connection
        assert ended.wait(10)
        assert urllib.request.urlopen(url_of(server), timeout=10).status == 200   # an ordinary request: no log line
    finally:
        server.shutdown()
        server.server_close()
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_a_fakes_own_error_still_prints(capfd):
    def broken(h):
        raise ValueError("the fake's own bug")
    server, ended = _serving(broken)
    try:
        try:
            urllib.request.urlopen(url_of(server), timeout=10)
        except Exception:
            pass   # the connection closed without an answer
        assert ended.wait(10)
    finally:
        server.shutdown()
        server.server_close()
    err = capfd.readouterr().err
    assert "ValueError: the fake's own bug" in err and "Traceback" in err
