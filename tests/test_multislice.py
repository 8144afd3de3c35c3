"""Multislice (`up --slices N`, issue 31) against the fake TPU API: one queued resource with multislice_params, its
nodes named <prefix>-0..N-1, the price times N, status/ls/down over every slice, refusals before anything is made;
then one run across 2 slices x 2 hosts with MEGASCALE_* on every host."""
import json

import pytest
from conftest import PROJECT, until

from tpuctl.core import multislice

ZONE = "us-central2-b"
QR = f"projects/{PROJECT}/locations/{ZONE}/queuedResources/tpuctl-ms-qr"
NODES = [f"projects/{PROJECT}/locations/{ZONE}/nodes/tpuctl-ms-{k}" for k in range(2)]


@pytest.mark.usefixtures("no_leak")
def test_up_slices_makes_one_multislice_request_and_down_removes_every_slice(cloud, cli):
    code, out, err = cli("up", "--type", "v4-16", "--zone", ZONE, "--slices", "2", "-c", "ms", "--framework", "jax",
                         "--yes")
    assert code == 0, err
    assert "$51.52/hour (2 slices at $25.76)" in err               # v4-16: 8 chips x $3.22, twice
    creates = [c for c in cloud.tpu.calls if c[1] == "CreateQueuedResource"]
    assert len(creates) == 1 and [c for c in cloud.tpu.calls if c[1] == "CreateNode"] == []
    spec = cloud.tpu.queued[QR]["qr"].tpu.node_spec[0]
    assert spec.multislice_params.node_count == 2 and spec.multislice_params.node_id_prefix == "tpuctl-ms"
    assert spec.node_id == ""                                       # the oneof's other member
    assert sorted(cloud.tpu.nodes[2]) == NODES
    assert all(cloud.tpu.nodes[2][n].multislice_node for n in NODES)
    assert len(cloud.tpu.nodes[2][NODES[1]].network_endpoints) == 2   # v4-16: 2 hosts in each slice

    info = json.loads(cli("status", "-c", "ms", "--json")[1])
    assert info["resources"]["tpu slice 0"]["name"] == "tpuctl-ms-0"
    assert info["resources"]["tpu slice 1"]["state"] == "READY"
    from google.cloud import storage
    record = json.loads(storage.Client(project=PROJECT).bucket(f"{PROJECT}-tpuctl-ms").blob(
        "tpuctl/cluster.json").download_as_text())
    assert record["slices"] == 2 and record["hosts"] == 2 and record["coordinator"] == "10.1.0.1"
    rows = json.loads(cli("ls", "--json")[1])
    assert not [r for r in rows if r["orphan"]]                     # both slices are the cluster's own

    cloud.tpu.set_state(2, NODES[1], "PREEMPTED")                    # one slice lost: the cluster is
    info = json.loads(cli("status", "-c", "ms", "--json")[1])
    assert info["resources"]["tpu slice 1"]["state"] == "PREEMPTED"
    code, out, err = cli("up", "-c", "ms", "--yes")                 # asked for again, whole
    assert code == 0, err
    assert "tpuctl-ms-1 PREEMPTED: asking again" in err
    assert [cloud.tpu.nodes[2][n].state.name for n in NODES] == ["READY", "READY"]

    code, out, err = cli("down", "-c", "ms", "--yes")
    assert code == 0, err
    assert cloud.tpu.queued == {} and cloud.tpu.nodes[2] == {}


@pytest.mark.parametrize("flags, said", [
    (["--type", "v3-32", "--zone", "europe-west4-a"], "Multislice needs TPU v4 or newer; v3-32 is v3"),
    (["--type", "v2-32", "--zone", "us-central1-a"], "Multislice needs TPU v4 or newer"),
    (["--type", "v3-8", "--zone", "us-central1-b", "--arch", "node"], "a TPU Node (--arch node) cannot be part"),
])
def test_a_type_multislice_does_not_serve_is_refused_before_anything_is_made(cloud, cli, flags, said):
    code, out, err = cli("up", *flags, "--slices", "2", "-c", "old", "--yes")
    assert code == 2 and said in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2                      # the message and its hint
    assert cloud.tpu.mutating_calls() == [] and not [c for c in cloud.gcs.calls if not c.startswith("GET")]


def test_one_slice_is_not_a_multislice(cloud, cli):
    code, out, err = cli("up", "--type", "v4-16", "--zone", ZONE, "--slices", "1", "-c", "one", "--yes")
    assert code == 2 and "at least 2 slices" in err and cloud.tpu.mutating_calls() == []


def test_the_local_provider_refuses_slices(env, cli):
    code, out, err = cli("up", "--provider", "local", "-c", "l", "--slices", "2")
    assert code == 2 and "--slices" in err


def test_megascale_environment():
    record = {"slices": 2, "hosts": 2, "coordinator": "10.1.0.1"}
    assert multislice.environment(record, 1) == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.1.0.1:8081", "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_PORT": "8081"}
    assert multislice.environment({"hosts": 2}, 0) == {}
    # a record with no coordinator (a GKE pod's: its manifest gives the coordinator) adds none, never ":8081"
    assert multislice.environment({"slices": 2, "coordinator": ""}, 1) == {"MEGASCALE_NUM_SLICES": "2",
                                                                           "MEGASCALE_SLICE_ID": "1"}
    from tpuctl.host import megascale
    google = megascale.parse("WORKER_ID: '0'\nNODE_ID: 'tpuctl-x-1'\nMEGASCALE_SLICE_ID: '1'\n"
                             "MEGASCALE_COORDINATOR_ADDRESS: '10.9.0.1:8080'\n")
    assert megascale.environment(record, 1, google) == {   # Google's coordinator and port; the rest agrees
        "MEGASCALE_COORDINATOR_ADDRESS": "10.9.0.1:8080", "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1"}
    assert megascale.environment(record, 1, {}) == multislice.environment(record, 1)
    megascale.check(google, 1)
    with pytest.raises(ValueError, match="the node name tpuctl-x-1 says 1"):
        megascale.check(google, 0)
    with pytest.raises(ValueError, match="MEGASCALE_SLICE_ID says 2, the node name tpuctl-x-1 says 1"):
        megascale.check({**google, "MEGASCALE_SLICE_ID": "2"}, 1)
    assert multislice.node_names("tpuctl-x", 3) == ["tpuctl-x-0", "tpuctl-x-1", "tpuctl-x-2"]
    assert multislice.node_names("tpuctl-x", 1) == ["tpuctl-x"]


MEGASCALE_JOB = """
import os
keys = ["TPUCTL_WORKER", "TPUCTL_NUM_WORKERS", "MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES",
        "MEGASCALE_SLICE_ID", "MEGASCALE_PORT"]
print(" ".join(f"{k}={os.environ.get(k, '-')}" for k in keys))
print("second line")
"""


def test_one_jax_run_on_every_host_of_two_slices_with_megascale(cloud, cli, tmp_path, monkeypatch):
    """2 slices x 2 hosts, each booted by the fake from the real start-up script, which reads its slice from the
    node's tpu-env: the run starts on all four, each with MEGASCALE_* agreeing on the coordinator and the slice
    count and its own slice id; `logs --slice K --worker W` and `logs --all-hosts` show each host's output."""
    from jobs import make_job
    from test_simulated_hosts import _wait_agents
    cloud.hosts.enabled = True
    cloud.hosts.env.update(TPUCTL_LOG_POLL_MAX="0.2")
    monkeypatch.setenv("TPUCTL_LOG_POLL_MAX", "0.2")
    code, out, err = cli("up", "--type", "v4-16", "--zone", ZONE, "--slices", "2", "-c", "ms", "--framework", "jax",
                         "--yes")
    assert code == 0, err
    four = _wait_agents(cloud.hosts, "nodes/tpuctl-ms-0", 2) + _wait_agents(cloud.hosts, "nodes/tpuctl-ms-1", 2)
    assert "--slice 1 --worker 1" in (four[3].root / "etc/systemd/system/tpuctl-agent.service").read_text()

    tf_job = make_job(tmp_path, MEGASCALE_JOB, name="tfjob")
    code, out, err = cli("submit", str(tf_job), "-c", "ms")
    assert code == 2 and "TPUStrategy does not span slices" in err and "Traceback" not in err

    job = make_job(tmp_path, MEGASCALE_JOB, 'framework = "jax"\n', name="jaxjob")
    code, out, err = cli("submit", str(job), "-c", "ms")
    assert code == 0, err + "".join(h.agent_out() for h in four)
    seen = {}
    for k in (0, 1):
        for w in (0, 1):
            code, out, err = cli("logs", "-c", "ms", "--slice", str(k), "--worker", str(w), "-f")
            assert code == 0, err
            seen[k, w] = dict(kv.split("=", 1) for kv in out.splitlines()[0].split())
    for (k, w), env in seen.items():
        # slice 0's worker 0, on every host, as Google's tpu-env names it (host/megascale.py), port included
        assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "10.1.0.1:8080"
        assert env["MEGASCALE_NUM_SLICES"] == "2" and env["MEGASCALE_PORT"] == "-"
        assert env["MEGASCALE_SLICE_ID"] == str(k)
        assert env["TPUCTL_WORKER"] == str(2 * k + w) and env["TPUCTL_NUM_WORKERS"] == "4"
    code, out, err = cli("logs", "-c", "ms", "-f", "--all-hosts")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 8 and {l.split(" ", 1)[0] for l in lines} == {"[s0/w0]", "[s0/w1]", "[s1/w0]", "[s1/w1]"}
    assert "[s1/w1] second line" in lines
    code, out, err = cli("logs", "-c", "ms", "--slice", "2")
    assert code == 2 and "has 2 slices" in err
    rows = json.loads(cli("jobs", "-c", "ms", "--json")[1])
    assert [r["state"] for r in rows] == ["succeeded"]                 # one run across the four hosts

    # a Keras 3 job runs on JAX here, on every host (issue 36); forcing TensorFlow is refused before anything
    forced = make_job(tmp_path, MEGASCALE_JOB, 'framework = "keras"\nkeras_backend = "tensorflow"\n', name="kf")
    code, out, err = cli("submit", str(forced), "-c", "ms")
    assert code == 2 and "TPUStrategy does not span slices" in err and "Traceback" not in err, err
    keras_job = make_job(tmp_path, MEGASCALE_JOB + "print('KERAS_BACKEND', os.environ['KERAS_BACKEND'])\n",
                         'framework = "keras"\n', name="kj")
    code, out, err = cli("submit", str(keras_job), "-c", "ms")
    assert code == 0, err
    code, out, err = cli("logs", "-c", "ms", "--slice", "1", "--worker", "1", "-f")
    assert out.startswith("tpuctl: keras backend jax (a Multislice cluster: TPUStrategy does not span slices)\n"), out
    assert "TPUCTL_WORKER=3 " in out and "KERAS_BACKEND jax" in out, out
    assert cli("down", "-c", "ms", "--yes")[0] == 0
    assert not cloud.hosts.hosts


SLEEPY_JAX_JOB = """
import os, time
print(f"start s{os.environ['MEGASCALE_SLICE_ID']} i{os.environ['TPUCTL_WORKER']}", flush=True)
time.sleep(float(os.environ["RUN_SECONDS"]))
print("done", flush=True)
"""


# The recovery tests run on 2 slices of ONE host each (v4-8): what they prove is across slices (a lost or repaired
# slice restarts the run on every host of every slice, slice 0's too), and every boot of a simulated host costs
# seconds of CPU (its start-up script's pip installs), 8 to 12 boots a test on v4-16. Two hosts in a slice, their
# worker numbers and MEGASCALE_* on each, are test_one_jax_run_on_every_host_of_two_slices_with_megascale's.
HOSTS = 2


def _run_on_two_slices(cloud, cli, monkeypatch, name, job, *flags):
    """`up --type v4-8 --slices 2` with simulated hosts (stale after 6 s), `job` submitted: (store, run id,
    log(worker) -> that host's output shipped so far)."""
    from test_simulated_hosts import _wait_agents
    from tpuctl.core import state
    from tpuctl.providers import registry
    monkeypatch.setenv("TPUCTL_LOG_POLL_MAX", "0.2")
    cloud.hosts.enabled = True
    # stale after 6 s: a host starved of CPU by the suite's other workers is not taken for lost (3 s flaked)
    cloud.hosts.env.update(TPUCTL_LOG_POLL_MAX="0.2", TPUCTL_STALE_SECONDS="6", TPUCTL_STOP_GRACE="2")
    code, out, err = cli("up", "--type", "v4-8", "--zone", ZONE, "--slices", "2", "-c", name, "--framework", "jax",
                         "--yes", *flags)
    assert code == 0, err
    _wait_agents(cloud.hosts, f"nodes/tpuctl-{name}-0", 1) and _wait_agents(cloud.hosts, f"nodes/tpuctl-{name}-1", 1)
    code, run_id, err = cli("submit", str(job), "-c", name, "--detach")
    assert code == 0, err
    run_id = run_id.strip()
    store = registry.get("gcp").store(state.load(name))

    def log(i):
        return b"".join(store.read(k) or b"" for k, _ in store.list(f"tpuctl/runs/{run_id}/logs"
                                                                    + ("" if i == 0 else f"-w{i}") + "/"))
    return store, run_id, log


@pytest.mark.slow(70)
def test_one_slice_preempted_under_recover_restarts_the_run_on_every_host(cloud, cli, tmp_path, monkeypatch):
    """A slice lost mid-run: the watcher asks for the whole request again (core/multislice.py: a lost slice stops
    the run everywhere), and once all slices are back every host takes the run over, same run, attempt 2."""
    from jobs import make_job
    from test_watch import Running
    from tpuctl.core import runs
    for k, v in {"TPUCTL_WATCH_POLL": "0.05", "TPUCTL_LEASE_SECONDS": "2", "TPUCTL_RECOVER_BACKOFF": "0.05",
                 "TPUCTL_LEASE_WAIT": "60"}.items():
        monkeypatch.setenv(k, v)
    job = make_job(tmp_path, SLEEPY_JAX_JOB, 'framework = "jax"\n[env]\nRUN_SECONDS = "6"\n')
    store, run_id, log = _run_on_two_slices(cloud, cli, monkeypatch, "w", job, "--recover")
    # every host has shipped its first line (output not yet shipped is lost with a host powered off)
    until(lambda: all(b"start s" in log(i) for i in range(HOSTS)), 120, "the run on every host")
    w = Running()
    cloud.tpu.set_state(2, f"projects/{PROJECT}/locations/{ZONE}/nodes/tpuctl-w-1", "PREEMPTED")   # slice 1 goes
    until(lambda: all(runs.status(store, run_id, i).state.value == "succeeded" for i in range(HOSTS)), 240,
           "the run to finish on every host")
    for i in range(HOSTS):
        st = runs.status(store, run_id, i)
        assert st.attempt == 2, (i, st)                               # every host restarted it, slice 0's too
        assert log(i).count(b"start s") == 2 and b"done" in log(i), log(i)
    assert [r["state"] for r in json.loads(cli("jobs", "-c", "w", "--json")[1])] == ["succeeded"]
    assert cli("down", "-c", "w", "--yes")[0] == 0
    w.wait()
    assert cloud.tpu.queued == {} and cloud.tpu.nodes[2] == {}


WAITING_JAX_JOB = """
import os, time
print(f"start s{os.environ['MEGASCALE_SLICE_ID']} i{os.environ['TPUCTL_WORKER']}", flush=True)
print(f"coordinator {os.environ['MEGASCALE_COORDINATOR_ADDRESS']}", flush=True)
deadline = time.time() + 120
while not os.path.exists(os.environ["GO"]) and time.time() < deadline:
    time.sleep(0.2)
print("done", flush=True)
"""


@pytest.mark.parametrize("repaired, fresh_disk", [(0, True), (1, False)], ids=["slice-0-elsewhere", "same-disk"])
@pytest.mark.slow(60)
def test_a_slice_google_repairs_restarts_the_run_on_every_host(cloud, cli, tmp_path, monkeypatch, repaired,
                                                              fresh_disk):
    """Google restarts slice 1 on healthy hardware while the request stays ACTIVE (no --recover, no watcher), then
    restarts slice 0 too (Multislice "Autorepair"): every host, back in a new boot, takes the run over, uncharged
    (claims.py); every host starts it again, together (round 2), and nothing was asked of the TPU API."""
    from jobs import make_job
    from tpuctl.core import runs
    go = tmp_path / "go"
    job = make_job(tmp_path, WAITING_JAX_JOB, f'framework = "jax"\n[env]\nGO = "{go}"\n')
    store, run_id, log = _run_on_two_slices(cloud, cli, monkeypatch, "rp", job)
    until(lambda: all(b"start s" in log(i) for i in range(HOSTS)), 120, "the run on every host")
    calls = len(cloud.tpu.mutating_calls())
    assert all(b"coordinator 10.1.0.1:8080" in log(i) for i in range(HOSTS))   # Google's tpu-env, not cluster.json's
    # slice 0 re-made elsewhere gets new addresses: round 2 must find its coordinator there (issue 39 item 4)
    cloud.tpu.repair(f"projects/{PROJECT}/locations/{ZONE}/nodes/tpuctl-rp-{repaired}", fresh_disk, seconds=0.5,
                     new_address=repaired == 0)
    until(lambda: all(log(i).count(b"start s") == 2 for i in range(HOSTS)), 120, "every host to start round 2")
    go.write_text("")

    def state():
        rounds = sorted(k.rsplit("/", 1)[-1] for k, _ in store.list(f"tpuctl/runs/{run_id}/rounds/"))
        return (f"the run to end: rounds {rounds}; "
                + "; ".join(f"w{i} {runs.status(store, run_id, i)} log {log(i)[-600:]!r}" for i in range(HOSTS)))
    until(lambda: all(runs.status(store, run_id, i).state.final for i in range(HOSTS)), 240, state)
    for i in range(HOSTS):
        st = runs.status(store, run_id, i)
        assert st.state.value == "succeeded" and st.restarts == 0, state()
        assert st.attempt == 2, (i, st)                          # every slice was restarted: every host took it over
        assert json.loads(store.read(f"tpuctl/runs/{run_id}/claim" + ("" if i == 0 else f"-w{i}") + "-a2"))[
            "charged"] == 1, i                                     # Google's doing: not charged
        assert log(i).count(b"start s") == 2, log(i)              # every host started it twice, together
        coordinator = b"10.101.0.1:8080" if repaired == 0 else b"10.1.0.1:8080"
        assert log(i).rsplit(b"start s", 1)[1].count(b"coordinator " + coordinator) == 1, log(i)
    assert b"run resumed on" in log(1), log(1)                  # its host restarted beneath it, as Google does
    assert len(cloud.tpu.mutating_calls()) == calls               # Google's repair: nothing asked of the API
    assert cli("down", "-c", "rp", "--yes")[0] == 0
    assert cloud.tpu.queued == {} and cloud.tpu.nodes[2] == {}
