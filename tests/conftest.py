import logging
import os
import sys
from dataclasses import dataclass

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from fakes.compute_server import FakeCompute  # noqa: E402
from fakes.gcs import FakeGcs  # noqa: E402
from fakes.tpu_host import SimulatedHosts  # noqa: E402
from fakes.tpu_server import FakeTpu  # noqa: E402

PROJECT = "test-proj"
logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)  # it logs every 404 as an ERROR


@dataclass
class Cloud:
    tpu: FakeTpu
    compute: FakeCompute
    gcs: FakeGcs
    hosts: SimulatedHosts

    def mutating_calls(self):
        gcs = [c for c in self.gcs.calls if not c.startswith("GET")]
        return self.tpu.mutating_calls() + self.compute.mutating_calls() + gcs


@pytest.fixture(scope="session")
def _servers():
    tpu, compute, gcs = FakeTpu(), FakeCompute(), FakeGcs()
    hosts = tpu.start(), compute.start(), gcs.start()
    yield (tpu, compute, gcs), hosts
    tpu.stop()
    compute.stop()
    gcs.stop()


@pytest.fixture
def env(tmp_path, monkeypatch):
    """An isolated tpuctl home and config, fast polls and retries, no real credentials anywhere."""
    monkeypatch.setenv("TPUCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TPUCTL_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("TPUCTL_POLL_INTERVAL", "0.02")
    monkeypatch.setenv("TPUCTL_RETRY_BASE", "0.01")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    for var in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "TPUCTL_PROVIDER", "TPUCTL_CLUSTER",
                "TPUCTL_PROJECT", "TPUCTL_ZONE", "TPU_EMULATOR_HOST", "COMPUTE_EMULATOR_HOST",
                "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(var, raising=False)
    from tpuctl.providers.gcp import clients
    clients.reset()
    yield tmp_path
    clients.reset()


@pytest.fixture
def cloud(env, _servers, monkeypatch, tmp_path):
    (tpu, compute, gcs), (th, ch, sh) = _servers
    monkeypatch.setenv("TPU_EMULATOR_HOST", th)
    monkeypatch.setenv("COMPUTE_EMULATOR_HOST", ch)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", sh)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    for fake in (tpu, compute):
        fake.delay = 0.0
        fake.faults.clear()
        fake.op_faults.clear()
        fake.before.clear()
        fake.lost.clear()
        fake.calls.clear()
    tpu.nodes = {1: {}, 2: {}}
    tpu.zones = None
    tpu.runtimes.clear()
    tpu.accelerator_types.clear()
    compute.instances.clear()
    gcs.faults.clear()
    gcs.calls.clear()
    gcs.bytes_in.clear()
    gcs.iam_delay = 0.0
    gcs.after_iam_set = None
    gcs.lost.clear()
    gcs.wipe()
    hosts = SimulatedHosts(gcs, tmp_path / "hosts")   # off unless a test turns it on (hosts.enabled = True)
    tpu.hosts = compute.hosts = hosts
    yield Cloud(tpu, compute, gcs, hosts)
    hosts.stop_all()
    tpu.hosts = compute.hosts = None
    gcs.stop_identities()


@pytest.fixture
def local_up(env, cli):
    """up(name, *flags): a local cluster through the real CLI, its state returned; every local agent still running
    is stopped when the test ends."""
    from tpuctl import state
    from tpuctl.providers.local import LocalProvider

    def up(name, *flags):
        code, out, err = cli("up", "--provider", "local", "-c", name, *flags)
        assert code == 0, err
        return state.load(name)
    yield up
    for st in state.all_clusters():
        LocalProvider()._stop(st, lambda s: None)


@pytest.fixture
def cli(capsys):
    """Run the real CLI entry point in-process; returns (exit code, stdout, stderr)."""
    from tpuctl.cli import main

    def run(*args):
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code or 0
        out, err = capsys.readouterr()
        return code, out, err
    return run
