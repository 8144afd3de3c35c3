"""The agent's chip sampling (host/chipsampler.py) against a fake of libtpu's runtime metrics service built from
tpu-info's own proto, and a fake nvidia-smi: what lands in the run's tpu-metrics.json, and what `jobs` shows."""
import json
import os
import sys
import time

import pytest

from conftest import until
from fakes.libtpu_metrics import FakeLibtpuMetrics
from tpuctl.core import layout, metrics, utilisation
from tpuctl.core.store import LocalStore
from tpuctl.host import chipsampler
from tpuctl.host.chipsampler import ChipSampler

RUN = "20261128-101010-123-abcd"


class CountingStore(LocalStore):
    def __init__(self, root):
        super().__init__(root)
        self.writes = 0

    def write(self, key, data):
        self.writes += 1
        super().write(key, data)


@pytest.fixture
def libtpu(monkeypatch):
    fake = FakeLibtpuMetrics(chips=4)
    monkeypatch.setenv("TPUCTL_TPU_METRICS_ADDR", fake.addr)
    yield fake
    fake.stop()


def _doc(store, worker=0):
    return json.loads(store.read(layout.run_chips(RUN, worker)))


def test_each_chip_is_sampled_and_jobs_shows_the_mean_of_the_last_samples(tmp_path, libtpu):
    store = LocalStore(str(tmp_path))
    sampler = ChipSampler(store, RUN, 1)
    sampler.sample()
    libtpu.duty = [90.0, 90.0, 90.0, 90.0]
    libtpu.used = [12 * 2 ** 30] * 4
    sampler.sample()
    doc = _doc(store, 1)
    assert doc["source"] == "tpu-info" and doc["why"] == ""
    assert [c["duty_cycle_pct"] for c in doc["chips"]] == [90.0] * 4 and doc["chips"][0]["hbm_total"] == 16 * 2 ** 30
    assert [v for _, v in doc["history"]["duty_cycle_pct"]] == [50.0, 90.0]
    assert [v for _, v in doc["history"]["hbm_used_gib"]] == [32.0, 48.0]   # the host's chips summed
    assert utilisation.shown(doc) == "70%"
    assert [k for k, _ in store.list("")] == ["tpuctl/runs/20261128-101010-123-abcd/tpu-metrics-w1.json"]
    assert store.list(layout.run_output(RUN)) == []   # in the run's record: the job's outputs hold only its own
    assert set(libtpu.calls) == {"tpu.runtime.tensorcore.dutycycle.percent", "tpu.runtime.hbm.memory.usage.bytes",
                                 "tpu.runtime.hbm.memory.total.bytes"}


def test_a_service_that_does_not_answer_is_said_once_then_its_figures_come(tmp_path, libtpu, monkeypatch):
    store = CountingStore(str(tmp_path))
    libtpu.stop()
    sampler = ChipSampler(store, RUN, 0)
    for _ in range(3):
        sampler.sample()
    assert store.writes == 1   # the why, once
    doc = _doc(store)
    assert "did not answer (UNAVAILABLE)" in doc["why"] and utilisation.shown(doc).startswith("n/a (libtpu's")
    back = FakeLibtpuMetrics(chips=2)
    monkeypatch.setenv("TPUCTL_TPU_METRICS_ADDR", back.addr)
    try:
        sampler.sample()
    finally:
        back.stop()
    doc = _doc(store)
    assert doc["why"] == "" and utilisation.shown(doc) == "50%"
    sampler.sample()   # it blinks again: the last figures stand, nothing rewritten
    assert _doc(store)["why"] == "" and store.writes == 2


def test_the_history_is_capped_as_metrics_are(tmp_path, libtpu):
    store = LocalStore(str(tmp_path))
    sampler = ChipSampler(store, RUN, 0, read=lambda: ("tpu-info", [{"id": 0, "duty_cycle_pct": 10.0}]))
    for _ in range(metrics.CAP + 50):
        sampler.sample()
    assert len(_doc(store)["history"]["duty_cycle_pct"]) <= metrics.CAP
    resumed = ChipSampler(store, RUN, 0)   # a resumed run's sampler goes on from the file
    assert resumed.doc["history"] == _doc(store)["history"]


def test_nothing_to_sample_says_why(tmp_path, monkeypatch):
    monkeypatch.delenv("TPUCTL_TPU_METRICS_ADDR", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))   # no nvidia-smi
    monkeypatch.setattr("tpu_info.device.get_local_chips", lambda: (None, 0))
    store = LocalStore(str(tmp_path / "s"))
    ChipSampler(store, RUN, 0).sample()
    assert utilisation.shown(_doc(store)) == "n/a (no TPU chip on this host)"


def test_a_gpu_host_is_sampled_through_nvidia_smi(tmp_path, monkeypatch):
    # `nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits` prints
    # one line per GPU, fields separated by ", ", memory in MiB (nvidia-smi --help-query-gpu)
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0, 87, 1024, 16384\\n1, 13, 2048, 16384\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("TPUCTL_TPU_METRICS_ADDR", raising=False)
    source, chips = chipsampler.read_chips()
    assert source == "nvidia-smi"
    assert [(c["duty_cycle_pct"], c["hbm_used"], c["hbm_total"]) for c in chips] == \
        [(87.0, 2 ** 30, 16 * 2 ** 30), (13.0, 2 * 2 ** 30, 16 * 2 ** 30)]


def test_sampling_runs_beside_the_run_and_stops_with_it(tmp_path, monkeypatch, libtpu):
    monkeypatch.setenv("TPUCTL_TPU_METRICS_SECONDS", "0.05")
    store = LocalStore(str(tmp_path))

    def samples():
        raw = store.read(layout.run_chips(RUN, 0))
        return len(json.loads(raw)["history"]["duty_cycle_pct"]) if raw else 0
    with ChipSampler(store, RUN, 0).running():
        until(lambda: samples() >= 3, 10, "three samples")
    n = samples()
    time.sleep(0.2)
    assert samples() == n   # stopped with the run


def test_a_tpu_host_without_tpu_info_installs_it_once_for_the_agent_and_says_why_it_could_not(tmp_path, monkeypatch):
    pci = tmp_path / "pci" / "0000:00:04.0"
    pci.mkdir(parents=True)
    (pci / "vendor").write_text("0x1ae0\n")   # Google's PCI vendor id: a TPU chip (tpu_info/device.py)
    monkeypatch.setattr(chipsampler, "PCI_DEVICES", str(tmp_path / "pci"))
    monkeypatch.setattr(chipsampler, "_install", [])
    monkeypatch.setattr(chipsampler, "TPU_INFO", str(tmp_path / "no-such-tpu_info.whl"))   # pip fails, offline
    monkeypatch.setenv("TPUCTL_AGENT_HOME", str(tmp_path / "agent"))
    monkeypatch.delenv("TPUCTL_TPU_METRICS_ADDR", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))   # no nvidia-smi
    monkeypatch.setattr(sys, "path", list(sys.path))   # the agent's directory joins it: gone after the test

    def missing():
        raise ImportError("No module named 'tpu_info'")
    monkeypatch.setattr(chipsampler, "_import_tpu_info", missing)
    store = LocalStore(str(tmp_path / "s"))
    sampler = ChipSampler(store, RUN, 0)
    sampler.sample()
    sampler.sample()
    why = _doc(store)["why"]
    assert why.startswith("tpu-info is not installed on this host and could not be (") and "pip install" in why
    assert len(chipsampler._install) == 1   # pip ran once, not at every sample
    assert str(tmp_path / "agent" / "tpu-info") in sys.path   # where the agent installs it for itself


def _fake_smi(tmp_path, monkeypatch, script):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + script)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("TPUCTL_TPU_METRICS_ADDR", raising=False)


def test_nvidia_smi_printing_what_is_not_utf8_is_said_and_up_still_counts_the_gpus(tmp_path, monkeypatch):
    """Issue 58: a driver's answer that is not UTF-8 raised UnicodeDecodeError (text=True): `up --provider local`
    crashed and left the cluster not ready."""
    from tpuctl.providers import local
    _fake_smi(tmp_path, monkeypatch, "printf 'GPU 0: Tesla \\377\\376 (UUID: x)\\n\\377\\n'\n")
    assert local.accelerator() == ("gpu:1", "")
    store = LocalStore(str(tmp_path / "s"))
    ChipSampler(store, RUN, 0).sample()
    assert utilisation.shown(_doc(store)).startswith("n/a (nvidia-smi printed what is not its CSV of numbers: ")
    _fake_smi(tmp_path, monkeypatch, "printf '0, nan, 1, 2\\n'\n")   # a NaN never reaches the file
    ChipSampler(store, RUN, 0).sample()
    assert b"NaN" not in store.read(f"tpuctl/runs/{RUN}/tpu-metrics.json")


# A hung nvidia-smi whose child holds its stdout open: the child writes its pid, then sleeps with the pipe open (as
# a driver helper it forked would), and nvidia-smi itself hangs too.
HUNG_WITH_CHILD = "sh -c 'echo $$ > \"$HUNG_PIDS/child\"; exec sleep 60' &\necho $$ > \"$HUNG_PIDS/smi\"\nsleep 60\n"


def _gone(pid_file, within=5.0):
    """The process named in pid_file ended (and is not a zombie) within `within` seconds."""
    from tpuctl.core.processes import running
    pid = int(pid_file.read_text())
    end = time.monotonic() + within
    while running(pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not running(pid)


def _hung_smi(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("HUNG_PIDS", str(pids))
    _fake_smi(tmp_path, monkeypatch, HUNG_WITH_CHILD)
    monkeypatch.setenv("TPUCTL_NVIDIA_SMI_DEADLINE", "0.5")
    return pids


def test_a_hung_nvidia_smi_is_given_up_at_its_deadline_with_its_children_and_says_so(tmp_path, monkeypatch):
    """A hung nvidia-smi left no record: subprocess.run's timeout kills the child, then waits for its pipes, which
    a child of its own holds open. The whole session is killed at TPUCTL_NVIDIA_SMI_DEADLINE, the child holding the
    pipe included."""
    pids = _hung_smi(tmp_path, monkeypatch)
    store = LocalStore(str(tmp_path / "s"))
    started = time.monotonic()
    ChipSampler(store, RUN, 0).sample()
    assert time.monotonic() - started < 3
    assert utilisation.shown(_doc(store)) == "n/a (nvidia-smi did not answer within 0.5s (TPUCTL_NVIDIA_SMI_DEADLINE))"
    assert _gone(pids / "smi") and _gone(pids / "child")


def test_up_on_this_machine_gives_up_a_hung_nvidia_smi_at_its_deadline_and_says_why(tmp_path, monkeypatch):
    """Issue 58.4: the local provider's GPU count ran `nvidia-smi -L` through subprocess.run(timeout=10), which
    kills nvidia-smi alone (its child kept running, holding the pipe) and then waits, unbounded, for the process it
    killed. Now bounded like the sampler's: the group killed at TPUCTL_NVIDIA_SMI_DEADLINE, and `up` says why its
    jobs run on the CPU."""
    from tpuctl.providers import local
    pids = _hung_smi(tmp_path, monkeypatch)
    started = time.monotonic()
    chips, why = local.accelerator()
    assert time.monotonic() - started < 3
    assert (chips, why) == ("cpu", "n/a (nvidia-smi did not answer within 0.5s (TPUCTL_NVIDIA_SMI_DEADLINE))")
    assert _gone(pids / "smi") and _gone(pids / "child")


def test_an_nvidia_smi_that_answers_then_leaves_a_child_holding_its_output_is_bounded_too(tmp_path, monkeypatch):
    """The answer printed, nvidia-smi exits, a child it left keeps the pipe: no end of file ever comes. What it wrote
    before it exited is its answer (not a wait for the end of file until the deadline), and the child is ended."""
    from tpuctl.providers import local
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("HUNG_PIDS", str(pids))
    _fake_smi(tmp_path, monkeypatch, "echo 'GPU 0: Tesla (UUID: x)'\n"
                                     "sh -c 'echo $$ > \"$HUNG_PIDS/child\"; exec sleep 60' &\nsleep 0.2\n")
    monkeypatch.setenv("TPUCTL_NVIDIA_SMI_DEADLINE", "8")
    started = time.monotonic()
    assert local.accelerator() == ("gpu:1", "")
    assert time.monotonic() - started < 4 and _gone(pids / "child")


def test_a_huge_nvidia_smi_answer_is_cut_not_written_whole(tmp_path, monkeypatch):
    """400,000 lines were written whole into the run's record at every sample (35 MB)."""
    _fake_smi(tmp_path, monkeypatch, "seq 0 399999 | sed 's/$/, 50, 1024, 16384/'\n")
    store = LocalStore(str(tmp_path / "s"))
    ChipSampler(store, RUN, 0).sample()
    assert len(_doc(store)["chips"]) == chipsampler.MAX_GPUS == 64
    assert len(store.read(f"tpuctl/runs/{RUN}/tpu-metrics.json")) < 20_000
