"""A sick host replaced (issue 60 item 4; tpuctl/control/watch.py `_sick`): a Compute Engine TPU slice (a MIG with a
workload policy) whose host its agent marked sick is deleted and made again by the recovery watcher, as a lost slice
is. The TPU VM case is tests/test_watch.py's test_a_host_marked_sick_is_deleted_and_recreated_by_the_lost_hosts_path."""
import json

import pytest

from conftest import PROJECT, until
from test_gce_tpu import _recoveries
from test_run_doctor import doctor_env  # noqa: F401 - a fixture
from test_watch import Running, fast  # noqa: F401 - a fixture
from tpuctl.core import layout

ZONE = "us-central1-c"


def test_a_sick_mig_instance_is_replaced_with_its_slice(cloud, cli, fast):
    code, out, err = cli("up", "--type", "tpu7x-16", "--zone", ZONE, "-c", "w", "--spot", "--recover", "--yes")
    assert code == 0, err
    w = Running()
    until(lambda: any("holding its lease" in m for m in w.said.lines), what="the lease")
    vms = sorted(k[2] for k in cloud.compute.instances if k[2].startswith("tpuctl-w"))
    from google.cloud import storage
    bucket = storage.Client(project=PROJECT).bucket(f"{PROJECT}-tpuctl-w")
    bucket.blob(layout.host_sick(vms[-1])).upload_from_string(json.dumps({"host": vms[-1], "worker": 1,
                                                                          "why": "no-tpu twice"}))
    until(lambda: _recoveries(f"{PROJECT}-tpuctl-w"), what="a recovery")
    [rec] = _recoveries(f"{PROJECT}-tpuctl-w")
    assert "marked sick" in rec["lost"] and vms[-1] in rec["lost"], rec
    calls = [c[0] for c in cloud.compute.mutating_calls()]
    assert calls.count("mig_delete") == 1 and calls.count("mig_insert") == 2, calls   # the slice made again, once
    until(lambda: len([k for k, v in cloud.compute.instances.items() if k[2].startswith("tpuctl-w")
                       and v["status"] == "RUNNING"]) == len(vms), what="the slice back")
    assert not list(bucket.list_blobs(prefix=layout.SICK_PREFIX))
    assert cli("down", "-c", "w", "--yes")[0] == 0
    assert w.wait() == "`tpuctl down`"


# Trains to step 3 on the first host's first boot and then finds its TPU held (a lockfile left behind); every later
# start on that boot finds it held at once; a start on a new boot (the replaced host) resumes from the checkpoint
# (step 3) and finishes at step 6. The checkpoint and the first boot's id are kept in the cluster's store.
SICK_JOB = """
import os, sys, time
from tpuctl import runtime
from tpuctl.providers.stores import open_store
store, run = open_store(os.environ["TPUCTL_STORE"]), os.environ["TPUCTL_RUN_ID"]
boot = os.environ.get("TPUCTL_BOOT_ID", "")
first = (store.read(f"runs/{run}/first-boot") or b"").decode()
if not first:
    store.write(f"runs/{run}/first-boot", boot.encode())
    first = boot
ck = int(store.read(f"runs/{run}/ckpt") or b"0")
busy = "The TPU is already in use by process with pid 4242. Not attempting to load libtpu.so in this process."
if boot == first and ck:
    print(busy, flush=True)
    sys.exit(1)
p = runtime.Progress(ck)
for step in range(ck + 1, ck + 4):
    time.sleep(0.05)
    p.step(step, 0.05, loss=1.0 / step)
store.write(f"runs/{run}/ckpt", str(step).encode())
print(f"at step {step} on boot {boot[:8]}", flush=True)
if boot == first:
    print(busy, flush=True)
    sys.exit(1)
"""


@pytest.mark.slow(90)
def test_a_sick_tpu_vm_is_replaced_and_the_run_resumes_from_its_checkpoint(live_hosts, cloud, cli, tmp_path,
                                                                           monkeypatch):
    from jobs import make_job
    from test_notify import ZONE as TPU_ZONE, _gcp_store
    from tpuctl.core import runs
    # a 10-s lease: `logs -f` follows on through the replacement while the watcher holds it (hostwatch._watcher),
    # and a watcher busy re-making the TPU on a loaded machine (two suites at once) let a 2-s one lapse
    fast = {"TPUCTL_WATCH_POLL": "0.1", "TPUCTL_LEASE_SECONDS": "10", "TPUCTL_RECOVER_BACKOFF": "0.05",
            "TPUCTL_LEASE_WAIT": "60", "TPUCTL_STALE_SECONDS": "3", "TPUCTL_RESTART_BACKOFF": "0.2",
            "TPUCTL_RESTART_BACKOFF_MAX": "1", "TPUCTL_PROGRESS_SECONDS": "0.1"}
    for k, v in fast.items():
        monkeypatch.setenv(k, v)
    live_hosts.env.update(fast)
    code, out, err = cli("up", "--type", "v3-8", "--zone", TPU_ZONE, "-c", "sk", "--recover")
    assert code == 0, err
    w = Running(name="sk")
    job = make_job(tmp_path, SICK_JOB, 'framework = "jax"\n')
    run_id = cli("submit", str(job), "-c", "sk", "--detach")[1].strip()
    code, out, err = cli("logs", run_id, "-c", "sk", "--follow", "--give-up-after", "120")
    store = _gcp_store("sk")
    assert "at step 3" in out and "at step 6" in out and "the host is marked sick" in out, out + err
    st = runs.status(store, run_id)
    assert st.state is runs.RunState.SUCCEEDED, (st, out)
    [rec] = [r for r in (json.loads(store.read(k)) for k, _ in store.list(layout.RECOVERIES_PREFIX))]
    assert "marked sick" in rec["lost"], rec
    row = json.loads(cli("jobs", "-c", "sk", "--json")[1])[0]
    assert row["step"] == 6 and row["goodput_parts"]["disruption_seconds"] > 0, row   # the replacement: badput
    m = json.loads(store.read(layout.run_metrics(run_id)))
    assert m["attempts"][-1]["from"] == 3   # resumed from its checkpoint
    assert cli("down", "-c", "sk", "--yes")[0] == 0
    w.wait()


# Worker 0 reports 3 steps and then keeps writing (it waits on its peer, and says so); worker 1 writes nothing and
# hangs: the run stalls, held back by worker 1 alone, in every attempt.
ALONE_JOB = """
import os, time
from tpuctl import runtime
w = os.environ["TPUCTL_WORKER"]
prog = runtime.Progress(0)
for i in range(3):
    prog.step(i + 1, 0.01)
    time.sleep(0.02)
while True:
    if w == "0":
        print("waiting for worker 1", flush=True)
    time.sleep(0.1)
"""


def test_a_host_that_stalls_alone_twice_in_a_row_is_marked_sick(doctor_env, local_up, cli, tmp_path, monkeypatch):
    from jobs import make_job
    from test_run_doctor import _store, _submit, second_host
    from tpuctl.core import runs
    # the doctor's test settings, with a 2-s window: worker 0's output must be seen moving within it
    for k, v in {"TPUCTL_STALL_SECONDS": "2", "TPUCTL_STALE_SECONDS": "3", "TPUCTL_LOG_POLL_MAX": "0.2"}.items():
        monkeypatch.setenv(k, v)
    st = local_up("al")
    store = _store(st)
    agent = second_host(st, store, tmp_path)
    try:
        job = make_job(tmp_path, ALONE_JOB, 'framework = "jax"\n')
        out, row = _submit(cli, "al", job, "--max-restarts", "1", within=60)
        assert row["state"] == "stalled", (row, out)
        stalls = runs.stalls(store, row["id"])
        assert {s.get("alone_host") for s in stalls} == {"host-w1"}, stalls
        [sick] = [json.loads(store.read(k)) for k, _ in store.list(layout.SICK_PREFIX)]
        assert sick["host"] == "host-w1" and sick["worker"] == 1 and "stalled twice in a row" in sick["why"], sick
        code, out, _ = cli("status", "-c", "al")
        assert "host-w1" in out and "sick" in out, out
    finally:
        agent.terminate()
        agent.wait(30)


def test_alone_rule_one_silent_host_twice_in_a_row():
    from tpuctl.host.alone import silent_alone, twice_in_a_row
    samples = [(0.0, [10, 5]), (1.0, [20, 5]), (1.5, [30, 5]), (2.0, [40, 5])]
    assert silent_alone(samples, since=0.5, slack=0.25) == 1
    assert silent_alone([(0.0, [10, 5]), (1.0, [10, 5]), (2.0, [10, 5])], 0.5, 0.25) is None   # all silent
    assert silent_alone([(0.0, [10, 5]), (1.0, [20, 6]), (2.0, [30, 7])], 0.5, 0.25) is None   # all moved
    assert silent_alone([(0.0, [10, 5]), (2.0, [20, 5])], 0.5, 0.25) is None   # one sample after: too few
    one = {"alone_host": "h1", "alone_worker": 1}
    assert twice_in_a_row([{**one, "restarts": 0}, {**one, "restarts": 0}]) is None   # one stall, two hosts saw it
    assert twice_in_a_row([{**one, "restarts": 0}, {"restarts": 1}]) is None
    assert twice_in_a_row([{**one, "restarts": 0}, {"restarts": 1}, {**one, "restarts": 2}]) is None   # not in a row
    assert twice_in_a_row([{"restarts": 0}, {**one, "restarts": 1}, {**one, "restarts": 2}])["restarts"] == 2
    # --on-stall notify: two stalls without a restart between them
    assert twice_in_a_row([{**one, "restarts": 0, "stall": 1}, {**one, "restarts": 0, "stall": 2}])["stall"] == 2
