"""The TPUCTL_* tuning knobs (tpuctl/core/knobs.py): a bad value is one clear error where it is read, the CLI
refuses it before any command runs, and on the host it ends the run with the reason in its log instead of leaving
it `running` for good (issue 52.7: `TPUCTL_RESTART_BACKOFF=abc` hung a run; `nan` or a negative value removed the
wait)."""
import ast
import json
import threading
from pathlib import Path

import pytest

from conftest import until
from jobs import make_job, submit_to_store
from tpuctl.core import knobs, layout, runs
from tpuctl.core.errors import ErrorKind, TpuctlError
from tpuctl.core.runs import RunState
from tpuctl.core.store import LocalStore
from tpuctl.host.agent import Agent

PKG = Path(__file__).resolve().parent.parent / "tpuctl"


@pytest.mark.parametrize("raw", ["abc", "nan", "NaN", "-1", "-0.5", "inf", "1e400", " ", "1,5"])
def test_a_wait_that_is_not_a_finite_number_at_least_0_is_refused(monkeypatch, raw):
    monkeypatch.setenv("TPUCTL_RESTART_BACKOFF", raw)
    if not raw.strip():
        assert knobs.number("TPUCTL_RESTART_BACKOFF", 1) == 1   # empty: unset, the default
        return
    with pytest.raises(TpuctlError) as e:
        knobs.number("TPUCTL_RESTART_BACKOFF", 1)
    assert e.value.kind is ErrorKind.INPUT and f"TPUCTL_RESTART_BACKOFF={raw!r} is not a number of seconds" in \
        e.value.message and "unset TPUCTL_RESTART_BACKOFF" in e.value.hint


def test_good_values_are_read_and_polls_and_counts_keep_their_bounds(monkeypatch):
    monkeypatch.setenv("TPUCTL_RESTART_BACKOFF", " 0.25 ")
    assert knobs.number("TPUCTL_RESTART_BACKOFF", 1) == 0.25
    monkeypatch.setenv("TPUCTL_RESTART_BACKOFF", "0")     # no wait, said as such: allowed
    assert knobs.number("TPUCTL_RESTART_BACKOFF", 1) == 0
    monkeypatch.setenv("TPUCTL_CANCEL_POLL", "0")         # a poll of 0 would spin
    with pytest.raises(TpuctlError, match="above 0"):
        knobs.number("TPUCTL_CANCEL_POLL", 1)
    monkeypatch.setenv("TPUCTL_LOG_HOLD_BYTES", "1.5")
    with pytest.raises(TpuctlError, match="a whole number"):
        knobs.count("TPUCTL_LOG_HOLD_BYTES", 8)
    monkeypatch.setenv("TPUCTL_LOG_HOLD_BYTES", "4096")
    assert knobs.count("TPUCTL_LOG_HOLD_BYTES", 8) == 4096
    with pytest.raises(KeyError):                         # a knob not in the table cannot be read unchecked
        knobs.number("TPUCTL_NO_SUCH_KNOB", 1)


def test_every_tpuctl_number_read_in_the_package_goes_through_knobs():
    """No `float(os.environ...)` / `int(os.environ...)` of a TPUCTL_ variable is left outside knobs.py (but what
    tpuctl itself sets for a job, which runtime/ reads), and every knob named in a call is in the table."""
    bare, named = [], set()
    set_by_tpuctl = ("TPUCTL_NUM_WORKERS", "TPUCTL_SESSION_DEADLINE", "TPUCTL_WORKER", "TPUCTL_JAX_")
    for path in PKG.rglob("*.py"):
        if path.name == "knobs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            text = ast.unparse(node)
            if isinstance(node.func, ast.Name) and node.func.id in ("float", "int") and "TPUCTL_" in text \
                    and "environ" in text and not any(name in text for name in set_by_tpuctl):
                bare.append(f"{path.relative_to(PKG)}: {text}")
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("number", "count") and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "knobs":
                first = node.args[0]
                if isinstance(first, ast.Constant):
                    named.add(first.value)
    assert bare == []
    assert named and named <= set(knobs.KNOBS), named - set(knobs.KNOBS)


def test_the_cli_refuses_a_bad_knob_in_one_line_before_any_command(cli, monkeypatch):
    monkeypatch.setenv("TPUCTL_CANCEL_POLL", "abc")
    code, out, err = cli("ls")
    assert code == 2 and "error: TPUCTL_CANCEL_POLL='abc' is not a number of seconds above 0" in err, err
    assert "hint: unset TPUCTL_CANCEL_POLL" in err and "Traceback" not in err


# exits 42 (a restart asked for) on its first start, 0 on the next
RESTARTING = """
import os, sys
p = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "starts")
n = int(open(p).read()) if os.path.exists(p) else 0
open(p, "w").write(str(n + 1))
print(f"start {n}", flush=True)
sys.exit(42 if n == 0 else 0)
"""


@pytest.mark.parametrize("knob", ["TPUCTL_RESTART_BACKOFF", "TPUCTL_CANCEL_POLL", "TPUCTL_RESTART_BACKOFF_MAX"])
@pytest.mark.parametrize("raw", ["abc", "-1"])
def test_a_bad_knob_on_the_host_ends_the_run_with_the_reason_instead_of_hanging_it(tmp_path, monkeypatch, knob,
                                                                                     raw):
    """The agent's own environment (a host's, or the shell that ran a local `up`) holds the bad value: the run
    fails at once, its log and status naming the knob, and the agent goes on to the next run."""
    monkeypatch.setenv(knob, raw)
    store = LocalStore(tmp_path / "store")
    agent = Agent(str(tmp_path / "store"), home=str(tmp_path / "agent"), poll=0.05)
    run_id = submit_to_store(store, make_job(tmp_path, RESTARTING))
    spec = json.loads(store.read(layout.run_job(run_id)))
    store.write(layout.run_job(run_id), json.dumps({**spec, "max_restarts": 3}).encode())
    thread = threading.Thread(target=agent.run_forever, daemon=True)
    thread.start()
    try:
        until(lambda: runs.status(store, run_id).state.final, 30,
              lambda: f"the run's end; it is {runs.status(store, run_id)}")
        st = runs.status(store, run_id)
        log = b"".join(store.read(k) or b"" for k, _ in store.list(layout.run_logs(run_id, 0))).decode()
        assert st.state is RunState.FAILED and st.exit_code == 127, st
        assert f"{knob}={raw!r} is not a number of seconds" in log and f"unset {knob}" in log, log
    finally:
        agent.stop.set()
        thread.join(30)
    assert not thread.is_alive()
