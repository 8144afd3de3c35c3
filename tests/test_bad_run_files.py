"""Issue 58, item 2: a run's files are written by its job and its host, and tpuctl must not trust them. A store
planted with each bad file beside good runs: `jobs`, `jobs --json`, `logs`, `download` and every page of `tpuctl ui`
still serve the good runs, the bad run's row says what is wrong with it, and no answer holds NaN (strict JSON)."""
import json
import os
import time

import pytest

from test_ui import browser  # noqa: F401 - the fixture: one Chromium a module, as test_ui starts it
from ui_server import ui_server

GOOD = ["20261128-100000-000-aaa1", "20261128-100001-000-aaa2"]
BAD = {   # run id: (what is planted, what its row says)
    "20261128-110000-000-bad1": ("metrics NaN", ""),
    "20261128-110001-000-bad2": ("metrics 400 digits", ""),
    "20261128-110002-000-bad3": ("metrics nested", "metrics.json is unreadable: nested too deeply"),
    "20261128-110003-000-bad4": ("metrics link out", "metrics.json is a link out of the store"),
    "20261128-110004-000-bad5": ("metrics huge", "metrics.json is larger than 100,000 bytes"),
    "20261128-110005-000-bad6": ("status corrupt", "status.json is unreadable: not JSON"),
    "20261128-110006-000-bad7": ("job corrupt", "job.json is unreadable: not JSON"),
    "20261128-110007-000-bad8": ("status types", "status.json is unreadable: its started is str, not float"),
    "20261128-110008-000-bad9": ("status state", "status.json is unreadable: 'bogus' is not a valid RunState"),
    "20261128-110009-000-bada": ("chips NaN", ""),
    "20261128-110010-000-badb": ("job not object", "job.json is unreadable: not a JSON object"),
}
DIGITS = "9" * 400


def strict(text):
    """json.loads as a strict parser reads it: NaN, Infinity and -Infinity are no JSON (RFC 8259 section 6)."""
    def refuse(name):
        raise ValueError(f"{name} in JSON")
    return json.loads(text, parse_constant=refuse)


def _plant(store, tmp_path):
    from tpuctl.core import layout, runindex
    from tpuctl.core.runs import RunSpec
    now = time.time() - 600

    def run(rid, name):
        store.write(layout.run_job(rid), json.dumps(RunSpec(id=rid, name=name, command="python train.py",
                                                            package="0" * 64, submitted=now).to_json()).encode())
        store.write(layout.run_status(rid, 0), json.dumps({"state": "succeeded", "exit_code": 0, "started": now,
                                                           "ended": now + 60, "heartbeat": now + 60}).encode())
        store.write(layout.log_chunk(rid, 0, 1), f"log of {rid}\n".encode())
        runindex.register(store, rid)
    for rid in GOOD:
        run(rid, "good")
        store.write(layout.run_metrics(rid), json.dumps({"step": 20, "metrics": {"loss": 0.5},
                                                        "history": {"loss": [[10, 1.0], [20, 0.5]]}}).encode())
        store.write(layout.run_output(rid) + "/model.bin", b"m" * 1000)
    for rid, (what, _) in BAD.items():
        run(rid, what.replace(" ", "-"))
        metrics_key, chips_key = layout.run_metrics(rid), layout.run_chips(rid, 0)
        if what == "metrics NaN":
            store.write(metrics_key, b'{"step": 3, "metrics": {"loss": NaN, "acc": Infinity}, '
                                     b'"history": {"loss": [[1, NaN], [2, -Infinity], [3, 0.25]]}}')
        elif what == "metrics 400 digits":
            store.write(metrics_key, f'{{"step": {DIGITS}, "metrics": {{"loss": {DIGITS}}}, "history": '
                                     f'{{"loss": [[1, 1e400], [2, {DIGITS}], [3, 0.5]]}}, '
                                     f'"attempts": [{{"start": {DIGITS}}}]}}'.encode())
        elif what == "metrics nested":
            store.write(metrics_key, b"[" * 90_000)
        elif what == "metrics link out":
            outside = tmp_path / "outside.json"
            outside.write_text('{"step": 1}')
            path = store.root / metrics_key
            path.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(outside, path)
        elif what == "metrics huge":
            store.write(metrics_key, json.dumps({"step": 1, "history": {"loss": [[i, 1.0] for i in range(20_000)]}})
                        .encode())
        elif what == "status corrupt":
            store.write(layout.run_status(rid, 0), b'{"state": "runn')
        elif what == "job corrupt":
            store.write(layout.run_job(rid), b"\xff\xfe\x00garbage")
        elif what == "job not object":
            store.write(layout.run_job(rid), b"[1, 2, 3]")
        elif what == "status types":
            store.write(layout.run_status(rid, 0), b'{"state": "running", "started": "yesterday"}')
        elif what == "status state":
            store.write(layout.run_status(rid, 0), b'{"state": "bogus"}')
        elif what == "chips NaN":
            store.write(chips_key, b'{"source": "tpu-info", "chips": [{"id": 0, "duty_cycle_pct": NaN}], '
                                   b'"history": {"duty_cycle_pct": [[1, NaN], [2, Infinity], [3, 40.0]], '
                                   b'"hbm_used_gib": [[1, 1e999]]}}')


@pytest.fixture
def planted(env, tmp_path, monkeypatch):
    from tpuctl.core import state
    from tpuctl.core.models import ClusterSpec, ClusterState, Phase, ProviderName
    from tpuctl.core.store import LocalStore
    monkeypatch.setenv("TPUCTL_RUN_FILE_MAX_BYTES", "100000")
    st = ClusterState(spec=ClusterSpec(name="bad", provider=ProviderName.LOCAL, store=str(tmp_path / "store")),
                      phase=Phase.DOWN, created_at=time.time() - 3600)
    state.save(st)
    store = LocalStore(st.spec.store)
    _plant(store, tmp_path)
    return store


def test_jobs_lists_the_good_runs_and_says_whats_wrong_with_each_bad_one(planted, cli):
    code, out, err = cli("jobs", "-c", "bad", "--json", "--all")
    assert code == 0, err
    rows = {r["id"]: r for r in strict(out)}
    assert set(rows) == set(GOOD) | set(BAD)
    for rid in GOOD:
        assert rows[rid]["state"] == "succeeded" and rows[rid]["loss"] == 0.5 and rows[rid]["step"] == 20
    for rid, (what, said) in BAD.items():
        assert said in rows[rid]["note"], (what, rows[rid])
        if said and what.startswith(("status", "job")):
            assert rows[rid]["state"] == "unreadable", (what, rows[rid])
    nan = rows["20261128-110000-000-bad1"]   # the points that are numbers kept, the rest dropped
    assert nan["step"] == 3 and nan["loss"] is None and nan["loss_curve"]
    digits = rows["20261128-110001-000-bad2"]
    assert digits["step"] == 0 and digits["loss"] is None and digits["goodput"] is None
    assert rows["20261128-110009-000-bada"]["tpu"] == "40%"   # the one sample that is a number
    code, out, err = cli("jobs", "-c", "bad", "--all")
    assert code == 0 and all(rid in out for rid in GOOD), err
    assert "! run 20261128-110006-000-bad7: job.json is unreadable" in err and "Traceback" not in err


def test_logs_and_download_serve_the_good_runs_and_refuse_a_bad_one_in_a_line(planted, cli, tmp_path):
    for rid in GOOD:
        code, out, err = cli("logs", rid, "-c", "bad")
        assert code == 0 and out == f"log of {rid}\n", err
    code, out, err = cli("logs", "-c", "bad")   # the latest run: its job.json is unreadable
    assert code != 0 and "job.json is unreadable" in err and "Traceback" not in err and "internal" not in err, err
    code, out, err = cli("download", GOOD[0], "-c", "bad", "-o", str(tmp_path / "got"))
    assert code == 0 and (tmp_path / "got" / "model.bin").read_bytes() == b"m" * 1000, err


def test_every_page_serves_the_good_runs_in_strict_json_and_never_a_500(planted, monkeypatch):
    import urllib.error
    import urllib.request
    monkeypatch.setenv("TPUCTL_UI_STORE_WAIT", "10")

    def get(path):
        req = urllib.request.Request(base + path + ("&" if "?" in path else "?") + "token=t")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
    with ui_server() as base:
        code, body = get("/api/runs?cluster=bad")
        rows = {r["id"]: r for r in strict(body)["rows"]}
        assert code == 200 and set(GOOD) <= set(rows), body[-500:]
        assert "job.json is unreadable" in rows["20261128-110006-000-bad7"]["note"]
        code, body = get("/api/runs")
        assert code == 200 and set(GOOD) <= {r["id"] for r in strict(body)["rows"]} and not strict(body)["problems"]
        for page in ("/", "/runs", "/runs?cluster=bad", "/leftovers"):
            assert get(page)[0] == 200, page
        for rid in [*GOOD, *BAD]:
            for path in (f"/api/run?cluster=bad&id={rid}", f"/run/bad/{rid}", f"/api/log?cluster=bad&id={rid}"):
                code, body = get(path)
                assert code in (200, 400, 404), (path, code, body[-300:])
                if path.startswith("/api/"):
                    strict(body)
        code, body = get("/api/run?cluster=bad&id=20261128-110009-000-bada")
        chips = strict(body)["chips"]["s0/w0"]
        assert chips["history"]["duty_cycle_pct"] == [[3.0, 40.0]] and chips["history"]["hbm_used_gib"] == []
        code, body = get(f"/api/run?cluster=bad&id={GOOD[0]}")
        assert code == 200 and strict(body)["metrics"][0]["points"] == [[10.0, 1.0], [20.0, 0.5]]


def _get(base, path, headers=None):
    import urllib.error
    import urllib.request
    req = urllib.request.Request(base + path, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_bad_inputs_are_answered_4xx_never_500(planted, monkeypatch):
    """Issue 58 item 3: a token beyond ASCII (compare_digest refuses a str that is not ASCII: a TypeError), digits
    that are not ASCII (str.isdigit() takes them, int() does not), `..` in /api/log's id, a run whose status is
    corrupt: each a 4xx."""
    monkeypatch.setenv("TPUCTL_UI_STORE_WAIT", "10")
    bad_status = "20261128-110005-000-bad6"
    with ui_server() as base:
        assert _get(base, "/?token=%C3%A9")[0] == 403
        assert _get(base, "/", {"X-Tpuctl-Token": "é".encode().decode("latin-1")})[0] == 403
        for path in ("/runs?page=%C2%B2", "/api/runs?page=%D9%A3", "/api/runs?cluster=bad&page=%C2%B2",
                     f"/api/log?cluster=bad&id={GOOD[0]}&worker=%C2%B2", f"/api/log?cluster=bad&id={GOOD[0]}&after=%C2%B9",
                     "/api/log?cluster=bad&id=..", "/api/log?cluster=bad&id=../../../../etc/passwd",
                     f"/api/run?cluster=bad&id={bad_status}", f"/run/bad/{bad_status}",
                     f"/api/log?cluster=bad&id={bad_status}", "/api/runs?page=99999999999999999999999999"):
            code, body = _get(base, path + "&token=t" if "?" in path else path + "?token=t")
            assert 400 <= code < 500 or (code == 200 and "page=999" in path), (path, code, body[-300:])
        code, body = _get(base, f"/api/log?cluster=bad&id={bad_status}&token=t")
        assert "status.json is unreadable" in strict(body)["error"]


def test_a_late_page_of_every_clusters_runs_reads_only_its_own_runs(planted, monkeypatch, tmp_path):
    """The every-cluster runs page at page N read every run of pages 0..N (and, slow, blamed the store): the
    clusters' indexes are listed up to the page and merged, and only the page's runs are read."""
    from tpuctl.control import submission
    from tpuctl.core import layout, runindex, state
    from tpuctl.core.models import ClusterSpec, ClusterState, Phase, ProviderName
    from tpuctl.core.runs import RunSpec
    from tpuctl.core.store import LocalStore
    st = ClusterState(spec=ClusterSpec(name="other", provider=ProviderName.LOCAL, store=str(tmp_path / "other")),
                      phase=Phase.DOWN)
    state.save(st)
    other = LocalStore(st.spec.store)
    mine = [f"20261128-1200{i:02d}-000-0c{i:02d}" for i in range(20)]
    for rid in mine:
        other.write(layout.run_job(rid), json.dumps(RunSpec(id=rid, name="o", command="c", package="0").to_json())
                    .encode())
        runindex.register(other, rid)
    every = sorted([*GOOD, *BAD, *mine], reverse=True)
    read = []
    real = submission._row
    monkeypatch.setattr(submission, "_row", lambda store, rid, repair=True: (read.append(rid), real(store, rid,
                                                                                                    repair))[1])
    monkeypatch.setenv("TPUCTL_UI_PAGE", "5")
    monkeypatch.setenv("TPUCTL_UI_STORE_WAIT", "10")
    with ui_server() as base:
        code, body = _get(base, "/api/runs?page=4&token=t")
    got = strict(body)
    assert code == 200 and [r["id"] for r in got["rows"]] == every[20:25] and got["more"], body[-400:]
    assert sorted(read) == sorted(every[20:25]) and not got["problems"]


def test_a_command_holding_html_shows_as_text_and_a_problem_as_its_words(planted, browser, monkeypatch):
    """A command holding `<!--<script>` blanked its run page (the embedded JSON's script element took it as the
    start of a comment: `<`, `>` and `&` are escaped in it now); and a problem of a cluster showed as
    `[object HTMLParagraphElement]` (a list of elements among an element's kids)."""
    from tpuctl.core import layout, runindex
    from tpuctl.core.runs import RunSpec
    from tpuctl.ui import views
    rid, command = "20261128-120000-000-3c3c", 'python t.py "<!--<script>" </script><b>x</b> && echo done'
    planted.write(layout.run_job(rid), json.dumps(RunSpec(id=rid, name="html", command=command, package="0")
                                                  .to_json()).encode())
    runindex.register(planted, rid)
    real = views._ids
    monkeypatch.setattr(views, "_ids", lambda n, last: (_ for _ in ()).throw(RuntimeError("boom")) if n == "gone"
                        else real(n, last))
    from tpuctl.core import state
    from tpuctl.core.models import ClusterSpec, ClusterState, Phase, ProviderName
    state.save(ClusterState(spec=ClusterSpec(name="gone", provider=ProviderName.LOCAL, store="/nonexistent"),
                            phase=Phase.DOWN))
    monkeypatch.setenv("TPUCTL_UI_STORE_WAIT", "10")
    context = browser.new_context()
    try:
        with ui_server() as base:
            page = context.new_page()
            code, body = _get(base, f"/run/bad/{rid}?token=t")
            assert code == 200 and "<!--" not in body.split('id="data"')[1].split("</script>")[0], body[-800:]
            page.goto(f"{base}/run/bad/{rid}?token=t")
            page.wait_for_selector("#summary p.dim")   # the page names the run in its h2, the command below it
            assert page.inner_text("#summary p.dim") == f"html: {command}"
            page.goto(f"{base}/runs?token=t")
            page.wait_for_selector("#runs p.bad")
            problems = page.inner_text("#runs")
            assert "gone: RuntimeError: boom" in problems and "[object" not in problems, problems
    finally:
        context.close()


def test_a_bucket_is_read_no_further_than_the_cap(cloud):
    """GcsStore.read_head: a ranged read (python-storage's download_as_bytes(start, end), `Range: bytes=0-N`); an
    absent object is None; a run file past the cap is Unreadable, not parsed."""
    from conftest import PROJECT
    from tpuctl.core import jobfiles, metrics
    from tpuctl.providers.google import clients
    from tpuctl.providers.google.gcs_store import GcsStore
    clients.storage(PROJECT).create_bucket("capped")
    store = GcsStore("gs://capped", PROJECT)
    store.write("big.json", b"x" * 5000)
    store.write("small.json", b'{"step": 3, "history": {"loss": [[1, NaN], [3, 0.5]]}}')
    store.write("empty.json", b"")
    assert store.read_head("big.json", 100) == b"x" * 100
    assert store.read_head("small.json", 10_000) == store.read("small.json")
    assert store.read_head("missing.json", 10) is None and store.read_head("empty.json", 10) == b""
    with pytest.raises(jobfiles.Unreadable, match="big.json is larger than 1,024 bytes"):
        jobfiles.read(store, "big.json", 1024)
    m, why = metrics.load(store, "small.json")
    assert why == "" and m.history == {"loss": [[3.0, 0.5]]}
