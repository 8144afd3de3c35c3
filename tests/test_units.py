"""Unit tests: catalog, config precedence, error classification from captured payloads, waits, runtime choice."""
import os
import subprocess
import sys

import pytest

from tpuctl.core import catalog, config
from tpuctl.core.errors import TpuctlError
from tpuctl.core.models import check_bucket_name, default_bucket
from tpuctl.providers.google.errors import classify, classify_text
from tpuctl.providers.google.operations import call, wait
from tpuctl.providers.gcp.tpuapi.tpu import pick_runtime, pick_tf_version


@pytest.mark.parametrize("name,chips,hosts", [("v2-8", 4, 1), ("v3-8", 4, 1), ("v3-32", 16, 4), ("v4-8", 4, 1),
                                              ("v5p-16", 8, 2), ("v5litepod-1", 1, 1), ("v5litepod-8", 8, 1),
                                              ("v6e-16", 16, 4)])
def test_catalog_shapes(name, chips, hosts):
    t = catalog.tpu_type(name)
    assert (t.chips, t.hosts) == (chips, hosts)


def test_catalog_prices_and_pod_zones():
    assert catalog.tpu_type("v3-8").price_hour == 8.0
    assert catalog.tpu_type("v5litepod-1").spot_price_hour == 0.245
    assert catalog.tpu_type("v3-32").zones == ("europe-west4-a",)
    assert catalog.region_of("us-central1-ai1a") == "us-central1"
    assert catalog.unlisted(catalog.tpu_type("v3-32"), ["us-central1-b", "europe-west4-a"]) == ["us-central1-b"]
    # Google's regions page: v2 pods in us-central1-a and europe-west4-a, v2-8 not in us-central1-a
    assert catalog.unlisted(catalog.tpu_type("v2-32"), ["us-central1-a", "europe-west4-a"]) == []
    assert catalog.unlisted(catalog.tpu_type("v2-8"), ["us-central1-a"]) == ["us-central1-a"]
    # AI zones belong to their region: accepted where the family is offered in that region
    assert catalog.unlisted(catalog.tpu_type("v6e-8"), ["us-central1-ai1a", "us-east5-ai2b"]) == []
    assert catalog.unlisted(catalog.tpu_type("v6e-8"), ["us-west9-ai1a"]) == ["us-west9-ai1a"]


def test_bucket_names():
    assert check_bucket_name("my-proj-tpuctl-default")
    for bad in ("Upper", "-lead", "trail-", "a..b" * 1, "192.168.1.1", "goog-x", "x" * 64):
        with pytest.raises(TpuctlError):
            check_bucket_name(bad)
    assert default_bucket("example.com:proj-1", "c") == "example-com-proj-1-tpuctl-c"


def test_config_precedence(env, monkeypatch):
    (env / "config.toml").write_text('provider = "local"\nproject = "from-file"\nzone = "us-central1-a"\n')
    assert config.provider(None) == "local"
    monkeypatch.setenv("TPUCTL_PROVIDER", "gcp")
    assert config.provider(None) == "gcp"
    assert config.provider("local") == "local"
    assert config.project(None) == "from-file"
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "from-sdk")
    assert config.project(None) == "from-sdk"
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "from-env")
    assert config.project(None) == "from-env"
    assert config.project("from-flag") == "from-flag"


def test_project_from_gcloud_config(env):
    d = env / "gcloud"
    (d / "configurations").mkdir(parents=True)
    (d / "active_config").write_text("work\n")
    (d / "configurations" / "config_work").write_text("[core]\nproject = gcloud-proj\naccount = a@b\n")
    assert config.project(None) == "gcloud-proj"


def test_bad_config_file(env):
    (env / "config.toml").write_text('colour = "red"\n')
    with pytest.raises(TpuctlError) as e:
        config.provider(None)
    assert e.value.kind == "input" and "colour" in e.value.message


CAPTURED = [  # (code, message as Google sends it, no reason) -> (kind, scope, retryable); reasons: test_error_payloads
    ("RESOURCE_EXHAUSTED", 'There is no more capacity in the zone "us-central1-b"; you can try in another zone '
     "where Cloud TPU Nodes are offered", ("capacity", "zone", False)),
    ("RESOURCE_EXHAUSTED", "Quota 'TPUV3PodPerProjectPerZoneForTPUAPI' exhausted. Limit 0 in zone us-central1-b",
     ("capacity", "zone", False)),
    ("RESOURCE_EXHAUSTED", "Quota 'TPUV5sLitepodServingPerProjectPerRegionForTPUAPI' exhausted. Limit 8 in region "
     "us-central1", ("capacity", "region", False)),
    ("FAILED_PRECONDITION", "Insufficient reserved capacity. Contact customer support.", ("capacity", "zone", False)),
    ("INVALID_ARGUMENT", "Invalid value: the accelerator v5litepod-8 was not found in zone us-central1-b",
     ("input", "zone", False)),
    ("PERMISSION_DENIED", "Cloud TPU API has not been used in project 123 before or it is disabled.",
     ("permission", "global", False)),
    ("INVALID_ARGUMENT", "Your request to provision TPU Node has been denied. Please migrate to TPU VM Architecture",
     ("refused", "global", False)),
    ("ZONE_RESOURCE_POOL_EXHAUSTED", "The zone 'projects/p/zones/us-central1-b' does not have enough resources "
     "available to fulfill the request.", ("capacity", "zone", False)),
    ("QUOTA_EXCEEDED", "Quota 'CPUS' exceeded.  Limit: 8.0 in region us-central1.", ("capacity", "region", False)),
    ("UNAVAILABLE", "Connection reset by peer", ("error", "global", True)),
    ("503", "Backend Error", ("error", "global", True)),
    ("429", "Rate Limit Exceeded", ("error", "global", True)),
    ("RESOURCE_EXHAUSTED", "Too many requests", ("error", "global", True)),
    ("DEADLINE_EXCEEDED", "Deadline Exceeded", ("error", "global", True)),
    ("403", "caller does not have storage.buckets.create access", ("permission", "global", False)),
    ("404", "Not Found", ("not_found", "global", False)),
]


@pytest.mark.parametrize("code,message,expect", CAPTURED, ids=[c[1][:40] for c in CAPTURED])
def test_classification(code, message, expect):
    e = classify_text(code, message)
    assert (e.kind, e.scope, e.retryable) == expect


def test_insufficient_reserved_capacity_is_a_stockout_even_without_a_reservation():
    # Google answers it to requests that named no reservation (skypilot-org/skypilot#4579): the hint must not send
    # the user looking for a reservation to drop.
    hint = classify_text("RESOURCE_EXHAUSTED", "Insufficient reserved capacity. Contact customer support.").hint
    assert "reservation is full" not in hint and "even when no reservation was asked for" in hint
    assert "--zone" in hint and "--spot" in hint


def test_classify_google_exceptions():
    from google.api_core import exceptions as g
    assert classify(g.ResourceExhausted('There is no more capacity in the zone "z"')).scope == "zone"
    assert classify(g.ServiceUnavailable("x")).retryable
    assert classify(g.NotFound("x")).kind == "not_found"
    assert classify(g.Forbidden("x")).kind == "permission"


def test_call_retries_transient_then_succeeds():
    from google.api_core import exceptions as g
    attempts, sleeps = [], []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise g.ServiceUnavailable("busy")
        return "ok"
    assert call(flaky, sleep=sleeps.append) == "ok"
    assert len(sleeps) == 2 and sleeps[1] > 0 and all(s <= 30 for s in sleeps)


def test_call_does_not_retry_permanent():
    from google.api_core import exceptions as g
    n = []

    def denied():
        n.append(1)
        raise g.Forbidden("no")
    with pytest.raises(TpuctlError) as e:
        call(denied, sleep=lambda s: None)
    assert len(n) == 1 and e.value.kind == "permission"


def test_wait_reports_states_and_times_out_with_fake_clock():
    now = [0.0]
    states = iter(["CREATING", "CREATING", "READY"])
    seen = []
    assert wait(lambda: ((s := next(states)) == "READY", s), "tpu", 60, seen.append,
                clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)) == "READY"
    assert seen == ["CREATING", "READY"]
    now[0] = 0.0
    with pytest.raises(TpuctlError) as e:
        wait(lambda: (False, "CREATING"), "tpu", 10, None, clock=lambda: now[0],
             sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert e.value.kind == "timeout" and "after 10s" in e.value.message
    assert now[0] >= 10


def test_pick_runtime():
    from fakes.tpu_server import RUNTIMES
    assert pick_runtime(RUNTIMES, "v3", False) == "tpu-vm-tf-2.18.0-pjrt-v5p-and-below"
    assert pick_runtime(RUNTIMES, "v6e", False) == "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6"
    assert pick_runtime(RUNTIMES, "v3", True) == "tpu-vm-tf-2.18.0-pod-pjrt-v5p-and-below"
    assert pick_runtime(["tpu-vm-tf-2.14.0", "tpu-vm-tf-2.15.0-pjrt"], "v5litepod", False) == "tpu-vm-tf-2.15.0-pjrt"
    assert pick_runtime(["tpu-vm-base"], "v3", False) == ""
    assert pick_tf_version(["2.9.1", "2.12.0", "2.10.0", "nightly"]) == "2.12.0"


@pytest.mark.parametrize("role,tf", [("tpu-vm", ""), ("node-vm", "2.12.0")])
def test_startup_script_renders_and_parses(tmp_path, role, tf):
    from tpuctl import __version__
    from tpuctl.providers.gcp.startup import render
    script = render("gs://b", "bert", role, "v3-8", "local" if role == "tpu-vm" else "", tf)
    assert "@{" not in script and f'VERSION="{__version__}"' in script
    assert f'ROLE="{role}"' in script and "tpuctl.agent --store $STORE" in script
    path = tmp_path / "s.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_startup_script_ships_in_the_wheel(tmp_path):
    """templates/ must be inside the built wheel, not only in the source checkout."""
    import pathlib
    import zipfile
    root = pathlib.Path(__file__).parent.parent
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path), str(root)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    whl = next(tmp_path.glob("tpuctl-*.whl"))
    assert "tpuctl/templates/startup.sh" in zipfile.ZipFile(whl).namelist()


def test_runtime_leaves_the_keras_of_a_job_alone(tmp_path):
    """Importing tpuctl.runtime sets no TF_USE_LEGACY_KERAS (a Keras 3 job's tf.keras stays Keras 3); the host's
    rule for tf-keras jobs, prefer_legacy_keras, sets it only where tf-keras is installed, a job's value winning."""
    import os
    from tpuctl import runtime
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = "import os, tpuctl.runtime as r; print(os.environ.get('TF_USE_LEGACY_KERAS'))"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout
    assert out.strip() == "None"  # this environment has tf-keras (the test extra): still not set
    environ: dict = {}
    assert runtime.prefer_legacy_keras(environ) and environ == {"TF_USE_LEGACY_KERAS": "1"}
    environ = {"TF_USE_LEGACY_KERAS": "0"}
    assert not runtime.prefer_legacy_keras(environ) and environ == {"TF_USE_LEGACY_KERAS": "0"}   # a job's own


@pytest.mark.parametrize("environ,expect", [
    ({"TPUCTL_TPU": "local", "TPUCTL_ACCELERATOR": "v3-8"}, ("local", False)),            # single-host TPU VM
    ({"TPUCTL_TPU": "tpuctl-slice", "TPU_NAME": "tpuctl-slice", "TPU_LOAD_LIBRARY": "0"},
     ("tpuctl-slice", True)),                                                              # a slice's worker 0
    ({"TPUCTL_TPU": "grpc://10.0.0.2:8470"}, ("grpc://10.0.0.2:8470", True)),               # beside a legacy node
    ({"TPU_NAME": "grpc://10.0.0.9:8470"}, ("grpc://10.0.0.9:8470", True)),                 # a notebook naming its TPU
    ({"COLAB_TPU_ADDR": "10.0.0.7:8470"}, ("", True)),                                      # Colab TPU Node
    ({"TPUCTL_ACCELERATOR": "gpu:2"}, None),                                                # GPUs
    ({"TPUCTL_ACCELERATOR": "cpu"}, None),                                                  # CPU
])
def test_runtime_finds_the_tpu_from_its_environment(environ, expect, monkeypatch):
    from tpuctl import runtime
    monkeypatch.setattr(os.path, "exists", lambda p: False)   # no /dev/accel0 on this machine
    assert runtime.tpu_target(environ) == expect


def test_tpu_vm_device_files_mean_a_local_tpu(monkeypatch):
    # Kaggle and Colab TPU VMs set nothing of ours: the device files say it (/dev/accel0 v4+, /dev/vfio/0 v5e+)
    from tpuctl import runtime
    monkeypatch.setattr(os.path, "exists", lambda p: p == "/dev/vfio/0")
    assert runtime.tpu_target({}) == ("local", False)


@pytest.mark.parametrize("framework,record,accelerator,expect", [
    ("tensorflow", {"arch": "vm", "hosts": 1, "runtime": "tpu-vm-tf-2.18.0-pjrt"}, "v3-8",
     {"WRAPT_DISABLE_EXTENSIONS": "true", "TPU_NAME": "local", "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
      "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so"}),
    ("tensorflow", {"arch": "vm", "hosts": 1, "runtime": "tpu-vm-tf-2.17.0-se"}, "v3-8",
     {"WRAPT_DISABLE_EXTENSIONS": "true", "TPU_NAME": "local"}),
    ("tensorflow", {"arch": "vm", "hosts": 4, "runtime": "tpu-vm-tf-2.18.0-pod-pjrt", "tpu_name": "tpuctl-s"}, "v3-32",
     {"WRAPT_DISABLE_EXTENSIONS": "true", "TPU_NAME": "tpuctl-s", "TPU_LOAD_LIBRARY": "0"}),
    ("pytorch", {"arch": "vm", "hosts": 4}, "v5litepod-16", {"PJRT_DEVICE": "TPU"}),
    ("jax", {"arch": "vm", "hosts": 4}, "v5litepod-16", {}),
    ("tensorflow", {"arch": "node", "hosts": 1, "runtime": "2.12.0"}, "v2-8", {}),
    ("tensorflow", {"arch": "vm", "hosts": 1, "runtime": ""}, "cpu", {}),
])
def test_tpu_environment_follows_googles_harness(framework, record, accelerator, expect):
    from tpuctl.host.tpuenv import tpu_environment
    assert tpu_environment(framework, record, accelerator) == expect


def test_every_tpu_state_has_one_meaning():
    """Each tpu_v2 Node.State is waited on, lost, going, held (told to the user) or READY, never unclassified: an
    unclassified state would be watched in silence."""
    from google.cloud import tpu_v2
    from tpuctl.providers.gcp.tpuapi import tpu
    groups = [tpu.COMING, tpu.LOST, tpu.GOING, tpu.HELD, {tpu.READY}]
    names = [s.name for s in tpu_v2.Node.State]
    assert sorted(n for g in groups for n in g) == sorted(names)
    assert set(tpu.HEALTH_TOLD) | tpu.HEALTH_WAIT | {"HEALTHY", "HEALTH_UNSPECIFIED"} == \
        {h.name for h in tpu_v2.Node.Health}


def test_one_store_client_range_for_cli_agent_and_host_script():
    """The CLI, the agent's wheel, the host's start-up script and a GKE pod's script ask for the same
    google-cloud-storage range, the one whose retries of conditional uploads gcs_store relies on (gcs_store.STORAGE)."""
    import tomllib
    from pathlib import Path
    from tpuctl.providers import agent_package
    from tpuctl.providers.google.gcs_store import STORAGE
    from tpuctl.providers.gcp.startup import render
    deps = tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"]
    assert [d for d in deps if d.startswith("google-cloud-storage")] == [STORAGE] == agent_package.REQUIRES
    assert f'STORAGE_REQ="{STORAGE}"' in render("gs://b", "c", "tpu-vm", "v3-8", "local")
    from tpuctl.providers.gke.manifest import AGENT_SCRIPT
    assert f'pip install -q --no-cache-dir --no-compile "{STORAGE}"' in AGENT_SCRIPT and "@{" not in AGENT_SCRIPT
    from google.cloud import storage
    major = int(storage.__version__.split(".")[0])
    assert major == 3, "the installed client is outside the range tpuctl is tested with"


def test_the_scripts_check_of_an_installed_store_client_before_pip(tmp_path):
    """Both scripts run gcs_store.SATISFIED as `python -c '...' REQUIREMENT` before pip: met, it prints the version
    and exits 0 (no pip run); out of range or not installed, exit 1 (pip installs it)."""
    import subprocess
    import sys
    from tpuctl.providers.google.gcs_store import SATISFIED, STORAGE
    from tpuctl.providers.gke.manifest import AGENT_SCRIPT
    assert "'" not in SATISFIED and f"-c '{SATISFIED}' \"{STORAGE}\" >/dev/null 2>&1 || retry" in AGENT_SCRIPT

    def check(req):
        return subprocess.run(["sh", "-c", f"\"$0\" -c '{SATISFIED}' \"$1\"", sys.executable, req],
                              capture_output=True, text=True)
    met = check(STORAGE)
    from google.cloud import storage
    assert met.returncode == 0 and met.stdout.strip() == storage.__version__
    assert check("google-cloud-storage>=99").returncode == 1 and check("no-such-distribution-x").returncode == 1


def _fake_jax_and_keras(monkeypatch, calls: list, n: int):
    """Stand-ins with the calls runtime.jax_replicas makes: jax.distributed.initialize() must come before any
    device query (JAX "Multi-host and multi-process environments": call it before any other JAX call), and
    keras.distribution's list_devices / DataParallel(devices=) / set_distribution (keras.io distribution API)."""
    import types
    dev = types.SimpleNamespace(platform="tpu")
    jax = types.SimpleNamespace(distributed=types.SimpleNamespace(initialize=lambda: calls.append("initialize")),
                                devices=lambda: calls.append("devices") or [dev] * n,
                                process_count=lambda: 1, process_index=lambda: 0)
    dist = types.SimpleNamespace(list_devices=lambda: calls.append("list_devices") or [f"tpu:{i}" for i in range(n)],
                                 DataParallel=lambda devices: ("DataParallel", tuple(devices)),
                                 set_distribution=lambda d: calls.append(("set", d)))
    monkeypatch.setitem(sys.modules, "jax", jax)
    monkeypatch.setitem(sys.modules, "keras", types.SimpleNamespace(distribution=dist, __version__="3.12.0"))


def test_jax_replicas_span_every_device_and_a_run_across_hosts_initialises_first(monkeypatch):
    from tpuctl import runtime
    calls: list = []
    _fake_jax_and_keras(monkeypatch, calls, 8)
    r = runtime.jax_replicas({"TPUCTL_NUM_WORKERS": "2"})
    assert calls[0] == "initialize" and ("set", ("DataParallel", tuple(f"tpu:{i}" for i in range(8)))) in calls
    assert r.num_replicas_in_sync == 8 and runtime.kind(r) == "tpu" and runtime.global_batch(4, r) == 32
    calls.clear()
    _fake_jax_and_keras(monkeypatch, calls, 1)
    one = runtime.jax_replicas({"TPUCTL_NUM_WORKERS": "1"})
    assert "initialize" not in calls and not [c for c in calls if c[0] == "set"]   # one device: no distribution
    assert one.num_replicas_in_sync == 1 and one.distribution is None
