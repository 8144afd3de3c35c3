"""Runs on the GCP path: the real CLI against the fakes, with agent threads standing in for the TPU VM workers."""
import json
import os
import threading

import pytest

from conftest import PROJECT, until
from jobs import ENV_JOB, SLEEP_JOB, make_job, tpuctl_within
from tpuctl.core import runs
from tpuctl.host.agent import Agent

pytestmark = pytest.mark.usefixtures("no_leak")   # every test ends with nothing of tpuctl left

BUCKET = f"{PROJECT}-tpuctl-bert"
# These tests are about running and following runs: on an image that ships TensorFlow, so no job installs one
# (test_tensorflow_install.py and test_simulated_hosts.py cover the base runtime).
IMAGE = "tpu-vm-tf-2.18.0-pjrt-v5p-and-below"


@pytest.fixture
def cluster(cloud, cli, tmp_path):
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert", "--runtime", IMAGE)
    assert code == 0, err
    agents = []

    def start(worker=0):
        a = Agent(f"gs://{BUCKET}", worker=worker, accelerator="v3-8", tpu="local",
                  home=str(tmp_path / f"agent{worker}-{len(agents)}"), poll=0.05)
        t = threading.Thread(target=a.run_forever, daemon=True)
        t.start()
        agents.append((a, t))
        return a
    yield start
    for a, t in agents:
        a.stop.set()
        t.join(10)


def test_submit_on_gcp_streams_and_exits_with_code(cluster, cli, cloud, tmp_path):
    cluster()
    job = make_job(tmp_path, ENV_JOB, 'data = ["corpus.txt"]\n[env]\nEXIT = "4"\n')
    (job / "corpus.txt").write_text("x" * 5000)
    code, out, err = cli("submit", str(job), "-c", "bert", "--", "--preset", "tiny")
    assert code == 4, err
    env = json.loads(out.splitlines()[0])
    assert env["TPUCTL_STORE"] == f"gs://{BUCKET}"
    assert env["TPUCTL_DATA_DIR"] == f"gs://{BUCKET}/runs/{env['TPUCTL_RUN_ID']}/data"
    assert env["TPUCTL_OUTPUT_DIR"] == f"gs://{BUCKET}/runs/{env['TPUCTL_RUN_ID']}/output"
    assert env["TPUCTL_ACCELERATOR"] == "v3-8" and env["TPUCTL_TPU"] == "local"
    assert env["argv"] == ["--preset", "tiny"]
    from google.cloud import storage
    blob = storage.Client(project=PROJECT).bucket(BUCKET).get_blob(f"runs/{env['TPUCTL_RUN_ID']}/data/corpus.txt")
    assert blob.size == 5000
    assert cli("logs", "-c", "bert")[1] == out
    # unchanged data and code: nothing uploaded the second time
    cloud.gcs.calls.clear()
    assert cli("submit", str(job), "-c", "bert", "--detach")[0] == 0
    uploads = [c.rsplit(" ", 1)[-1] for c in cloud.gcs.calls if c.startswith("POST /upload")]
    records = ("tpuctl/agents/", "tpuctl/runs/", "tpuctl/queue/", "tpuctl/index/runs/", "tpuctl/submitting/")
    assert [u for u in uploads if not u.startswith(records)] == []   # the run's records only
    assert len([u for u in uploads if u.endswith("/job.json")]) == 1


def test_two_agents_claim_a_run_once(cluster, cli, tmp_path):
    cluster(), cluster()   # two agents race for the same run
    job = make_job(tmp_path, "print('once')\n")
    code, out, err = cli("submit", str(job), "-c", "bert")
    assert code == 0, err
    assert out == "once\n"


def test_claim_is_create_if_absent_against_the_fake(cloud, cli):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert", "--runtime", IMAGE)[0] == 0
    from tpuctl.providers.stores import open_store
    s = open_store(f"gs://{BUCKET}")
    assert s.create("tpuctl/runs/x/claim", b"first") is True
    assert s.create("tpuctl/runs/x/claim", b"second") is False
    assert s.read("tpuctl/runs/x/claim") == b"first"


def test_cancel_on_gcp(cluster, cli, tmp_path, monkeypatch):
    monkeypatch.setenv("TPUCTL_CANCEL_GRACE", "1")
    cluster()
    job = make_job(tmp_path, SLEEP_JOB)
    code, out, err = cli("submit", str(job), "-c", "bert", "--detach")
    run_id = out.strip()
    from tpuctl.providers.stores import open_store
    s = open_store(f"gs://{BUCKET}")
    until(lambda: runs.status(s, run_id).state is runs.RunState.RUNNING, 20, "the run running")
    assert cli("cancel", run_id, "-c", "bert")[0] == 0
    code, out, err = cli("logs", run_id, "-c", "bert", "-f")
    assert code == 143 and "started" in out
    assert runs.status(s, run_id).state is runs.RunState.CANCELLED


def test_submit_refuses_a_cluster_whose_tpu_is_gone(cloud, cli, tmp_path):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert", "--runtime", IMAGE)[0] == 0
    cloud.tpu.nodes[2].clear()
    job = make_job(tmp_path, "print(1)\n")
    code, out, err = cli("submit", str(job), "-c", "bert")
    assert code == 3 and "MISSING" in err and "tpuctl up" in err
    assert not [c for c in cloud.gcs.calls if c.startswith("POST /upload") and "packages" in c]


def test_agent_package_is_in_the_store_and_installs(cloud, cli, tmp_path):
    import subprocess
    import sys
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert", "--runtime", IMAGE)[0] == 0
    from tpuctl import __version__
    from tpuctl.providers.stores import open_store
    data = open_store(f"gs://{BUCKET}").read(f"tpuctl/agent/tpuctl-{__version__}-py3-none-any.whl")
    wheel = tmp_path / f"tpuctl-{__version__}-py3-none-any.whl"
    wheel.write_bytes(data)
    # no index, no build: a wheel installs offline by unpacking
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--target", str(tmp_path / "site"), str(wheel)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "site" / "tpuctl" / "agent.py").is_file()


def test_a_large_upload_resumes_after_a_failed_chunk(cloud, tmp_path):
    """A 40 MiB file goes up in 16 MiB chunks; the second chunk fails once with 503 and is resent, not the file."""
    from google.cloud import storage
    from tpuctl.providers.stores import open_store
    storage.Client(project=PROJECT).create_bucket("big-data")
    f = tmp_path / "shard.bin"
    f.write_bytes(os.urandom(40 << 20))
    sent = []
    original = cloud.gcs.forward

    def fail_second_chunk(method, path, headers, body, identity=None):
        if method == "PUT" and path.startswith("/upload/"):
            sent.append(len(body or b""))
            if len(sent) == 2:
                return cloud.gcs._json_error(503, "backendError")
        return original(method, path, headers, body, identity)
    cloud.gcs.forward = fail_second_chunk
    try:
        open_store("gs://big-data").upload_file(str(f), "data/j/shard.bin", lambda n: None)
    finally:
        cloud.gcs.forward = original
    blob = storage.Client(project=PROJECT).bucket("big-data").get_blob("data/j/shard.bin")
    assert blob.size == 40 << 20
    assert blob.download_as_bytes() == f.read_bytes()
    assert len(sent) == 4                         # three chunks, and the failed one once more
    assert sum(sent) == (40 << 20) + (16 << 20)   # starting the file over would have sent 72 MiB


def test_a_submit_whose_writes_were_applied_but_answered_503_runs_once(cluster, cli, tmp_path, cloud):
    cluster()
    job = make_job(tmp_path, "print('once')\n")
    cloud.gcs.lost["tpuctl/packages/"] = 1              # the package and job.json: applied, then answered 503
    cloud.gcs.lost["/job.json"] = 1
    code, out, err = cli("submit", str(job), "-c", "bert")
    assert code == 0, err
    assert out == "once\n" and "already exists" not in err
    assert not +cloud.gcs.lost                          # both answers were lost, and both writes counted as done
    code, out, err = cli("jobs", "-c", "bert", "--json")
    assert len(json.loads(out)) == 1


def test_a_bucket_created_but_answered_503_is_this_runs_own(cloud, cli):
    cloud.gcs.lost["POST /storage/v1/b"] = 1
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert", "--runtime", IMAGE)
    assert code == 0, err
    assert "taken by another project" not in err
    assert cli("down", "-c", "bert", "--yes", "--delete-bucket")[0] == 0


def test_a_follower_shows_the_boot_log_of_a_host_that_never_started_and_gives_up(cloud, cli, tmp_path, monkeypatch):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert", "--runtime", IMAGE)[0] == 0
    from tpuctl.providers.stores import open_store
    open_store(f"gs://{BUCKET}").write("tpuctl/boot/t1v-n-1-w-0.log",
                                       b"2026-11-22T00:00:00Z [tpu-vm worker 0] FAILED: pip install agent\n")
    monkeypatch.setenv("TPUCTL_STALE_SECONDS", "0.5")
    job = make_job(tmp_path, "print('never')\n")
    code, out, err = tpuctl_within(60, "submit", str(job), "-c", "bert", "--give-up-after", "2")
    assert code == 9, err
    assert "still queued, no agent has taken it" in err and "FAILED: pip install agent" in err
    assert "no word from its host for" in err and "tpuctl up -c bert" in err
