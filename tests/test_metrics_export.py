"""`/metrics` (tpuctl/ui/metrics.py), `tpuctl ui --metrics-only/--token-file/--bind/--grafana-dashboard`, and the
shipped Grafana dashboard: over stores planted as submit and the agent write them, and, last, a real Prometheus
(Debian's `prometheus` 2.42, started by the test on a free port) scraping `tpuctl ui --metrics-only` while a small
run trains on the local provider."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import until
from jobs import make_job

pytest.importorskip("prometheus_client")

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def _get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def _run_id(i, base):
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(base + i * 60)) + f"-{i % 1000:03d}-{i % 65536:04x}"


def _plant_run(store, run_id, name, state, started, ended=None, step=100, loss=1.0, attempts=None):
    from tpuctl.core import layout, runindex
    from tpuctl.core.runs import RunSpec, RunStatus
    store.write(layout.run_job(run_id), json.dumps(RunSpec(id=run_id, name=name, command="python main.py",
                                                           package="0" * 64, submitted=started,
                                                           cluster="m").to_json()).encode())
    store.write(layout.run_claim(run_id, 0), json.dumps({"host": "h", "worker": 0, "time": started,
                                                         "attempt": 1}).encode())
    store.write(layout.run_status(run_id, 0), json.dumps(RunStatus(
        state=state, exit_code=0 if state.final else None, started=started, ended=ended,
        heartbeat=ended or time.time(), host="h").to_json()).encode())
    attempts = attempts or [{"start": started, "from": 0.0, "step": float(step), "last": (ended or time.time()),
                             "step_seconds": 0.8 * ((ended or time.time()) - started), "calls": 10.0,
                             "first_seconds": 0.0, "checkpoint_seconds": 1.0}]
    store.write(layout.run_metrics(run_id), json.dumps({
        "step": step, "metrics": {"loss": loss, "examples_per_s": 123.0},
        "history": {"loss": [[step, loss]]}, "attempts": attempts}).encode())
    store.create(layout.run_index(runindex.flip(run_id)), run_id.encode())
    if not state.final:
        store.create(layout.queue_entry(run_id), run_id.encode())


@pytest.fixture
def planted(env, monkeypatch):
    """Cluster `m` (local provider, no agent) with `finished` runs that succeeded and one running on 4 chips, its
    compute up for an hour at $2 an hour under a $10 budget, and an `up` that placed it after a capacity error."""
    from tpuctl.core import budget, layout, state, utilisation
    from tpuctl.core.models import ClusterSpec, ClusterState, Phase, ProviderName
    from tpuctl.core.runs import RunState
    from tpuctl.core.store import LocalStore
    monkeypatch.setenv("TPUCTL_PRICE_PER_HOUR", "2")
    now = time.time()
    root = env / "store"
    st = ClusterState(spec=ClusterSpec(name="m", provider=ProviderName.LOCAL, store=str(root)), phase=Phase.READY,
                      periods=[[now - 3600, 0.0]],
                      record={"up_placements": {"|capacity": [1, 2.5], "|ok": [2, 7.0]}})
    state.save(st)
    store = LocalStore(str(root))
    store.write(layout.RUN_INDEX_COMPLETE, b"0")
    budget.save(store, 10.0, 2.0, st.periods)
    base = now - 3000
    done = [_run_id(i, base) for i in range(10)]
    for i, rid in enumerate(done):
        _plant_run(store, rid, f"sweep-{i}", RunState.SUCCEEDED, base + i * 60, base + i * 60 + 30, loss=1 / (i + 1))
    live = _run_id(40, base)
    _plant_run(store, live, "live", RunState.RUNNING, now - 120, step=500, loss=0.5)
    doc = utilisation.record(utilisation.empty(1.0), now - 3, "tpu-info",
                             [{"id": float(c), "duty_cycle_pct": 90.0 + c, "hbm_used": 2.0 ** 30 * c,
                               "hbm_total": 16 * 2.0 ** 30} for c in range(4)])
    store.write(layout.run_chips(live, 0), json.dumps(doc).encode())
    return {"store": store, "done": done, "live": live, "state": st}


def _scrape():
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from tpuctl.ui import metrics
    reg = metrics.registry_for(metrics.RunsCollector())
    body, ctype = metrics.exposition(reg, OPENMETRICS)
    assert ctype.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
    return {f.name: f for f in text_string_to_metric_families(body.decode())}, body.decode(), reg


def _samples(fam, **labels):
    return [s for s in fam.samples if all(s.labels.get(k) == v for k, v in labels.items())]


def test_every_family_is_declared_with_no_cluster_and_none_has_a_series(env):
    """No cluster, no TPU: every family still has HELP and TYPE (a dashboard's queries are valid from the start)."""
    from tpuctl.ui import metrics
    fams, text, _ = _scrape()
    assert set(fams) == set(metrics.families()) and all(not f.samples for f in fams.values())
    for name, fam in metrics.families().items():
        assert f"# HELP {name} " in text and f"# TYPE {name} {fam.type}" in text


def test_a_scrape_exports_what_jobs_shows_for_each_run_and_cluster(planted):
    fams, _, _ = _scrape()
    live, first = planted["live"], planted["done"][0]
    lab = {"cluster": "m", "provider": "local", "run": live, "job": "live"}
    state = {s.labels["state"]: s.value for s in _samples(fams["tpuctl_run_state"], run=live)}
    assert state["running"] == 1 and sum(state.values()) == 1 and "stale" in state
    assert _samples(fams["tpuctl_run_step"], **lab)[0].value == 500
    assert _samples(fams["tpuctl_run_loss"], **lab)[0].value == 0.5
    assert _samples(fams["tpuctl_run_loss"], run=first)[0].value == 1.0
    assert _samples(fams["tpuctl_run_examples_per_second"], **lab)[0].value == 123
    ratio = _samples(fams["tpuctl_run_goodput_ratio"], **lab)[0].value
    assert 0.5 < ratio <= 0.8
    kinds = {s.labels["kind"]: s.value for s in _samples(fams["tpuctl_run_badput_seconds"], run=live)}
    assert set(kinds) == {"startup", "checkpoint", "wasted_progress", "disruption", "stalled", "other"}
    assert kinds["checkpoint"] == 1
    windows = {s.labels["window"]: s.value for s in _samples(fams["tpuctl_run_interval_goodput_ratio"], run=live)}
    assert set(windows) == {"1m", "5m", "15m"} and 0.7 < windows["1m"] <= 0.81   # only the running run has them
    assert not _samples(fams["tpuctl_run_interval_goodput_ratio"], run=first)
    assert 0.06 < _samples(fams["tpuctl_run_cost_dollars"], **lab)[0].value < 0.075   # ~120 s at $2/h
    assert _samples(fams["tpuctl_run_cost_dollars"], run=first)[0].value == pytest.approx(30 / 3600 * 2, abs=1e-3)
    assert _samples(fams["tpuctl_run_step_seconds"], **lab)[0].value == pytest.approx(0.8 * 120 / 500, rel=0.05)
    assert _samples(fams["tpuctl_run_resumes"], **lab)[0].name == "tpuctl_run_resumes_total"
    chips = {s.labels["chip"]: s.value for s in _samples(fams["tpuctl_chip_duty_cycle_ratio"], run=live, host="s0/w0")}
    assert chips == {"0": 0.9, "1": 0.91, "2": 0.92, "3": 0.93}
    assert _samples(fams["tpuctl_chip_hbm_total_bytes"], chip="2")[0].value == 16 * 2 ** 30
    assert 2 <= _samples(fams["tpuctl_chip_sample_age_seconds"], run=live)[0].value < 30
    assert not _samples(fams["tpuctl_chip_duty_cycle_ratio"], run=first)   # chips only while a run runs
    cl = {"cluster": "m", "provider": "local"}
    assert _samples(fams["tpuctl_cluster_cost_dollars_per_hour"], **cl)[0].value == 2
    assert _samples(fams["tpuctl_cluster_budget_dollars"], **cl)[0].value == 10
    assert 1.9 < _samples(fams["tpuctl_cluster_budget_spent_dollars"], **cl)[0].value < 2.1
    assert 7.9 < _samples(fams["tpuctl_cluster_budget_left_dollars"], **cl)[0].value < 8.1
    assert _samples(fams["tpuctl_cluster_scrape_error"], **cl)[0].value == 0
    prov = {(s.labels["result"], s.name): s.value for s in fams["tpuctl_up_provisioning_seconds"].samples}
    assert prov == {("ok", "tpuctl_up_provisioning_seconds_count"): 2, ("ok", "tpuctl_up_provisioning_seconds_sum"): 7,
                    ("capacity", "tpuctl_up_provisioning_seconds_count"): 1,
                    ("capacity", "tpuctl_up_provisioning_seconds_sum"): 2.5}
    assert {s.labels["zone"] for s in fams["tpuctl_up_provisioning_seconds"].samples} == {"local"}


def test_finished_runs_drop_out_past_the_keep_and_a_running_one_stays(planted, monkeypatch):
    """TPUCTL_METRICS_KEEP=3: the three newest runs (the running one among them) and no older; with 1, the
    running run still (it is not finished), and the newest finished one."""
    monkeypatch.setenv("TPUCTL_METRICS_KEEP", "3")
    fams, _, _ = _scrape()
    shown = {s.labels["run"] for s in fams["tpuctl_run_step"].samples}
    assert shown == {planted["live"], *planted["done"][-2:]}
    from tpuctl.ui import metrics
    assert len(fams["tpuctl_run_state"].samples) == 3 * len(metrics.STATES)   # one series a state a run, no more
    # an older run not finished is still exported, whatever the keep
    from tpuctl.core import layout, runs
    old = planted["done"][0]
    planted["store"].write(layout.run_status(old, 0), json.dumps(runs.RunStatus(
        state=runs.RunState.RUNNING, started=time.time() - 10, heartbeat=time.time()).to_json()).encode())
    planted["store"].create(layout.queue_entry(old), old.encode())
    monkeypatch.setenv("TPUCTL_METRICS_KEEP", "1")
    fams, _, _ = _scrape()
    assert {s.labels["run"] for s in fams["tpuctl_run_step"].samples} == {planted["live"], old}


def test_a_finished_run_is_read_once_and_scrapes_write_nothing(planted, monkeypatch):
    """The second scrape reads no finished run again (only the index, the queue, the budget and the running run),
    and no scrape writes to the store or the local state."""
    from tpuctl.core import state
    from tpuctl.core.store import LocalStore
    from tpuctl.ui import metrics
    writes, reads = [], []
    for name in ("write", "create", "write_if", "delete", "upload_file", "copy"):
        real = getattr(LocalStore, name)
        monkeypatch.setattr(LocalStore, name, lambda self, *a, _n=name, _r=real: (writes.append((_n, a[0])),
                                                                                  _r(self, *a))[1])
    real_read = LocalStore.read
    monkeypatch.setattr(LocalStore, "read", lambda self, key: (reads.append(key), real_read(self, key))[1])
    monkeypatch.setattr(state, "save", lambda st: writes.append(("state.save", st.name)))
    reg = metrics.registry_for(metrics.RunsCollector())
    metrics.exposition(reg, OPENMETRICS)
    first = list(reads)
    reads.clear()
    metrics.exposition(reg, OPENMETRICS)
    assert writes == []
    assert any(planted["done"][0] in k for k in first)
    again = {k for k in reads if any(rid in k for rid in planted["done"])}
    assert again == set(), sorted(again)
    assert any(planted["live"] in k for k in reads)
    # a store that needs the repairs `jobs` makes (its index's marker lost, an entry that names no run): still
    # read, still not written
    from tpuctl.core import layout
    store = planted["store"]
    store.delete(layout.RUN_INDEX_COMPLETE)
    store.write(layout.RUN_INDEX_PREFIX + "99/not-a-run", b"x")
    writes.clear()
    fams = {f.name: f for f in metrics.RunsCollector().collect()}
    assert writes == [] and {s.labels["run"] for s in fams["tpuctl_run_step"].samples} >= set(planted["done"])


def test_an_unreadable_store_is_a_series_not_a_failed_scrape(planted, monkeypatch):
    from tpuctl.core.store import LocalStore

    def broken(self, prefix, limit=None):
        raise OSError("the disk went away")
    monkeypatch.setattr(LocalStore, "list", broken)
    fams, _, _ = _scrape()
    assert _samples(fams["tpuctl_cluster_scrape_error"], cluster="m")[0].value == 1


def test_interval_goodput_counts_only_the_window():
    """An attempt productive 80% of its span: 0.8 in any window inside it; a window half after its last report
    (and past the lag) gets half; a second attempt that re-did 10 steps loses their time."""
    from tpuctl.core import goodput
    a = {"start": 1000.0, "from": 0.0, "step": 100.0, "last": 1100.0, "step_seconds": 80.0, "calls": 1.0,
         "first_seconds": 0.0}
    assert goodput.interval([a], 1000, 1040, 1100) == pytest.approx(0.8)
    assert goodput.interval([a], 1000, 1070, 1130) == pytest.approx(0.4)
    assert goodput.interval([a], 1000, 1070, 1130, lag=30) == pytest.approx(0.8)   # the job writes every 30 s
    assert goodput.interval([a], 1000, 1200, 1300, lag=30) == 0
    assert goodput.interval([a], 1000, 900, 1000) is None   # before the run
    b = {**a, "start": 1200.0, "from": 90.0, "step": 190.0, "last": 1300.0}
    assert goodput.interval([a, b], 1000, 1000, 1100) == pytest.approx(0.72)   # 10 of its 100 steps re-done


def test_metrics_needs_the_token_as_a_bearer(planted):
    from ui_server import ui_server
    with ui_server() as base:
        assert _get(base + "/metrics")[0] in (401, 403)
        assert _get(base + "/metrics", {"Authorization": "Bearer nope"})[0] in (401, 403)
        assert _get(base + "/metrics", {"Authorization": "Basic dDp0"})[0] in (401, 403)
        code, body, headers = _get(base + "/metrics", {"Authorization": "Bearer t", "Accept": OPENMETRICS})
        assert code == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
        assert b"tpuctl_run_step{" in body and body.endswith(b"# EOF\n")
        code, body, headers = _get(base + "/metrics", {"Authorization": "Bearer t"})   # no Accept: text 0.0.4
        assert code == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        from prometheus_client.parser import text_string_to_metric_families
        assert {f.name for f in text_string_to_metric_families(body.decode())} >= {"tpuctl_run_step"}


def test_the_token_file_is_the_owners_alone(tmp_path):
    from tpuctl.ui import tokenfile
    path = tmp_path / "token"
    path.write_text("old")
    path.chmod(0o644)
    tokenfile.write(str(path), "s3cr3t")
    assert path.read_text() == "s3cr3t\n" and path.stat().st_mode & 0o777 == 0o600


def _tpuctl(*args):
    return [sys.executable, "-m", "tpuctl", *args]


def _start_ui(env, *args):
    proc = subprocess.Popen(_tpuctl("ui", *args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    assert url.startswith("http://"), proc.stderr.read()
    return proc, url


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_metrics_only_with_a_token_file_on_another_address(planted, tmp_path):
    """`--metrics-only --token-file F --bind 127.0.0.2`: the URL names /metrics on that address without the token;
    the file holds it (0600); pages are not served; /metrics answers the bearer alone."""
    token_file = tmp_path / "tok"
    proc, url = _start_ui(dict(os.environ), "--metrics-only", "--token-file", str(token_file), "--bind", "127.0.0.2")
    try:
        assert re.fullmatch(r"http://127\.0\.0\.2:\d+/metrics", url), url
        token = token_file.read_text().strip()
        assert token and token_file.stat().st_mode & 0o777 == 0o600
        auth = {"Authorization": f"Bearer {token}"}
        assert _get(url, auth)[0] == 200 and _get(url)[0] in (401, 403)
        assert _get(url.replace("/metrics", "/"), auth)[0] == 404
        assert _get(url.replace("/metrics", "/api/clusters"), auth)[0] == 404
    finally:
        _stop(proc)


def test_an_address_not_here_and_an_unwritable_token_file_are_one_line_each(env, cli, tmp_path):
    code, out, err = cli("ui", "--metrics-only", "--bind", "203.0.113.7")   # TEST-NET-3: no address of this machine
    assert code == 2 and "error: a free port cannot be used on 203.0.113.7" in err and "--bind" in err, err
    code, out, err = cli("ui", "--metrics-only", "--token-file", str(tmp_path / "no" / "such" / "dir" / "t"))
    assert code == 2 and "--token-file" in err and "cannot be written" in err and "Traceback" not in err, err


def test_the_dashboard_is_printed_and_its_queries_name_only_exported_metrics(env, cli):
    """`tpuctl ui --grafana-dashboard` prints the shipped JSON; every panel's query names only metrics /metrics
    exports (a family's own name, or its `_total`/`_sum`/`_count` samples); and the JSON has what Grafana's dashboard
    model requires (see test_the_dashboard_fits_grafanas_schema)."""
    from tpuctl.ui import dashboard, metrics
    code, out, _ = cli("ui", "--grafana-dashboard")
    assert code == 0 and json.loads(out) == dashboard.load()
    exported = set()
    for name, fam in metrics.families().items():
        exported |= {name} | ({f"{name}_total"} if fam.type == "counter" else set()) \
            | ({f"{name}_sum", f"{name}_count"} if fam.type == "summary" else set())
    queries = dashboard.queries(dashboard.load())
    assert len(queries) >= 10
    for title, expr in queries:
        named = set(re.findall(r"\btpuctl_[a-z_]+", expr))
        assert named and named <= exported, (title, named - exported)
    titles = {t for t, _ in queries}
    assert {"Runs by state", "Dollars per hour", "TPU duty cycle per chip", "Loss", "Step time", "Goodput",
            "Badput by kind"} <= titles


# Grafana's classic dashboard schema, transcribed from its CUE source (grafana/grafana kinds/dashboard/
# dashboard_kind.cue, schema 0.0, the model the JSON-model docs page describes): a field with no `?` and no default
# is required (at the top every field is optional or has a default: a dashboard to import needs at least its title,
# uid, panels and schemaVersion, which Grafana migrates from); enums and bounds as the CUE gives them. Left out: a
# variable's `state` (a #LoadingState Grafana sets at run time, absent from dashboards Grafana itself exports). No
# Grafana can be installed here (no Debian or PyPI package), so this is as far as the JSON can be checked without one.
_REF = {"type": "object", "properties": {"type": {"type": "string"}, "uid": {"type": "string"}}}
_GRID = {"type": "object", "required": ["h", "w", "x", "y"], "properties": {
    "h": {"type": "integer", "exclusiveMinimum": 0}, "w": {"type": "integer", "exclusiveMinimum": 0, "maximum": 24},
    "x": {"type": "integer", "minimum": 0, "exclusiveMaximum": 24}, "y": {"type": "integer", "minimum": 0}}}
_PANEL = {"type": "object", "required": ["type", "transformations", "options", "fieldConfig"], "properties": {
    "type": {"type": "string", "minLength": 1, "not": {"const": "row"}}, "id": {"type": "integer", "minimum": 0},
    "title": {"type": "string"}, "description": {"type": "string"}, "transparent": {"type": "boolean"},
    "datasource": _REF, "gridPos": _GRID, "targets": {"type": "array", "items": {"type": "object"}},
    "transformations": {"type": "array"}, "options": {"type": "object"},
    "fieldConfig": {"type": "object", "required": ["defaults", "overrides"], "properties": {
        "defaults": {"type": "object", "properties": {"unit": {"type": "string"}, "custom": {"type": "object"}}},
        "overrides": {"type": "array"}}}}}
_ROW = {"type": "object", "required": ["type", "collapsed", "id", "panels"], "properties": {
    "type": {"const": "row"}, "collapsed": {"type": "boolean"}, "title": {"type": "string"}, "datasource": _REF,
    "gridPos": _GRID, "id": {"type": "integer", "minimum": 0}, "panels": {"type": "array", "items": _PANEL}}}
GRAFANA_DASHBOARD = {"type": "object", "required": ["title", "uid", "panels", "schemaVersion"], "properties": {
    "id": {"type": ["integer", "null"]}, "uid": {"type": "string", "minLength": 8, "maxLength": 40},
    "title": {"type": "string"}, "description": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "style": {"enum": ["light", "dark"]}, "timezone": {"type": "string"}, "editable": {"type": "boolean"},
    "graphTooltip": {"enum": [0, 1, 2]},
    "time": {"type": "object", "required": ["from", "to"], "properties": {"from": {"type": "string"},
                                                                          "to": {"type": "string"}}},
    "timepicker": {"type": "object"}, "fiscalYearStartMonth": {"type": "integer", "minimum": 0, "maximum": 11},
    "liveNow": {"type": "boolean"}, "weekStart": {"type": "string"}, "refresh": {"type": ["string", "boolean"]},
    "schemaVersion": {"type": "integer", "minimum": 0, "maximum": 65535}, "version": {"type": "integer", "minimum": 0},
    "panels": {"type": "array", "items": {"oneOf": [_PANEL, _ROW]}},
    "templating": {"type": "object", "properties": {"list": {"type": "array", "items": {
        "type": "object", "required": ["type", "name", "hide"], "properties": {
            "type": {"enum": ["query", "adhoc", "constant", "datasource", "interval", "textbox", "custom", "system"]},
            "name": {"type": "string"}, "label": {"type": "string"}, "hide": {"enum": [0, 1, 2]},
            "query": {"type": ["string", "object"]}, "datasource": _REF}}}}},
    "annotations": {"type": "object", "properties": {"list": {"type": "array", "items": {
        "type": "object", "required": ["name", "datasource", "enable", "iconColor"], "properties": {
            "name": {"type": "string"}, "datasource": _REF, "enable": {"type": "boolean"}, "hide": {"type": "boolean"},
            "iconColor": {"type": "string"}, "type": {"type": "string"}}}}}},
    "links": {"type": "array"}}}


def test_the_dashboard_fits_grafanas_schema():
    """The shipped JSON against Grafana's dashboard schema (above), and what the schema cannot say: panels placed
    inside the 24-column grid, unique ids, the rows, the variables, every query on the data-source variable and
    templated on the cluster (and, in the run row, on the run)."""
    import jsonschema
    from tpuctl.ui import dashboard
    doc = dashboard.load()
    jsonschema.validate(doc, GRAFANA_DASHBOARD)
    broken = {**doc, "graphTooltip": 3}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, GRAFANA_DASHBOARD)   # the schema refuses what Grafana's does
    assert doc["id"] is None and doc["schemaVersion"] >= 36
    assert [v["name"] for v in doc["templating"]["list"]] == ["DS_PROMETHEUS", "cluster", "run"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    rows = [p for p in doc["panels"] if p["type"] == "row"]
    assert [r["title"] for r in rows] == ["Fleet", "Run"]
    run_row = rows[1]["gridPos"]["y"]
    for p in doc["panels"]:
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        for t in p.get("targets", []):
            assert t["refId"] and t["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
            assert 'cluster=~"$cluster"' in t["expr"]
            assert p["gridPos"]["y"] < run_row or 'run=~"$run"' in t["expr"]


# -- a real Prometheus ---------------------------------------------------------------------------------------------

TRAIN = """
import time
from tpuctl import runtime
p = runtime.Progress()
for s in range(1, 100000):
    time.sleep(0.1)
    p.step(s, 0.08, loss=10.0 / s)
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(base, expr):
    code, body, _ = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    doc = json.loads(body)
    assert code == 200 and doc["status"] == "success", (expr, body[-500:])
    return doc["data"]["result"]


@pytest.mark.slow(60)
def test_a_real_prometheus_scrapes_a_training_run(tmp_path, monkeypatch):
    """Prometheus 2.42 (Debian's) scrapes `tpuctl ui --metrics-only` every second with the token file as its bearer
    credentials, while a small job trains on the local provider (runtime.Progress, a step every 0.1 s) and libtpu's
    metrics service (the fake) answers the agent's chip sampler: through Prometheus's HTTP API, up is 1, the run's
    step rises, its loss, goodput and cost are there, and every query of the shipped dashboard returns a series; then
    the exporter restarts with a new token in the same file, and the scrapes succeed again without a reload."""
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.skip("no prometheus binary here (apt-get install -y prometheus; .ci/run installs it)")
    from fakes.libtpu_metrics import FakeLibtpuMetrics

    from tpuctl.ui import dashboard
    libtpu_port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPUCTL_", "GOOGLE_", "CLOUDSDK_"))
           and not k.endswith("_EMULATOR_HOST")}
    env.update(TPUCTL_HOME=str(tmp_path / "home"), TPUCTL_CONFIG=str(tmp_path / "config.toml"),
               CLOUDSDK_CONFIG=str(tmp_path / "g"), GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "missing.json"),
               TPUCTL_TPU_METRICS_SECONDS="0.5", TPUCTL_PRICE_PER_HOUR="2", TPUCTL_PROGRESS_SECONDS="0.5",
               TPUCTL_TPU_METRICS_ADDR=f"localhost:{libtpu_port}")
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def cli(*args):
        r = subprocess.run(_tpuctl(*args), env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout
    cli("up", "--provider", "local", "-c", "prom", "--budget", "5")
    libtpu = FakeLibtpuMetrics(chips=2, port=libtpu_port)
    ui = prom = None
    try:
        run = cli("submit", str(make_job(tmp_path, TRAIN, 'framework = "jax"\n', name="train")), "-c", "prom",
                  "--detach").strip()
        token = tmp_path / "token"
        ui, url = _start_ui(env, "--metrics-only", "--token-file", str(token))
        target = urllib.parse.urlparse(url).netloc
        port = _free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(f"""
global: {{scrape_interval: 1s, scrape_timeout: 1s}}
scrape_configs:
  - job_name: tpuctl
    metrics_path: /metrics
    authorization: {{type: Bearer, credentials_file: {token}}}
    static_configs: [{{targets: ['{target}']}}]
""")
        prom = subprocess.Popen([exe, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        until(lambda: _can_get(base + "/-/ready"), 30, "Prometheus ready")
        until(lambda: [r for r in _query(base, "up") if r["value"][1] == "1"], 30,
              lambda: f"up == 1: {_get(base + '/api/v1/targets')[1][-600:]}")
        sel = f'{{run="{run}"}}'
        first = until(lambda: _query(base, f"tpuctl_run_step{sel}"), 30, "the run's step in Prometheus")
        step0 = float(first[0]["value"][1])
        until(lambda: float(_query(base, f"tpuctl_run_step{sel}")[0]["value"][1]) > step0, 20, "the step rising")
        for expr in ("tpuctl_run_loss", "tpuctl_run_goodput_ratio", "tpuctl_run_cost_dollars"):
            until(lambda e=expr: _query(base, e + sel), 20, f"{expr} of the run")
        # every panel's query: the variables as Grafana fills them with "All" (.*) and with this run
        for title, expr in dashboard.queries(dashboard.load()):
            q = expr.replace("$cluster", ".*").replace("$run", run)
            until(lambda q=q: _query(base, q), 20, f"a series for panel {title!r}: {q}")
        # a restarted exporter writes a new token to the same file: Prometheus reads the file for every scrape
        # (prometheus/common config/http_config.go, NewAuthorizationCredentialsFileRoundTripper: "This file is
        # read for every request"), so its scrapes succeed again with no reload
        old_token = token.read_text()
        _stop(ui)
        ui, _ = _start_ui(env, "--metrics-only", "--token-file", str(token), "--port", target.rsplit(":", 1)[1])
        assert token.read_text() != old_token
        time.sleep(3)
        until(lambda: [r for r in _query(base, "min_over_time(up[2s])") if r["value"][1] == "1"], 20,
              lambda: f"scrapes with the new token: {_get(base + '/api/v1/targets')[1][-600:]}")
    finally:
        for proc in (prom, ui):
            if proc is not None:
                _stop(proc)
        libtpu.stop()
        subprocess.run(_tpuctl("down", "-c", "prom", "--yes"), env=env, capture_output=True, timeout=120)


def _can_get(url):
    try:
        return _get(url)[0] == 200
    except OSError:
        return False
