"""End to end through simulated hosts (tests/fakes/tpu_host.py): `up` makes the TPU, the host runs the real
start-up script while the TPU is CREATING, installs the agent from the bucket once its grant has propagated, and
the agent runs what `submit` sends. No package is placed by hand and no agent is started by the test."""
import json
import subprocess

import pytest
from conftest import PROJECT, until

from jobs import make_job

BUCKET = f"{PROJECT}-tpuctl-sim"


@pytest.fixture
def hosts(cloud, monkeypatch):
    cloud.hosts.enabled = True
    # a grant takes effect (minutes on Google) only once its host has been refused a download: every boot meets the
    # 403s first, however loaded the machine (a 20-s clock was needed for that, 8 s was not), and waits for no more
    cloud.gcs.iam_after_a_refused_read = True
    cloud.hosts.env.update(TPUCTL_BOOT_RETRY_SECONDS="90", TPUCTL_FORBIDDEN_GRACE="60", TPUCTL_LOG_POLL_MAX="0.2")
    monkeypatch.setenv("TPUCTL_LOG_POLL_MAX", "0.2")
    return cloud.hosts


def _wait_agents(hosts, resource_suffix, n, timeout=120):
    def found():
        return [h for r, hs in hosts.hosts.items() if r.endswith(resource_suffix) for h in hs]

    def said():
        return "\n".join(f"--- {h.name}\n{h.boot_log()}\n{(h.root / 'startup.out').read_text()}\n{h.agent_out()}"
                         for r, hs in hosts.hosts.items() for h in hs)

    def running():
        return len(found()) == n and all("agent running" in h.boot_log() for h in found())
    until(lambda: running() or any("FAILED" in h.boot_log() for h in found()), timeout, said, every=0.2)
    assert running(), said()                                    # not a boot that FAILED
    return found()


def test_a_base_runtime_host_installs_the_tensorflow_the_job_asks_for(hosts, cloud, cli, tmp_path):
    """The default for TensorFlow: Google's base runtime, and tensorflow-tpu of the job's version installed by the
    host (from the tests' local index, fakes/pyindex.py), with tf-keras as tf.keras."""
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "base")
    assert code == 0, err
    assert json.loads(cli("status", "-c", "base", "--json")[1])["runtime"] == "v2-alpha-tpuv5"
    [host] = _wait_agents(hosts, "nodes/tpuctl-base", 1)
    assert "TensorFlow" not in host.boot_log()   # a base runtime's image has none (fakes/tpu_host.tpu_vm_image)
    job = make_job(tmp_path, "import os, tensorflow as tf\nprint('tf', tf.__version__, tf.__distribution__, "
                             "tf.keras.__name__, os.environ['TF_USE_LEGACY_KERAS'])\n", 'tensorflow = "2.19"\n')
    code, out, err = cli("submit", str(job), "-c", "base")
    assert code == 0, out + err + host.agent_out()
    assert "tf 2.19.1 tensorflow-tpu tf_keras 1" in out, out
    assert cli("down", "-c", "base", "--yes")[0] == 0


def test_single_host_tpu_vm_boots_its_agent_from_the_bucket(hosts, cloud, cli, tmp_path, monkeypatch):
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "sim", "--runtime",
                         "tpu-vm-tf-2.18.0-pjrt-v5p-and-below")
    assert code == 0, err
    [host] = _wait_agents(hosts, "nodes/tpuctl-sim", 1)
    boot = host.boot_log()
    assert "python3-venv missing" in boot                       # the image has no ensurepip
    assert "waiting for the agent package in the store" in boot and "403" in boot   # the grant was propagating
    # The image's TensorFlow is tensorflow-tpu without tf-keras: the script adds tf-keras with --no-deps, and the
    # agent's environment (no PYTHONPATH: the image's site directory reaches it through the script's .pth) holds one
    # TensorFlow, not PyPI's tensorflow beside it.
    assert "TensorFlow 2.20.0: installed tf-keras 2.20" in boot, boot
    seen = subprocess.run([str(host.root / "opt/tpuctl/venv/bin/python"), "-c", "import importlib.metadata as m; "
                           "print(sorted(set(m.packages_distributions()['tensorflow'])))"],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert seen.stdout.strip() == "['tensorflow-tpu']", seen.stdout + seen.stderr
    job = make_job(tmp_path, "import os, tpuctl\nprint('on', os.environ['TPUCTL_ACCELERATOR'], "
                             "os.environ['TPUCTL_TPU'], tpuctl.__file__, os.environ['NEXT_PLUGGABLE_DEVICE_USE_C_API'],"
                             " os.environ['TF_PLUGGABLE_DEVICE_LIBRARY_PATH'])\n",
                   '[env]\nTF_PLUGGABLE_DEVICE_LIBRARY_PATH = "/opt/my/libtpu.so"\n')
    code, out, err = cli("submit", str(job), "-c", "sim")
    assert code == 0, err + host.agent_out()
    words = out.split()
    assert words[:3] == ["on", "v3-8", "local"]
    assert words[3].startswith(str(host.root / "opt/tpuctl/venv"))   # the wheel from the bucket, not this checkout
    assert words[4:] == ["true", "/opt/my/libtpu.so"]                 # PJRT runtime; the job's own value wins
    assert json.loads(cli("status", "-c", "sim", "--json")[1])["problem"] == ""   # a beating agent: healthy
    monkeypatch.setenv("TPUCTL_STALE_SECONDS", "0.001")     # every heartbeat is now too old: the agent is silent
    code, out, err = cli("status", "-c", "sim")
    assert "silent" in err and "fix: tpuctl ssh -c sim -- sudo systemctl restart tpuctl-agent" in err
    code, out, err = cli("down", "-c", "sim", "--yes")
    assert code == 0, err
    assert not hosts.hosts                                       # powered off with the TPU



def _store(cluster="slice"):
    from tpuctl.providers.stores import open_store
    return open_store(f"gs://{PROJECT}-tpuctl-{cluster}")


ENV_PRINT = ("import os\nkeys = ['TPUCTL_WORKER', 'TPUCTL_NUM_WORKERS', 'TPU_NAME', 'TPU_LOAD_LIBRARY', "
             "'NEXT_PLUGGABLE_DEVICE_USE_C_API', 'PJRT_DEVICE']\n"
             "print(' '.join(f'{k}={os.environ.get(k, \"-\")}' for k in keys))\n")


def test_a_four_host_slice_runs_tensorflow_once_and_jax_everywhere(hosts, cloud, cli, tmp_path):
    code, out, err = cli("up", "--type", "v3-32", "--zone", "europe-west4-a", "-c", "slice", "--runtime",
                         "tpu-vm-tf-2.18.0-pod-pjrt-v5p-and-below")
    assert code == 0, err
    four = _wait_agents(hosts, "nodes/tpuctl-slice", 4)
    assert sorted(h.worker for h in four) == [0, 1, 2, 3]

    tf_job = make_job(tmp_path, ENV_PRINT, name="tfjob")
    code, out, err = cli("submit", str(tf_job), "-c", "slice")
    assert code == 0, err
    # ONE program, on worker 0, pointed at the slice by name with libtpu left to the TPU runtime service
    assert out == ("TPUCTL_WORKER=0 TPUCTL_NUM_WORKERS=4 TPU_NAME=tpuctl-slice TPU_LOAD_LIBRARY=0 "
                   "NEXT_PLUGGABLE_DEVICE_USE_C_API=- PJRT_DEVICE=-\n")
    tf_run = [k for k, _ in _store().list("tpuctl/runs/") if k.endswith("/job.json")][0].split("/")[2]
    keys = [k for k, _ in _store().list(f"tpuctl/runs/{tf_run}/")]
    assert not [k for k in keys if "-w1" in k or "-w2" in k or "-w3" in k]   # no other worker claimed it
    code, out, err = cli("logs", tf_run, "-c", "slice", "--worker", "2")
    assert code == 0 and out == "" and "runs on worker 0" in err
    def serving():   # JSON: a table may wrap a row mid-phrase; and a loaded host's agent may not have beaten yet
        workers = json.loads(cli("status", "-c", "slice", "--json")[1])["resources"]["workers"]
        return sum("serving the TPU runtime" in v for v in workers.values()), workers
    until(lambda: serving()[0] == 3, 60, lambda: serving()[1], every=1)

    jax_job = make_job(tmp_path, ENV_PRINT, 'framework = "jax"\n', name="jaxjob")
    code, out, err = cli("submit", str(jax_job), "-c", "slice")
    assert code == 0, err
    assert "jax job" in err and "--framework jax" in err            # the cluster runs a TensorFlow image
    assert out.startswith("TPUCTL_WORKER=0 TPUCTL_NUM_WORKERS=4 TPU_NAME=- ")
    for w in (1, 2, 3):
        code, out, err = cli("logs", "-c", "slice", "--worker", str(w), "-f")
        assert code == 0 and out.startswith(f"TPUCTL_WORKER={w} TPUCTL_NUM_WORKERS=4 TPU_NAME=- "), err
    code, out, err = cli("logs", "-c", "slice", "--worker", "4")
    assert code == 2 and "has 4 workers" in err
    assert cli("down", "-c", "slice", "--yes")[0] == 0
    assert not hosts.hosts


@pytest.mark.tpu_nodes
def test_the_legacy_nodes_vm_boots_and_waits_for_the_tpu_address(hosts, cloud, cli, tmp_path):
    code, out, err = cli("up", "--type", "v2-8", "--zone", "us-central1-b", "--arch", "node", "-c", "legacy")
    assert code == 0, err
    [vm] = _wait_agents(hosts, "tpuctl-legacy-vm", 1)
    assert "[node-vm worker 0]" in vm.boot_log()
    # The window a recreation opens (after a preemption the node comes back with a new address): the record
    # written ahead of creation has no address yet. A run submitted then waits for it instead of using none.
    from tpuctl.core import layout
    store = _store("legacy")
    record = json.loads(store.read(layout.CLUSTER_RECORD))
    address = record["tpu_address"]
    store.write(layout.CLUSTER_RECORD, json.dumps({**record, "tpu_address": ""}).encode())
    job = make_job(tmp_path, "import os\nprint(os.environ['TPUCTL_TPU'])\n")
    code, out, err = cli("submit", str(job), "-c", "legacy", "--detach")
    assert code == 0, err
    run_id = out.strip()
    # the agent says so in the run's log once it has taken the run (a loaded machine takes it seconds later)
    until(lambda: "waiting for the TPU node's address" in cli("logs", run_id, "-c", "legacy")[1], 60,
          "the agent's waiting line", every=0.5)
    store.write(layout.CLUSTER_RECORD, json.dumps(record).encode())   # what `up` writes once the node is READY
    code, out, err = cli("logs", run_id, "-c", "legacy", "-f")
    assert code == 0, err + vm.agent_out()
    node = next(iter(cloud.tpu.nodes[1].values()))
    assert address == f"grpc://{node.network_endpoints[0].ip_address}:8470"
    assert out.endswith(f"\n{address}\n")
    assert cli("down", "-c", "legacy", "--yes")[0] == 0
    assert not hosts.hosts


def test_tensorflow_on_a_v4_32_base_runtime_has_every_hosts_runtime_set_first(hosts, cloud, cli, tmp_path):
    """A v4-32 (4 hosts) made on the base runtime: worker 0 installs the job's TensorFlow, and before its program
    starts every worker's tpu-runtime.service names grpc_tpu_worker:tf-X.Y.Z-pjrt of that TensorFlow and was
    restarted (Google's CI: set_up_pjrt on every worker); the store records what each host serves."""
    hosts.env["TPUCTL_RUNTIME_WAIT"] = "30"
    code, out, err = cli("up", "--type", "v4-32", "--zone", "us-central2-b", "-c", "slice")
    assert code == 0, err
    assert json.loads(cli("status", "-c", "slice", "--json")[1])["runtime"] == "v2-alpha-tpuv5"
    four = _wait_agents(hosts, "nodes/tpuctl-slice", 4)
    job = make_job(tmp_path, "import time, tensorflow as tf\nprint('started', time.time(), tf.__version__)\n",
                   'tensorflow = "2.19"\n')
    code, out, err = cli("submit", str(job), "-c", "slice")
    assert code == 0, out + err + "".join(h.agent_out() for h in four)
    started = float(out.split("started ")[1].split()[0])
    image = "gcr.io/cloud-tpu-v2-images/grpc_tpu_worker:tf-2.19.1-pjrt"
    assert "every worker serves it" in out
    for h in four:
        restarts = h.runtime_restarts()
        assert restarts and restarts[-1][1] == image and restarts[-1][0] < started, (h.worker, restarts)
        assert f'TF_DOCKER_URL={image}"' in (h.root / "etc/systemd/system/tpu-runtime.service").read_text()
    served = json.loads(cli("status", "-c", "slice", "--json")[1])["resources"]["tpu_runtime"]
    assert served == {str(w): image for w in range(4)}
    # the same TensorFlow again: nothing is restarted
    code, out, err = cli("submit", str(job), "-c", "slice")
    assert code == 0, out + err
    assert all(len(h.runtime_restarts()) == 1 for h in four)
    assert cli("down", "-c", "slice", "--yes")[0] == 0


@pytest.mark.slow(60)
def test_the_ui_switches_a_multi_host_runs_log_between_its_hosts(hosts, cloud, cli, tmp_path, monkeypatch):
    """Issue 51: a multi-host run's host selector switches logs. A v4-16 (two hosts) on the simulated hosts runs one
    JAX job on both; `tpuctl ui`'s server, over the fake bucket through the emulator's environment, names both hosts
    and gives each host's own line when the page asks for that worker's log."""
    import urllib.request

    from ui_server import ui_server
    code, out, err = cli("up", "--type", "v4-16", "--zone", "us-central2-b", "-c", "duo", "--framework", "jax")
    assert code == 0, err
    assert sorted(h.worker for h in _wait_agents(hosts, "nodes/tpuctl-duo", 2)) == [0, 1]
    job = make_job(tmp_path, "import os\nprint(f\"hello from worker {os.environ['TPUCTL_WORKER']}\")\n",
                   'framework = "jax"\n', name="hello")
    code, out, err = cli("submit", str(job), "-c", "duo")
    assert code == 0 and out == "hello from worker 0\n", err
    run = [k for k, _ in _store("duo").list("tpuctl/runs/") if k.endswith("/job.json")][0].split("/")[2]
    monkeypatch.setenv("TPUCTL_UI_STORE_WAIT", "10")
    with ui_server() as base:
        def get(path):
            with urllib.request.urlopen(f"{base}/api/{path}&token=t", timeout=30) as r:
                return json.loads(r.read())
        until(lambda: get(f"run?cluster=duo&id={run}").get("hosts"), 30, "the run page's hosts")
        assert [h["label"] for h in get(f"run?cluster=duo&id={run}")["hosts"]] == ["s0/w0", "s0/w1"]
        until(lambda: get(f"log?cluster=duo&id={run}&worker=1")["final"], 60, "worker 1's whole log")
        for worker in (1, 0, 1):   # the selector switched back and forth
            assert get(f"log?cluster=duo&id={run}&worker={worker}")["text"] == f"hello from worker {worker}\n"
    assert cli("down", "-c", "duo", "--yes")[0] == 0
    assert not hosts.hosts
