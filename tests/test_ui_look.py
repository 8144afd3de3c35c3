"""The run page's look (issue 63, item 7), what the server side of it decides: events as sentences, no `cancel` for
a finished run, sizes people read, goodput never above 100%."""
from tpuctl.core import goodput
from tpuctl.ui import runview


def test_events_read_as_sentences():
    said = [runview.sentence(e) for e in (
        {"event": "run.started", "host": "vm", "time": 1, "cluster": "c", "run": "r"},
        {"event": "run.restarted", "host": "vm", "attempt": 2, "restart": 1, "exit_code": 42},
        {"event": "run.finished", "exit_code": 0, "loss": 7.123456789, "duration_s": 12.5, "goodput_pct": 80.0,
         "cost_usd": 0.5},
        {"event": "run.failed", "exit_code": 3, "log_tail": "boom"},
        {"event": "cluster.stopped", "reason": "autostop", "why": "no run for 30m"},
        {"event": "budget.warning", "budget_usd": 5.0, "spent_usd": 4.5},
        {"event": "cluster.something_new", "some_field": 1})]
    assert said == ["started on vm", "started again on vm, attempt 2 (restart 1 after exit code 42)",
                    "finished with loss 7.1235 after 12.5 s, goodput 80.0%, cost $0.50", "failed with exit code 3",
                    "the cluster's compute was ended: no run for 30m",
                    "the budget is nearly spent: $4.50 of $5.00", "cluster something new: some field 1"]


def test_a_finished_run_is_offered_no_cancel():
    assert any("cancel" in c for c in runview.commands("c", "r", final=False))
    finished = runview.commands("c", "r", final=True)
    assert not any("cancel" in c for c in finished) and "tpuctl logs r -c c -f" in finished


def test_outputs_carry_a_size_people_read(tmp_path):
    from tpuctl.core import layout
    from tpuctl.core.store import LocalStore
    store = LocalStore(str(tmp_path))
    store.write(layout.run_output("20261101-120000-000-aaaa") + "/model.bin", b"x" * 3_500_000)
    [o] = runview.outputs(store, "20261101-120000-000-aaaa")
    assert o["bytes"] == 3_500_000 and o["size"] in ("3.5 MB", "3.3 MiB"), o


def test_goodput_is_never_above_100_percent():
    """A 40-step run of a fraction of a second: the job's step times summed past the host's wall clock (422%)."""
    attempt = {"start": 100.0, "from": 0.0, "step": 40.0, "last": 100.2, "step_seconds": 0.85, "calls": 40.0,
               "first_seconds": 0.01, "checkpoint_seconds": 0.0}
    assert goodput.breakdown([attempt], 100.0, 100.2)["goodput_pct"] <= 100


LOSS_JOB = """
import os
from tpuctl import runtime
p = runtime.Progress()
for s in range(1, 41):
    p.step(s, 0.001, loss=10.0 / s)
p.flush()
open(os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "model.bin"), "wb").write(b"x" * 3000)
"""


def test_the_run_page_in_a_browser(local_up, cli, tmp_path, monkeypatch):
    """The run's id and cluster head the page; the loss has a log scale; goodput is explained on this machine; a
    finished run offers no cancel; sizes are human; events are sentences; the legend fits 400 px."""
    import shutil

    import pytest
    from jobs import make_job
    from ui_server import ui_server
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no Chromium here (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright
    monkeypatch.setenv("TPUCTL_UI_POLL_SECONDS", "0.3")
    local_up("look")
    code, out, err = cli("submit", str(make_job(tmp_path, LOSS_JOB)), "-c", "look")
    assert code == 0, err
    run_id = cli("jobs", "-c", "look", "--json")[1].split('"id": "')[1].split('"')[0]
    with ui_server() as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            page = browser.new_context(viewport={"width": 400, "height": 900}).new_page()
            page.goto(f"{base}/?token=t")
            page.goto(f"{base}/run/look/{run_id}")
            page.wait_for_selector("#metric-loss canvas")
            assert page.inner_text("#summary h2") == f"Run {run_id} on cluster look"
            assert page.get_attribute("#metric-loss", "data-scale") == "log"
            assert "at most 100%" in page.inner_text("#goodput-note")
            assert "2.9 KiB" in page.inner_text("#outputs") or "3.0 kB" in page.inner_text("#outputs")
            assert "cancel" not in page.inner_text("#commands")
            events = page.inner_text("#events")
            assert "started on" in events and "finished" in events and "host " not in events, events
            legend = page.eval_on_selector("#metric-loss .u-legend", "e => e.getBoundingClientRect().width")
            assert legend <= 400
            # a sweep: two runs picked on the runs page, their losses on one chart
            assert cli("submit", str(make_job(tmp_path / "b", LOSS_JOB.replace("10.0 / s", "20.0 / s"))), "-c",
                       "look")[0] == 0
            page.goto(f"{base}/runs?cluster=look")
            page.wait_for_selector("table.runs input.pick")
            boxes = page.locator("table.runs input.pick")   # found again at each use: the poll redraws the table
            for i in range(boxes.count()):
                boxes.nth(i).check()
            page.wait_for_selector("#compare-chart[data-runs='2'] canvas")
            assert page.get_attribute("#compare-chart", "data-scale") == "log"
            assert run_id in page.inner_text("#compare .u-legend")
            page.wait_for_timeout(1500)   # the table is drawn again by its poll: what was picked stays picked
            assert page.eval_on_selector_all("table.runs input.pick", "bs => bs.map(b => b.checked)") == [True, True]
        finally:
            browser.close()
