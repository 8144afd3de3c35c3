"""A cancelled run's log ends with who cancelled it and when (issue 40: it had no line saying it was cancelled)."""
import getpass
import json
import re
import socket

from conftest import until
from jobs import make_job

# The job saves on SIGTERM, as a checkpointing job does in its grace: the cancel line still comes last.
JOB = """
import signal, sys, time
def stop(*_):
    print("saving checkpoint", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("started", flush=True)
time.sleep(60)
"""


def test_a_cancelled_run_s_log_ends_with_who_cancelled_it_and_when(local_up, cli, tmp_path, monkeypatch):
    monkeypatch.setenv("TPUCTL_CANCEL_GRACE", "5")
    local_up("cx")
    code, out, err = cli("submit", str(make_job(tmp_path, JOB)), "-c", "cx", "--detach")
    run = out.strip()
    until(lambda: "started" in cli("logs", run, "-c", "cx")[1], 30, "the job started")
    assert cli("cancel", run, "-c", "cx")[0] == 0
    code, out, err = cli("logs", run, "-c", "cx", "-f")
    lines = out.strip().splitlines()
    assert "saving checkpoint" in lines
    assert re.fullmatch(rf"tpuctl agent: cancelled by {re.escape(getpass.getuser())}@{re.escape(socket.gethostname())} at "
                        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", lines[-1].strip()), lines[-3:]
    row = json.loads(cli("jobs", "-c", "cx", "--json")[1])[0]
    assert row["state"] == "cancelled"


def test_a_run_its_deadline_ended_gets_no_cancel_line(tmp_path):
    from tpuctl.core import runs
    from tpuctl.core.store import LocalStore
    store = LocalStore(str(tmp_path))
    assert runs.cancelled_by(store, "20261126-000000-000-abcd") == ""
