"""`submit --max-restarts N`: xpk's restart contract (exit 42 or a signal tpuctl did not send), on the local
provider with its real agent, and the rule itself (tpuctl/host/restarts.py)."""
import json
import time

import pytest

from conftest import until
from jobs import SLEEP_JOB, make_job
from tpuctl import runtime
from tpuctl.host.restarts import Decision, decide

# Counts its own starts in the run's output directory (what survives a restart, as a checkpoint does), and exits
# with the code listed for this start: EXITS="42,42,0" exits 42 twice, then 0.
COUNTING_JOB = """
import os, signal, sys
p = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "starts")
n = int(open(p).read()) if os.path.exists(p) else 0
open(p, "w").write(str(n + 1))
print(f"start {n} restarts={os.environ['TPUCTL_RESTARTS']}", flush=True)
code = os.environ["EXITS"].split(",")[n]
if code == "TERM":
    os.kill(os.getpid(), signal.SIGTERM)   # killed by a signal nobody in tpuctl sent
sys.exit(int(code))
"""


@pytest.fixture
def local(local_up, monkeypatch):
    monkeypatch.setenv("TPUCTL_RESTART_BACKOFF", "0.02")   # the agent inherits it at `up`: restarts in milliseconds
    return local_up("rs")


def _job(tmp_path, exits):
    return make_job(tmp_path, COUNTING_JOB, f'[env]\nEXITS = "{exits}"\n')


def _row(cli):
    return json.loads(cli("jobs", "-c", "rs", "--json")[1])[0]


def test_a_job_that_exits_42_twice_then_0_succeeds_after_two_restarts(local, cli, tmp_path):
    code, out, err = cli("submit", str(_job(tmp_path, "42,42,0")), "-c", "rs", "--max-restarts", "2")
    assert code == 0, err
    assert [l for l in out.splitlines() if l.startswith("start")] == \
        ["start 0 restarts=0", "start 1 restarts=1", "start 2 restarts=2"]
    assert "the job exited 42; restart 1 of 2" in out and "restart 2 of 2" in out
    row = _row(cli)
    assert row["state"] == "succeeded" and row["restarts"] == 2 and row["exit_code"] == 0
    assert "succeeded (2 restarts)" in cli("jobs", "-c", "rs")[1]
    # the run page's events: each restart with the exit code it followed (run.restarted carries it)
    from tpuctl.core import state
    from tpuctl.core.store import LocalStore
    from tpuctl.ui import runview
    said = [e["what"] for e in runview.events(LocalStore(state.load("rs").spec.store), row["id"])]
    restarts = [w for w in said if w.startswith("started again")]   # as the page says it (runview.sentence)
    assert len(restarts) == 2 and all("after exit code 42" in w for w in restarts), said
    assert "restart 1 " in restarts[0] and "restart 2 " in restarts[1]


def test_restarts_stop_at_the_limit(local, cli, tmp_path):
    code, out, err = cli("submit", str(_job(tmp_path, "42,42,0")), "-c", "rs", "--max-restarts", "1")
    assert code == 42
    row = _row(cli)
    assert row["state"] == "failed" and row["restarts"] == 1


def test_any_other_exit_fails_at_once(local, cli, tmp_path):
    code, out, err = cli("submit", str(_job(tmp_path, "3,0")), "-c", "rs", "--max-restarts", "2")
    assert code == 3
    assert [l for l in out.splitlines() if l.startswith("start")] == ["start 0 restarts=0"]
    row = _row(cli)
    assert row["state"] == "failed" and row["restarts"] == 0


def test_a_job_killed_by_a_signal_tpuctl_did_not_send_is_restarted(local, cli, tmp_path):
    code, out, err = cli("submit", str(_job(tmp_path, "TERM,0")), "-c", "rs", "--max-restarts", "1")
    assert code == 0, err
    assert "the job exited 143; restart 1 of 1" in out
    assert _row(cli)["restarts"] == 1


def test_no_restart_by_default_as_xpk(local, cli, tmp_path):
    code, out, err = cli("submit", str(_job(tmp_path, "42,0")), "-c", "rs")
    assert code == 42 and _row(cli)["restarts"] == 0


def test_a_cancelled_run_is_not_restarted(local, cli, tmp_path):
    job = make_job(tmp_path, SLEEP_JOB)
    code, out, err = cli("submit", str(job), "-c", "rs", "--max-restarts", "3", "--detach")
    run_id = out.strip()
    until(lambda: _row(cli)["state"] == "running", 30, "the run running", every=0.2)
    assert cli("cancel", run_id, "-c", "rs")[0] == 0
    code, out, err = cli("logs", run_id, "-c", "rs", "-f")
    row = _row(cli)
    assert row["state"] == "cancelled" and row["restarts"] == 0 and out.count("started") == 1


@pytest.mark.parametrize("first_wait", ["0.05", "30"])
def test_cancel_stops_a_job_that_exits_42_at_once_under_a_million_restarts(local_up, cli, tmp_path, monkeypatch,
                                                                          first_wait):
    """Issue 38.1: such a job restarted about 34 times a second and 8 of 8 cancels changed nothing. Restarts back off
    (doubling from TPUCTL_RESTART_BACKOFF), and a cancel wins between restarts (0.05) and during a wait (30)."""
    monkeypatch.setenv("TPUCTL_RESTART_BACKOFF", first_wait)
    monkeypatch.setenv("TPUCTL_CANCEL_POLL", "0.1")
    local_up("rs")
    code, out, err = cli("submit", str(_job(tmp_path, ",".join(["42"] * 100))), "-c", "rs", "--max-restarts",
                         "1000000", "--detach")
    run_id = out.strip()
    if first_wait == "0.05":
        until(lambda: _row(cli)["restarts"] >= 3, 30, "restarts", every=0.05)
    else:   # inside the first wait: the restart it waits for is not counted yet
        until(lambda: "restart 1 in" in str(_row(cli).get("note")), 30, "the first wait", every=0.05)
    asked = time.monotonic()
    assert cli("cancel", run_id, "-c", "rs")[0] == 0
    until(lambda: _row(cli)["state"] == "cancelled", 10, "the cancel taking", every=0.05)
    assert time.monotonic() - asked < (3 if first_wait == "30" else 10)
    row = _row(cli)
    assert row["restarts"] < 20, row
    if first_wait == "30":
        # issue 52.7: cancelled during the wait, it counted the restart that never ran and showed exit 130
        assert row["restarts"] == 0 and row["exit_code"] == 42, row
    log = cli("logs", run_id, "-c", "rs")[1]
    assert len([line for line in log.splitlines() if line.startswith("start ")]) <= row["restarts"] + 1
    assert "the wait doubles" in log and "cancelled" in log, log


def test_the_restart_wait_doubles_to_its_cap_and_starts_over_after_a_healthy_run(monkeypatch):
    from tpuctl.host.restarts import backoff
    waits, w = [], 0.0
    for _ in range(9):
        w = backoff(w, ran=0.5)
        waits.append(w)
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert backoff(60, ran=600) == 1   # ten healthy minutes: back to the first step
    monkeypatch.setenv("TPUCTL_RESTART_BACKOFF", "0.01")
    assert backoff(0, ran=0) == 0.01


def test_a_negative_limit_is_refused_in_one_line(local, cli, tmp_path):
    code, out, err = cli("submit", str(_job(tmp_path, "0")), "-c", "rs", "--max-restarts", "-1")
    assert code == 2 and "--max-restarts -1 must be 0 or more" in err and "Traceback" not in err


@pytest.mark.parametrize("exit_code, sent, used, limit, expected", [
    (0, False, 0, 0, Decision.DONE),
    (runtime.RESTART_CODE, False, 0, 1, Decision.RESTART),
    (runtime.RESTART_CODE, False, 1, 1, Decision.FAIL),      # the limit is spent
    (runtime.RESTART_CODE, False, 0, 0, Decision.FAIL),      # xpk's default: no restarts
    (143, False, 0, 1, Decision.RESTART),                    # SIGTERM from elsewhere (OOM killer's 137 alike)
    (137, False, 0, 1, Decision.RESTART),
    (127, False, 0, 1, Decision.RESTART),                    # xpk's list starts at 127
    (1, False, 0, 5, Decision.FAIL),
    (126, False, 0, 5, Decision.FAIL),
    (143, True, 0, 5, Decision.RESUME),                      # tpuctl sent it: not the job's failure, not counted
    (0, True, 0, 5, Decision.RESUME),
])
def test_the_rule(exit_code, sent, used, limit, expected):
    assert decide(exit_code, sent, used, limit) is expected
