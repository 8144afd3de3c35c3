"""`tpuctl ui`'s server run in the test's own process (so a test can slow or record what the pages call), on a port
the system picks, with the token "t" (or the one given)."""
import contextlib
import socket
import threading

from conftest import until


@contextlib.contextmanager
def ui_server(token="t", port=None):
    """Yields the server's base URL; stops it after."""
    import uvicorn

    from tpuctl.ui import server
    from tpuctl.ui.figures import Figures
    sock = server.bind(port)
    srv = uvicorn.Server(server.uvicorn_config(server.build(token, Figures())))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    port = sock.getsockname()[1]
    try:
        until(lambda: _can_connect(port), 10, "the server")
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(10)
        sock.close()


def _can_connect(port):
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
        return True
    except OSError:
        return False
