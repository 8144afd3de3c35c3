"""metrics.json: what a job writes through tpuctl.runtime and `tpuctl jobs` reads."""
import json

from tpuctl.core.metrics import MetricsLog, parse, sparkline, thin


def test_history_is_capped_and_keeps_the_whole_curve():
    log = MetricsLog(cap=50)
    for step in range(1, 1001):
        log.record(step, {"loss": 10 - step / 100, "lr": 1e-3, "note": "text is not a metric"})
    doc = json.loads(json.dumps(log.to_json()))
    pts = doc["history"]["loss"]
    assert len(pts) <= 50 and pts[0] == [1, 9.99] and pts[-1] == [1000, 0.0]
    assert [p[0] for p in pts] == sorted(p[0] for p in pts)
    assert doc["step"] == 1000 and doc["metrics"] == {"loss": 0.0, "lr": 1e-3}


def test_a_resumed_run_replaces_the_steps_it_redoes():
    log = MetricsLog()
    for step in (10, 20, 30):
        log.record(step, {"loss": step})
    resumed = parse(json.dumps(log.to_json()).encode())
    resumed.record(20, {"loss": 99})                  # restarted from the step-10 checkpoint, now at 20 again
    assert resumed.history["loss"] == [[10, 10], [20, 99]]


def test_unreadable_files_are_ignored():
    for raw in (None, b"", b"{", b"[]", b'{"history": 5}'):
        assert parse(raw) is None or parse(raw).history == {}


def test_sparkline():
    assert sparkline([]) == ""
    assert sparkline([3, 2, 1]) == "█▅▁"
    line = sparkline([float(100 - i) for i in range(100)], width=16)
    assert len(line) == 16 and line[0] == "█" and line[-1] == "▁"
    assert thin([[i, i] for i in range(7)], cap=4) == [[0, 0], [2, 2], [4, 4], [6, 6]]
