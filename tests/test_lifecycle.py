"""The compute ends by itself, enforced by the agent (issue 12's first part, on the local provider): autostop,
--max-duration, submit --down; cost so far in status; durations. On Google Cloud hosts: test_self_teardown.py."""
import json
import time

import pytest

from conftest import until
from jobs import SLEEP_JOB, make_job
from tpuctl.core import state
from tpuctl.core.lifecycle import Clock, Policy, parse_duration
from tpuctl.providers.local import LocalProvider


def _wait_stopped(name, timeout=30):
    st = state.load(name)
    until(lambda: not LocalProvider().agent_alive(st), timeout, f"cluster {name}'s agent to stop")


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("off", 0)])
def test_durations(text, seconds):
    assert parse_duration(text, "--autostop") == seconds


def test_bad_durations_exit_2(env, cli):
    for bad in ("10", "5x", "-3m", "0m", "m"):
        code, out, err = cli("up", "--provider", "local", "-c", "d", "--autostop", bad)
        assert code == 2 and "is not a duration" in err, bad
    assert state.load("d") is None


def test_the_clock():
    c = Clock(now=100.0)
    p = Policy(autostop=60)
    assert c.due(p, running=False, now=159.0) == "" and "autostop" in c.due(p, running=False, now=160.0)
    assert c.due(p, running=True, now=500.0) == ""                   # never while a run is active
    c.busy(now=500.0)
    assert c.due(p, running=False, now=530.0) == ""
    assert "deadline" in c.due(Policy(deadline=10.0), running=True, now=11.0)


def test_autostop_waits_for_the_run_then_ends_the_agent_and_up_brings_it_back(local_up, cli, tmp_path):
    code, out, err = cli("up", "--provider", "local", "-c", "auto", "--autostop", "3s")   # its plan is checked
    assert code == 0 and "after 3s with no run" in err, err
    job = make_job(tmp_path, "import time; time.sleep(5); print('slept')")
    code, out, err = cli("submit", str(job), "-c", "auto")              # longer than the autostop: never cut
    assert code == 0 and "slept" in out, err
    info = json.loads(cli("status", "-c", "auto", "--json")[1])
    assert "next:" in info["autostop"]
    _wait_stopped("auto", timeout=20)
    info = json.loads(cli("status", "-c", "auto", "--json")[1])
    assert info["phase"] == "stopped" and "autostop: no run for 3s" in info["stopped"]
    assert info["fix"] == "tpuctl up -c auto brings it back" and info["problem"] == ""
    assert "stopped" in json.loads(cli("ls", "--json")[1])[0]["phase"]
    assert cli("up", "--provider", "local", "-c", "auto", "--autostop", "off")[0] == 0
    st = state.load("auto")
    assert LocalProvider().agent_alive(st) and st.spec.autostop == 0 and len(st.periods) == 2
    info = json.loads(cli("status", "-c", "auto", "--json")[1])
    assert info["phase"] == "ready" and "autostop" not in info
    assert cli("up", "--provider", "local", "-c", "auto")[0] == 0          # no flag: keeps what it has
    assert state.load("auto").spec.autostop == 0


def test_max_duration_ends_a_running_job_then_the_agent(local_up, cli, tmp_path):
    local_up("dl", "--max-duration", "4s")
    job = make_job(tmp_path, SLEEP_JOB)
    t = time.time()
    code, out, err = cli("submit", str(job), "-c", "dl")
    assert code != 0 and time.time() - t < 30 and "max-duration deadline" in out, out + err
    _wait_stopped("dl")
    assert "deadline" in json.loads(cli("status", "-c", "dl", "--json")[1])["stopped"]


def test_submit_down_ends_the_compute_once_the_run_is_final(local_up, cli, tmp_path):
    local_up("sd")
    job = make_job(tmp_path, "print('done')")
    run_id = cli("submit", str(job), "-c", "sd", "--down", "--detach")[1].strip()
    _wait_stopped("sd")
    assert json.loads(cli("jobs", "-c", "sd", "--json")[1])[0]["state"] == "succeeded"
    assert json.loads(cli("status", "-c", "sd", "--json")[1])["stopped"].startswith(f"run {run_id} ended")


def test_cost_so_far_sums_every_period_of_compute(cloud, cli):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "c")[0] == 0
    st = state.load("c")
    st.periods = [[time.time() - 7200, time.time() - 3600], [st.periods[-1][0] - 1800, 0.0]]   # 1 h, then 30 min
    state.save(st)
    info = json.loads(cli("status", "-c", "c", "--json")[1])
    assert info["uptime"] == "1h30m" and info["cost_so_far_usd"] == pytest.approx(1.5 * 8.0, rel=0.01)
    assert cli("down", "-c", "c", "--yes")[0] == 0
    st = state.load("c")
    assert all(end for _, end in st.periods)
    assert json.loads(cli("status", "-c", "c", "--json")[1])["cost_so_far_usd"] == pytest.approx(12.0, rel=0.01)


def test_jobs_and_status_count_at_the_price_per_hour_override(local_up, cli, tmp_path, monkeypatch):
    """TPUCTL_PRICE_PER_HOUR is the price of every cost shown, as it is the budget's (core/budget.py `hourly`)."""
    local_up("po")
    code, out, err = cli("submit", str(make_job(tmp_path, "import time\ntime.sleep(1)\nprint('done')")), "-c", "po")
    assert code == 0, err
    [row] = json.loads(cli("jobs", "-c", "po", "--json")[1])
    assert row["cost_usd"] == 0.0                                   # the local provider is free
    monkeypatch.setenv("TPUCTL_PRICE_PER_HOUR", "3600")             # a dollar a second
    [row] = json.loads(cli("jobs", "-c", "po", "--json")[1])
    assert row["duration"] >= 1 and row["cost_usd"] == pytest.approx(row["duration"], abs=0.001)
    assert f"${row['cost_usd']:.2f}" in cli("jobs", "-c", "po")[1]
    info = json.loads(cli("status", "-c", "po", "--json")[1])
    assert info["cost_so_far_usd"] >= row["cost_usd"]              # the compute has existed longer than the run


def test_a_budgeted_cluster_counts_every_cost_at_the_price_saved_at_up(local_up, cli, tmp_path, monkeypatch):
    """The price `up --budget` saved is the one its hosts count with: `jobs` and `status` count at it too, whatever
    the shell they run in says now."""
    monkeypatch.setenv("TPUCTL_PRICE_PER_HOUR", "3600")             # a dollar a second, at `up`
    local_up("pb", "--budget", "100000")
    code, out, err = cli("submit", str(make_job(tmp_path, "import time\ntime.sleep(1)\nprint('done')")), "-c", "pb")
    assert code == 0, err
    monkeypatch.setenv("TPUCTL_PRICE_PER_HOUR", "1")                # another shell, another price
    [row] = json.loads(cli("jobs", "-c", "pb", "--json")[1])
    assert row["duration"] >= 1 and row["cost_usd"] == pytest.approx(row["duration"], abs=0.001)
    info = json.loads(cli("status", "-c", "pb", "--json")[1])
    assert info["cost_so_far_usd"] >= row["cost_usd"] and info["spent_usd"] >= row["cost_usd"]
    assert info["cost_so_far_usd"] == pytest.approx(info["spent_usd"], abs=2.0)   # one price: a second apart at most


def test_ls_flags_a_cluster_past_its_deadline_that_is_still_up(local_up, cli):
    st = local_up("pd", "--max-duration", "1h")
    st.periods[-1][0] -= 7200          # made two hours ago; its host never ended it (dead, or no permission)
    state.save(st)
    [row] = json.loads(cli("ls", "--json")[1])
    assert row["past_deadline"]
    assert "PAST ITS DEADLINE" in cli("ls")[1].replace("\n", " ") or "PAST ITS" in cli("ls")[1]
