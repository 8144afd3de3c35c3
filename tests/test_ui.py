"""`tpuctl ui` against one local cluster with real runs (one succeeded with a falling loss, one failed, one running
and printing), made once for the module: the real command in its own process, its pages in Debian's chromium
driven by Playwright (skipped, with the reason, only where no Chromium can be had)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import tpuctl_at_a_terminal, until
from fakes.libtpu_metrics import FakeLibtpuMetrics
from jobs import make_job
from ui_server import _can_connect, ui_server

# one cluster, one server, one browser for the module (about 40 s here: started early, beside the others)
pytestmark = [pytest.mark.xdist_group("ui"), pytest.mark.slow(40)]

GOOD = """
import time
from tpuctl import runtime
p = runtime.Progress()
for s in range(1, 61):
    time.sleep(0.005)
    p.step(s, 0.005, loss=10.0 / s, accuracy=s / 60)
    print(f"step {s} loss {10.0 / s:.3f}", flush=True)
p.flush()
"""
BAD = """
print("about to fail", flush=True)
raise SystemExit(3)
"""
LIVE = """
import itertools, time
for i in itertools.count():
    print(f"tick {i}", flush=True)
    time.sleep(0.2)
"""
WORKER_1 = b"worker one says hello\n"
SECRET = "SECRETTOKEN42"
ORPHAN = "20261127-120000-000-beef"


def _cli(env, *args, timeout=120):
    r = subprocess.run([sys.executable, "-m", "tpuctl", *args], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The cluster `uitest` with its three runs, and `tpuctl ui --no-browser` serving it."""
    tmp = tmp_path_factory.mktemp("ui")
    with socket.socket() as probe:   # libtpu's metrics service answers only from the live run on (see _serve)
        probe.bind(("127.0.0.1", 0))
        libtpu_port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPUCTL_", "GOOGLE_", "CLOUDSDK_"))
           and not k.endswith("_EMULATOR_HOST")}
    env.update(TPUCTL_HOME=str(tmp / "home"), TPUCTL_CONFIG=str(tmp / "config.toml"), CLOUDSDK_CONFIG=str(tmp / "g"),
               GOOGLE_APPLICATION_CREDENTIALS=str(tmp / "missing.json"), TPUCTL_TPU_METRICS_SECONDS="0.5",
               TPUCTL_UI_POLL_SECONDS="0.3", TPUCTL_LOG_POLL_MAX="0.2", TPUCTL_NOTIFY_RETRY_FOR="0.3",
               TPUCTL_NOTIFY_BACKOFF="0.1", TPUCTL_PRICE_PER_HOUR="2",
               TPUCTL_TPU_METRICS_ADDR=f"localhost:{libtpu_port}")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        # a webhook nothing answers, its path the secret: its notifications are given up on, shown masked
        _cli(env, "up", "--provider", "local", "-c", "uitest", "--notify", f"http://127.0.0.1:1/{SECRET}",
             "--budget", "5")
        try:
            yield from _serve(tmp, env, libtpu_port)
        finally:
            subprocess.run([sys.executable, "-m", "tpuctl", "down", "-c", "uitest", "--yes"], env=env,
                           capture_output=True, timeout=120)


def _serve(tmp, env, libtpu_port):
    from tpuctl.core import layout, runs, state, utilisation
    from tpuctl.core.store import LocalStore
    st = state.load("uitest")
    store = LocalStore(st.spec.store)
    good = _cli(env, "submit", str(make_job(tmp, GOOD, name="good")), "-c", "uitest", "--detach").strip()
    bad = _cli(env, "submit", str(make_job(tmp, BAD, name="bad")), "-c", "uitest", "--detach").strip()
    until(lambda: runs.status(store, good).state.final and runs.status(store, bad).state.final, 120, "two runs")
    # from here libtpu's metrics service answers the agent (the first two runs found it silent)
    libtpu = FakeLibtpuMetrics(chips=4, port=libtpu_port)
    live = _cli(env, "submit", str(make_job(tmp, LIVE, 'framework = "jax"\n', name="live")), "-c", "uitest",
                "--detach").strip()
    until(lambda: runs.status(store, live).state is runs.RunState.RUNNING
          and store.read(layout.log_chunk(live, 0, 1)) is not None, 120, "the live run printing")
    until(lambda: len(((utilisation.parse(store.read(layout.run_chips(live, 0))) or {}).get("history") or {})
                      .get("duty_cycle_pct", [])) >= 3, 60, "three samples of the live run's chips")
    # a second host of the live run, as a multi-host slice's worker 1 ships its log (the store is the control plane)
    st.host.hosts = 2
    state.save(st)
    store.write(layout.log_chunk(live, 1, 1), WORKER_1)
    # data a killed submit left (core/orphans.py): what the leftovers page must name, with the command removing it
    store.write(layout.submitting(ORPHAN), json.dumps({"left_by": "a submit killed before its job.json"}).encode())
    store.write(layout.run_data(ORPHAN) + "corpus.txt", b"x" * 1000)
    # SIGINT as a terminal's Ctrl-C, even where the suite runs with it ignored (a background job of a script)
    proc = subprocess.Popen(tpuctl_at_a_terminal("ui", "--no-browser"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:") and "/?token=" in url, proc.stderr.read()
    base, token = url.split("/?token=")
    try:
        yield {"url": url, "base": base, "token": token, "proc": proc, "store": store, "env": env,
               "runs": {"good": good, "bad": bad, "live": live}, "libtpu_port": libtpu_port}
    finally:
        libtpu.stop()
        proc.send_signal(signal.SIGINT)   # Ctrl-C
        try:
            code = proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("tpuctl ui did not end on Ctrl-C")
        _cli(env, "cancel", live, "-c", "uitest")
        assert code == 130 and "tpuctl ui stopped" in proc.stderr.read()   # Ctrl-C's exit, said in one line
        assert not _can_connect(int(base.rsplit(":", 1)[1]))   # nothing left listening


@pytest.fixture(scope="module")
def browser():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no Chromium here (apt-get install -y chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(site, browser):
    """A page of a browser that has opened the printed URL (its tab holds the token: app.js)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    refused = []   # what the page's Content-Security-Policy refused: nothing the pages themselves do
    p.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    p.goto(site["url"])
    yield p
    context.close()
    assert refused == []


def _get(url, headers=None, method="GET"):
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def _listening(port):
    """Every listening socket on `port`, as /proc/net/tcp and tcp6 show them (local address, hex)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, st = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if st == "0A" and int(hexport, 16) == port:
                found.append(addr)
    return found


def test_the_token_is_required_nothing_binds_beyond_loopback_and_nothing_is_written(site):
    base, token = site["base"], site["token"]
    port = int(base.rsplit(":", 1)[1])
    assert _get(base + "/")[0] == 403
    assert _get(base + "/api/runs?cluster=uitest")[0] == 403
    assert _get(base + "/static/app.js")[0] == 403
    assert _get(base + "/?token=" + "x" * len(token))[0] == 403
    code, body, headers = _get(site["url"])
    assert code == 200 and b"uitest" in body
    assert headers["set-cookie"] is None   # nothing another port of 127.0.0.1 would receive (server.py)
    assert _get(base + "/api/runs?cluster=uitest", {"X-Tpuctl-Token": token})[0] == 200   # how app.js asks
    assert _get(base + "/api/runs?cluster=uitest", {"X-Tpuctl-Token": token[:-1]})[0] == 403
    assert _get(base + "/api/runs?cluster=uitest&token=" + token, method="POST")[0] == 405
    assert _listening(port) == ["0100007F"]   # 127.0.0.1 alone (little-endian hex)
    assert headers["referrer-policy"] == "no-referrer" and headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert "script-src 'self';" in headers["content-security-policy"]
    # a page of another name that resolves here (DNS rebinding) is refused, token or not; the names of this machine
    # are not
    for host, code in ((f"evil.example:{port}", 403), ("evil.example", 403), (f"127.0.0.1.evil.example:{port}", 403),
                       (f"localhost:{port}", 200), (f"LOCALHOST:{port}", 200), (f"127.0.0.1:{port}", 200)):
        assert _get(site["url"], {"Host": host})[0] == code, host


def test_the_host_names_a_server_answers_to_are_a_set_it_is_given():
    from tpuctl.ui import server
    assert [server.host_name(h) for h in ("127.0.0.1:80", "localhost", "[::1]:8700", "::1", "Example.COM:1")] == \
        ["127.0.0.1", "localhost", "::1", "::1", "example.com"]
    assert server.same_token("t", "t") and not server.same_token("é", "t") and not server.same_token(None, "t")


def test_jobs_shows_the_chips_duty_cycle_or_why_there_is_none(site):
    rows = {r["id"]: r for r in json.loads(_cli(site["env"], "jobs", "-c", "uitest", "--json"))}
    for name in ("good", "bad"):   # the service was silent: said, never an error
        assert rows[site["runs"][name]]["tpu"].startswith(f"n/a (libtpu's runtime metrics service on localhost:"
                                                          f"{site['libtpu_port']} did not answer (UNAVAILABLE)")
    live = rows[site["runs"]["live"]]
    assert live["tpu"] == "50%" and live["tpu_duty_pct"] == 50.0   # the fake's four chips at 50%


def _shot(page, name):
    """docs/ui.md's screenshots, taken when TPUCTL_UI_SCREENSHOTS names a directory (docs/img when refreshing them)."""
    where = os.environ.get("TPUCTL_UI_SCREENSHOTS")
    if where:
        page.screenshot(path=str(Path(where) / f"ui-{name}.png"), full_page=True)


def test_the_pages_in_a_browser(site, page):
    good, bad, live = (site["runs"][k] for k in ("good", "bad", "live"))
    page.wait_for_selector("table.clusters td[data-label=state]:has-text('ready')", timeout=30000)
    assert "uitest" in page.inner_text("table.clusters")

    page.wait_for_selector("table.clusters td[data-label=notifications]:has-text('not delivered')", timeout=30000)
    assert "http://127.0.0.1/***" in page.inner_text("table.clusters")
    assert " of $5.00 ($" in page.inner_text("table.clusters td[data-label=budget]")   # spent of the cap, and left
    _shot(page, "clusters")

    page.click("text=uitest")
    page.wait_for_selector("table.runs")
    text = page.inner_text("table.runs")
    for rid, state in ((good, "succeeded"), (bad, "failed"), (live, "running")):
        row = page.inner_text(f"tr:has(a:text-is('{rid}'))")
        assert state in row, (rid, row)
    assert text.index(live) < text.index(bad) < text.index(good)   # newest first
    _shot(page, "runs")

    page.click(f"a:text-is('{good}')")
    page.wait_for_selector("#metric-loss canvas")
    history = json.loads(Path(site["store"].local_path(f"runs/{good}/output/metrics.json")).read_text())["history"]
    assert page.get_attribute("#metric-loss", "data-points") == str(len(history["loss"])) == "60"
    assert page.eval_on_selector("#charts", "c => c.querySelector('figure').id") == "metric-loss"   # loss first
    assert page.get_attribute("#metric-accuracy", "data-points") == "60"
    events = page.inner_text("#events")
    assert events.index("submitted") < events.index("claimed") < events.index("succeeded (exit code 0)")
    assert "metrics.json" in page.inner_text("#outputs")
    assert f"tpuctl logs {good} -c uitest -f" in page.inner_text("#commands")
    assert "s0/w0: n/a (libtpu's runtime metrics service" in page.inner_text("#chips-shown")
    # the log comes by its own request (app.js followLog), not with the run's page: waited for, as the live run's is
    page.wait_for_selector("#log-text:has-text('step 60 loss 0.167')")
    _shot(page, "run")

    page.goto(f"{site['base']}/run/uitest/{bad}")
    page.wait_for_selector("#events li:has-text('failed (exit code 3)')")
    page.wait_for_selector("#log-text:has-text('about to fail')")
    page.wait_for_selector("#events li:has-text('to http://127.0.0.1/*** given up')")

    page.click("nav >> text=Runs")   # every cluster's runs: the cluster named in each row
    page.wait_for_selector(f"table.runs tr:has(a:text-is('{good}')) td[data-label=cluster]:text-is('uitest')")

    page.click("nav >> text=Leftovers")
    page.wait_for_selector(f"#leftovers td:has-text('{ORPHAN}')", timeout=30000)
    assert "tpuctl down -c uitest" in page.inner_text("#leftovers")
    _shot(page, "leftovers")
    for path in ("/", "/runs", f"/run/uitest/{bad}", "/leftovers", "/api/clusters", "/api/leftovers"):
        assert SECRET not in _get(site["base"] + path + "?token=" + site["token"])[1].decode(), path


def _ticks(text):
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith("tick ")]


def test_a_running_runs_log_follows_without_reload_and_its_hosts_switch(site, page):
    page.goto(f"{site['base']}/run/uitest/{site['runs']['live']}")
    page.wait_for_selector("#log-text:has-text('tick')")
    first = max(_ticks(page.inner_text("#log-text")))
    newest = [first]
    page.on("framenavigated", lambda f: newest.append(-1))   # a reload would show here
    until(lambda: max(_ticks(page.inner_text("#log-text"))) >= first + 5, 30, "newer lines without a reload")
    assert -1 not in newest
    assert page.eval_on_selector_all("#host option", "os => os.map(o => o.textContent)") == ["s0/w0", "s0/w1"]
    page.select_option("#host", "1")
    page.wait_for_selector("#log-text:has-text('worker one says hello')")
    assert "tick" not in page.inner_text("#log-text")
    page.select_option("#host", "0")
    page.wait_for_selector("#log-text:has-text('tick')")
    assert "s0/w0: 50%" in page.inner_text("#chips-shown")   # the chips' duty cycle, and its chart over time
    history = json.loads(site["store"].read(f"tpuctl/runs/{site['runs']['live']}/tpu-metrics.json"))["history"]
    drawn = int(page.get_attribute("[id='chips-s0/w0'] ", "data-points"))
    assert drawn >= 3 and drawn <= len(history["duty_cycle_pct"]) + 10   # the page polls as samples come
    assert page.query_selector("[id='hbm-s0/w0'] canvas") is not None
    _shot(page, "live")
    page.set_viewport_size({"width": 400, "height": 800})   # a phone: everything within the width
    page.goto(f"{site['base']}/runs?cluster=uitest")
    page.wait_for_selector("table.runs")
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
    _shot(page, "runs-400")


def test_a_slow_cloud_does_not_delay_a_page(site, monkeypatch):
    """The cluster's `status` and every read of its store made to take 5 s (a cloud, a bucket that answer slowly):
    each page comes at once (within 2.5 s on a loaded machine: half the wait), saying what is being asked and for
    how long."""
    from tpuctl.control import status as status_flow
    from tpuctl.ui import runview, views

    def slow(real):   # keywords too: the page asks status(st, prov, repair=False), and a TypeError there came back
        return lambda *a, **k: (time.sleep(5), real(*a, **k))[1]   # at once, before the page when loaded
    monkeypatch.setattr(status_flow, "status", slow(status_flow.status))
    monkeypatch.setattr(views, "_rows", slow(views._rows))
    monkeypatch.setattr(runview, "run", slow(runview.run))
    with ui_server() as base:
        started = time.monotonic()
        code, body, _ = _get(base + "/?token=t")
        took = time.monotonic() - started
        assert code == 200 and took < 2.5, took
        # asking for 0 s, or 1-2 s where a loaded machine let time pass since the server began asking
        assert re.search(rb'"age": "asking \([0-2]s\)"', body) and b'"status": {}' in body
        for path, said in (("/runs?cluster=uitest", b"uitest: its store has not answered (asking ("),
                           (f"/run/uitest/{site['runs']['good']}", b'"pending": "its store has not answered (asking')):
            started = time.monotonic()
            code, body, _ = _get(base + path + ("&" if "?" in path else "?") + "token=t")
            assert code == 200 and said in body, body[-500:]
            assert time.monotonic() - started < 2.5, path


def test_console_and_logging_links_on_google_cloud_in_xpks_shapes():
    """xpk's "Follow your workload here" link and its Logs Explorer query (src/xpk/commands/workload.py); none where
    the cluster has no console (local) or no project."""
    import urllib.parse

    from tpuctl.core.models import ClusterSpec, ClusterState, ProviderName
    from tpuctl.ui import links
    run = "20261128-101010-123-abcd"
    gke = ClusterState(spec=ClusterSpec(name="big", provider=ProviderName.GKE, project="p1", tpu_type="v6e-16",
                                        slices=2), zone="us-east5")
    got = {l["title"]: l["url"] for l in links.for_run(gke, run)}
    js = f"tpuctl-{run}"
    assert got[f"JobSet {js} (Cloud Console)"] == \
        f"https://console.cloud.google.com/kubernetes/service/us-east5/tpuctl-big/default/{js}/details?project=p1"
    query = urllib.parse.unquote(got[f"logs of {js}'s pods (Cloud Logging)"].split("query;query=")[1].split("?")[0])
    assert query.splitlines() == ['resource.type="k8s_container"', 'resource.labels.project_id="p1"',
                                  'resource.labels.location="us-east5"', 'resource.labels.cluster_name="tpuctl-big"',
                                  f'resource.labels.pod_name:"{js}-"', "severity>=DEFAULT"]
    assert [t for t in got if t.startswith("node pool")] == ["node pool tpuctl-big-np-0 (Cloud Console)",
                                                             "node pool tpuctl-big-np-1 (Cloud Console)"]
    vm = ClusterState(spec=ClusterSpec(name="one", provider=ProviderName.GCP, project="p1", tpu_type="v5litepod-8"),
                      zone="us-west4-a")
    assert links.for_run(vm, run)[0]["url"] == \
        "https://console.cloud.google.com/compute/tpus/details/us-west4-a/tpuctl-one?project=p1"
    assert links.for_run(ClusterState(spec=ClusterSpec(name="here", provider=ProviderName.LOCAL)), run) == []


def test_a_character_split_between_two_chunks_is_shown_whole(tmp_path):
    """The agent ships at 64 KiB or each second, not at character boundaries: a page that decoded each read alone
    would show the halves of a split character as two replacement marks."""
    from tpuctl.core import layout
    from tpuctl.core.store import LocalStore
    from tpuctl.ui.runview import read_from
    store, run = LocalStore(str(tmp_path)), "20261128-101010-123-abcd"
    text = "loss 0.5 한국어\n".encode()
    store.write(layout.log_chunk(run, 0, 1), text[:11])   # ends inside 한
    got = read_from(store, run, 0, 1, 0, final=False)
    assert got["text"] == "loss 0.5 " and (got["next"], got["skip"]) == (1, 9)
    store.write(layout.log_chunk(run, 0, 2), text[11:])
    got = read_from(store, run, 0, got["next"], got["skip"], final=False)
    assert got["text"] == "한국어\n" and (got["next"], got["skip"]) == (3, 0)
    assert read_from(store, run, 0, 3, 0, final=True) == {"text": "", "next": 3, "skip": 0, "final": True}


def test_the_command_refuses_a_taken_port_and_a_missing_extra_in_one_line(env, cli, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        code, out, err = cli("ui", "--port", str(port), "--no-browser")
    assert code == 2 and f"error: --port {port} cannot be used on 127.0.0.1" in err and "hint:" in err, err
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    code, out, err = cli("ui", "--no-browser")
    assert code == 2 and "tpuctl ui needs uvicorn, not installed" in err and "pip install 'tpuctl[ui]'" in err, err
    assert "Traceback" not in err and out == ""


def test_the_browser_is_handed_a_file_only_the_user_reads_never_the_token(site, browser, tmp_path):
    """Python's webbrowser runs $BROWSER when it is set (its docs: "the command ... %s is replaced by the URL"): a
    script standing in for the browser writes down the arguments it was given, which any local user could read in
    /proc/PID/cmdline. They name a file of mode 0600 that sends a browser to the URL (Jupyter's
    jpserver-PID-open.html); the URL with its token is printed on the user's terminal alone."""
    opened = tmp_path / "opened"
    stub = tmp_path / "browser"
    stub.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {opened}\n")
    stub.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-m", "tpuctl", "ui"], env={**site["env"], "BROWSER": f"{stub} %s"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        until(lambda: opened.exists() and opened.read_text().strip(), 30, "the browser started")
        args = opened.read_text().split()
        token = url.split("?token=")[1]
        assert url.startswith("http://127.0.0.1:") and len(token) >= 24
        assert len(args) == 1 and args[0].startswith("file:///") and token not in args[0], args
        path = Path(urllib.parse.unquote(args[0][len("file://"):]))
        assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
        assert url in path.read_text()
        context = browser.new_context()   # and a browser given that file lands on the page, its URL without the token
        page = context.new_page()
        page.goto(args[0])
        page.wait_for_selector("table.clusters")
        assert page.url.startswith(url.split("?")[0]) and "token" not in page.url
        context.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(20)
    assert not path.exists()   # removed as it ends


class _Recorder:
    """Another local server on another port of 127.0.0.1 (any the user's browser visits): it writes down every
    request it receives, headers and all."""

    def __init__(self):
        import http.server
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append((self.path, list(self.headers.items())))
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(b"<!doctype html><p>another server</p>")

            def log_message(self, *a):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_another_local_server_receives_nothing_the_ui_accepts(site, browser):
    """Issue 58: a cookie of 127.0.0.1 goes to every port of it. The browser opens the UI, follows its links, and
    then visits another server on 127.0.0.1, by a link of the UI's page and directly: that server receives no
    cookie, no Referer, nothing holding the token, and no header it received, replayed to the UI, opens it."""
    other = _Recorder()
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(site["url"])
        page.click("text=uitest")
        page.wait_for_selector("table.runs")
        assert "token" not in page.url
        page.evaluate("u => { const a = document.createElement('a'); a.href = u + '/from-the-page'; a.id = 'out';"
                      " a.textContent = 'out'; document.body.append(a); }", other.url)
        page.click("#out")
        page.wait_for_selector("text=another server")
        page.goto(other.url + "/typed")
        page.goto(site["base"].replace("127.0.0.1", "localhost") + "/")   # the UI's port by its other name
        assert context.cookies() == []
    finally:
        context.close()
        other.close()
    assert [p for p, _ in other.seen if p != "/favicon.ico"] == ["/from-the-page", "/typed"]
    token = site["token"]
    for path, headers in other.seen:
        assert token not in path and not [v for k, v in headers if token in v], headers
        assert not [k for k, v in headers if k.lower() in ("cookie", "authorization")], headers
        assert not [v for k, v in headers if site["base"] in v], headers   # no Referer from the UI's page
        assert _get(site["base"] + "/api/clusters", dict(headers))[0] == 403
        for k, v in headers:
            assert _get(site["base"] + "/api/clusters", {k: v})[0] == 403, k


def _polls(page):
    """The status of every /api/ answer `page` receives from here on."""
    got = []
    page.on("response", lambda r: got.append(r.status) if "/api/" in r.url else None)
    return got


def test_two_uis_in_one_browser_both_keep_working_and_a_page_whose_token_went_says_so(site, browser, monkeypatch):
    """Two `tpuctl ui` (their own ports and tokens) in one browser: each page keeps polling its own server, 200s only
    (a cookie per browser replaced the first's: its page froze on silent 403s). Then the first is restarted on its
    port with a new token: its page says so, and its reload says what to open."""
    monkeypatch.setenv("TPUCTL_UI_POLL_SECONDS", "0.2")
    context = browser.new_context()
    try:
        with ui_server("first-token") as one, ui_server("second-token") as two:
            a, b = context.new_page(), context.new_page()
            seen_a, seen_b = _polls(a), _polls(b)
            a.goto(one + "/runs?cluster=uitest&token=first-token")
            b.goto(two + "/?token=second-token")
            a.wait_for_selector("table.runs")
            b.wait_for_selector("table.clusters")
            a.reload()   # the address bar holds no token now: the tab's own copy is asked again
            a.wait_for_selector("table.runs")
            # Playwright hands a page's events over only while a call of it waits: the wait is the page's own
            until(lambda: (a.wait_for_timeout(100), len(seen_a) >= 5 and len(seen_b) >= 5)[1], 30,
                  "five polls of each page")
            assert set(seen_a) == {200} and set(seen_b) == {200}, (seen_a, seen_b)
            assert a.query_selector("#lost") is None and b.query_selector("#lost") is None
            port = int(one.rsplit(":", 1)[1])
        with ui_server("a-new-token", port=port):
            a.wait_for_selector("#lost:has-text('no longer accepts this page')", timeout=20000)
            a.reload()
            a.wait_for_selector("#why:has-text('needs the token')")
            assert a.query_selector("table.runs") is None
    finally:
        context.close()


GHOST = "20261128-000000-000-dead"   # an index entry of a run that does not exist


def _fetch_twice_with_and_without_the_index(base, fetch_all, store, marker, rid, writes):
    from tpuctl.core import layout
    for indexed in (False, True):
        if indexed:   # an indexed store with entries naming no run
            store.write(layout.RUN_INDEX_COMPLETE, marker or b"0")
            writes.clear()   # the test's own write
        fetch_all(base)
        fetch_all(base)
        shown = {r["id"] for r in json.loads(_get(base + "/api/runs?cluster=uitest&token=t")[1])["rows"]}
        assert set(rid.values()) <= shown and GHOST not in shown
        clusters = json.loads(_get(base + "/api/clusters?token=t")[1])["clusters"]
        assert clusters[0]["status"]["phase"] == "stopped"   # the stop shown, not saved
        assert writes == [], (indexed, writes)


def test_no_page_writes_anything_while_jobs_still_repairs(site, monkeypatch):
    """Issue 51: "It only reads". The store made to need every repair `jobs` and `status` make (its index's marker
    lost, as a store made before the index; an entry naming no run; one that is no run id; the host's record of a
    stop that the local state has not closed): every page and /api/ endpoint is fetched, each background question
    answered, and fetched again, and neither the store nor the local state is written once. Then `jobs`' own path
    repairs them as before."""
    from tpuctl.core import layout, runindex, state
    from tpuctl.core.store import LocalStore

    store, rid = site["store"], site["runs"]
    marker = store.read(layout.RUN_INDEX_COMPLETE)
    planted = [layout.run_index(runindex.flip(GHOST)), layout.RUN_INDEX_PREFIX + "99/not-a-run"]
    for key in planted:
        store.write(key, b"x")
    store.write(layout.STOPPED, json.dumps({"time": time.time(), "reason": "a test's stop"}).encode())
    store.delete(layout.RUN_INDEX_COMPLETE)   # a store never indexed: read from its runs
    store.delete(layout.ORPHANS_CHECKED)      # nor looked over for what earlier releases left
    writes = []
    for name in ("write", "create", "write_if", "delete", "upload_file", "copy"):
        real = getattr(LocalStore, name)
        monkeypatch.setattr(LocalStore, name, lambda self, *a, _n=name, _r=real: (writes.append((_n, a[0])),
                                                                                  _r(self, *a))[1])
    monkeypatch.setattr(state, "save", lambda st: writes.append(("state.save", st.name)))
    monkeypatch.setenv("TPUCTL_UI_STORE_WAIT", "5")
    live = rid["live"]
    paths = ["/", "/runs", "/runs?cluster=uitest", "/leftovers", f"/run/uitest/{GHOST}", "/metrics",
             "/api/clusters", "/api/runs", "/api/runs?cluster=uitest", "/api/leftovers",
             f"/api/run?cluster=uitest&id={GHOST}",
             *[f"/run/uitest/{r}" for r in rid.values()], *[f"/api/run?cluster=uitest&id={r}" for r in rid.values()],
             *[f"/api/log?cluster=uitest&id={live}&worker={w}{after}" for w in (0, 1) for after in ("", "&after=1")]]

    def fetch_all(base):
        for path in paths:
            code, body, _ = _get(base + path + ("&" if "?" in path else "?") + "token=t")
            assert code in (200, 404), (path, code, body[-300:])
        until(lambda: not [t for t in threading.enumerate() if t.name.startswith("tpuctl-ui-")], 60,
              "the pages' background questions answered")
    try:
        with ui_server() as base:
            _fetch_twice_with_and_without_the_index(base, fetch_all, store, marker, rid, writes)
        assert state.load("uitest").compute_since   # the local state as it was: its compute still open
    finally:
        store.delete(layout.STOPPED)
        monkeypatch.undo()
    # `jobs`' path repairs as before: the entries naming no run are removed from the index
    from tpuctl.control import submission
    said = []
    assert GHOST in runindex.newest(store, report=said.append) and said   # the entry that is no run id: gone
    assert GHOST not in {r["id"] for r in submission.table(store, ids=[GHOST])}   # the run that does not exist
    assert [k for k in planted if store.read(k) is not None] == []


def test_the_read_only_index_pages_past_entries_that_name_no_run_and_reads_an_unindexed_store(tmp_path):
    """runindex.newest(repair=False), what the runs page lists: the same runs `jobs` lists, a page filled past the
    entries that name no run (which stay for `jobs` to remove), and a store never indexed read from its runs."""
    from tpuctl.core import layout, runindex
    from tpuctl.core.store import LocalStore
    store = LocalStore(str(tmp_path))
    ids = [f"20261128-10101{i}-000-abcd" for i in range(5)]
    for rid in ids:
        store.write(layout.run_job(rid), b"{}")
    assert runindex.newest(store, 2, repair=False) == ids[::-1][:2]   # no marker: from the runs themselves
    assert store.list("tpuctl/index/") == []                         # and nothing indexed
    runindex.rebuild(store)
    bad = [layout.RUN_INDEX_PREFIX + "0/not-a-run-" + str(i) for i in range(3)]   # listed before every run
    for key in bad:
        store.write(key, b"x")
    assert runindex.newest(store, 2, repair=False) == ids[::-1][:2]
    assert runindex.newest(store, None, repair=False) == ids[::-1]
    assert all(store.read(k) is not None for k in bad)
    assert runindex.newest(store, 2, report=lambda m: None) == ids[::-1][:2]   # `jobs`: removed on the way
    assert not [k for k in bad if store.read(k) is not None]


def test_ctrl_c_under_load_stops_the_ui_within_seconds(site):
    """Issue 58: Ctrl-C while pages are being asked (a browser's polls, many tabs) did not stop `tpuctl ui` within
    10 s (2 of 4): uvicorn waits for every request in flight to be answered, without end unless told. Its graceful
    shutdown is bounded (server.SHUTDOWN_SECONDS). The polls and half-sent requests alone end at once without the
    bound (every answer here takes well under a second: the store is asked in the background), so the load holds
    one answer that cannot end: a tab that stopped reading (a suspended laptop's browser, a stalled network), asking
    for a log answer of 4 MiB (runview.POLL_BYTES; 24 MiB as JSON) with a receive window of a few KiB. uvicorn's
    send of it waits on the transport's drain (its flow control) for as long as the reader does."""
    from tpuctl.core import layout
    stalled_log = layout.log_chunk(site["runs"]["live"], 7, 1)   # a worker no other test reads
    site["store"].write(stalled_log, b"\x01" * (4 * 2 ** 20))
    proc = subprocess.Popen(tpuctl_at_a_terminal("ui", "--no-browser"), env=site["env"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    base, token = url.split("/?token=")
    stop = threading.Event()
    paths = ["/", "/runs?cluster=uitest", f"/run/uitest/{site['runs']['good']}", "/api/runs",
             f"/api/log?cluster=uitest&id={site['runs']['live']}", f"/api/run?cluster=uitest&id={site['runs']['bad']}"]

    def load(i):
        import http.client
        while not stop.is_set():
            try:   # a kept-alive connection, as a browser's: asked again at once
                conn = http.client.HTTPConnection(base.split("//")[1], timeout=30)
                while not stop.is_set():
                    conn.request("GET", paths[i % len(paths)], headers={"X-Tpuctl-Token": token})
                    conn.getresponse().read()
            except OSError:
                time.sleep(0.05)
    threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(24)]
    for t in threads:
        t.start()
    half = []   # and connections that sent half a request, and wait
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])))
        s.sendall(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        half.append(s)
    stalled = socket.socket()   # and the tab that stopped reading: its window set before the connection opens
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", int(base.rsplit(":", 1)[1])))
    stalled.sendall(f"GET /api/log?cluster=uitest&id={site['runs']['live']}&worker=7&after=1 HTTP/1.1\r\n"
                    f"Host: 127.0.0.1\r\nX-Tpuctl-Token: {token}\r\n\r\n".encode())
    half.append(stalled)
    try:
        until(lambda: stalled.recv(1, socket.MSG_PEEK), 30, "the stalled tab's answer begun")
        time.sleep(2)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
        took = time.monotonic() - started
    finally:
        stop.set()
        for s in half:
            s.close()
        if proc.poll() is None:
            proc.kill()
        site["store"].delete(stalled_log)
    err = proc.stderr.read()
    assert code == 130 and took < 10, (code, took, err)
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "tpuctl ui stopped", err


def test_the_server_leaves_the_processs_logging_handlers_open():
    """uvicorn's default logging set-up (dictConfig) closed every handler of the process, and absl's closes its
    stream unless it is the sys.stderr of the moment: a test worker that had imported TensorFlow then served a page
    had its capture file closed under it, and every later test there failed ("I/O operation on closed file")."""
    import io
    import logging

    from absl.logging import PythonHandler

    from tpuctl.ui import server
    from tpuctl.ui.figures import Figures
    stream = io.StringIO()
    handler = PythonHandler(stream)   # as absl's import makes it, on the sys.stderr of then
    logging.getLogger("tpuctl-test-absl").addHandler(handler)
    try:
        server.uvicorn_config(server.build("t", Figures()))
        assert not stream.closed
    finally:
        logging.getLogger("tpuctl-test-absl").removeHandler(handler)
