"""jobs/bert_pretrain on JAX across the two hosts of a slice, through tpuctl and the fakes (issues 48 and 50): `up`
a two-host Compute Engine MIG (`--type tpu7x-16`), `submit` the job, the logs of both hosts, `download`, `down`.

The hosts are the simulated ones (fakes/tpu_host.py) booted from the MIG's template: their image has no Keras, as
Google's TPU images have none, so the agent installs the job's requirements.txt as on a real host, with pip, from
the package index, which serves this environment's own Keras as PyPI serves it (fakes/pyindex.py installed_wheel).
JAX runs on the hosts' CPUs, one device each, its collectives over gloo. JAX finds a TPU slice's peers itself
only where libtpu finds TPU chips (jax/_src/cloud_tpu_init.py sets running_in_cloud_tpu_vm, which GceTpuCluster's
detection requires, jax/_src/clusters/cloud_tpu_cluster.py), and the hosts' names resolve to nothing here (the
simulated hosts share this machine's loopback, with no DNS for instance names), so the hosts are given the
coordinator as a cluster of CPUs is, by JAX_COORDINATOR_ADDRESS on an ephemeral port; each process's id is the
worker id the agent learned from the VM's metadata (tpu-env's TPU_WORKER_ID, TPUCTL_WORKER: tpuctl.runtime
jax_replicas). What each host read and wrote is traced with test_bert_multihost's DRIVER hooks, around the job's
own run.py."""
import json
import os
import shutil
import signal
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import FAST_XLA_FLAGS, PROJECT, until
from fakes.procs import marked
from fakes.tpu_host import image_site
from test_bert_multihost import DRIVER, _port
from test_gce_tpu import ZONE, _hosts, _wait_agents

pytestmark = pytest.mark.usefixtures("no_leak")

JOB = Path(__file__).parent.parent / "jobs" / "bert_pretrain"
STEPS, BATCH = 4, 4   # per replica: global 8, each host feeding 4 of each batch; a checkpoint every 2 steps
# run.py's flags (a generated corpus, small) then train.py's, as test_bert_multihost trains
ARGS = ["--sample-mb", "0.6", "--vocab-size", "3000", "--seq-length", "64", "--max-predictions-per-seq", "10",
        "--preset", "tiny", "--steps", str(STEPS), "--batch-size", str(BATCH), "--log-every", "2",
        "--checkpoint-every", "2", "--deterministic", "--learning-rate", "1e-2", "--warmup-steps", "1"]
# run.py under DRIVER's hooks (everything before its `import train`), noting into trace.jsonl beside the code: each
# start of the job, then what it read and wrote. Where the package holds `hold-at` (a checkpoint's file name), the
# chief's first start stops for good once it has written that file, as a host that hangs: the test then kills a job
TRACED = '''import os, sys, time
HERE = os.path.dirname(os.path.abspath(__file__))
hooks = open(os.path.join(HERE, "driver.py")).read().split("import train\\n")[0]
sys.argv = [sys.argv[0], HERE, os.path.join(HERE, "trace.jsonl"), *sys.argv[1:]]
exec(compile(hooks, "driver.py", "exec"))
note("start", os.environ["TPUCTL_WORKER"])
hold = os.path.join(HERE, "hold-at")
if os.environ["TPUCTL_WORKER"] == "0" and os.path.exists(hold) and not os.path.exists(hold + ".done"):
    at, copy = open(hold).read().strip(), fileio.copy
    def holding(src, dst):
        copy(src, dst)
        if dst.endswith("/" + at):
            open(hold + ".done", "w").close()
            note("held", at)
            time.sleep(3600)
    fileio.copy = holding
import run
run.main(sys.argv[3:])
'''


def traced_job(root: Path, hold_at: str = "") -> Path:
    """jobs/bert_pretrain as it is, its command run.py under the trace (TRACED); `hold_at`: TRACED's hold."""
    assert DRIVER.count("import train\n") == 1
    job = root / "bert_pretrain"
    shutil.copytree(JOB, job, ignore=shutil.ignore_patterns("__pycache__", ".tpuctl-cache"))
    toml = (job / "tpuctl.toml").read_text()
    assert 'command = "python run.py"' in toml
    (job / "tpuctl.toml").write_text(toml.replace('command = "python run.py"', 'command = "python traced.py"'))
    (job / "driver.py").write_text(DRIVER)
    (job / "traced.py").write_text(TRACED)
    if hold_at:
        (job / "hold-at").write_text(hold_at)
    return job


def jax_on_cpus(hosts) -> None:
    """Each host's JAX: its CPU (one device), gloo collectives, the coordinator on an ephemeral port of this
    machine; the suite's compilation cache and XLA flags (conftest) where there is one; worker 1 polls for worker 0's prepared
    data every half second (run.py's TPUCTL_PREPARE_POLL_SECONDS, 5 by default)."""
    hosts.env.update(JAX_PLATFORMS="cpu", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
                     JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{_port()}", TPUCTL_PREPARE_POLL_SECONDS="0.5",
                     XLA_FLAGS=FAST_XLA_FLAGS,
                     **{k: v for k, v in os.environ.items() if k.startswith("JAX_COMPILATION_CACHE")
                        or k == "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"})


def up_two_hosts(cloud, cli, monkeypatch, wheel_index):
    """`up` of a two-host Compute Engine MIG (`--type tpu7x-16`) whose hosts boot an image without Keras, JAX on
    their CPUs; returns the two hosts, worker 0 first."""
    wheel_index.serve_installed("keras")
    hosts = _hosts(cloud, monkeypatch)
    jax_on_cpus(hosts)
    # the held chief (below) is SIGTERMed for round 2 in the middle of a save, so the job cannot checkpoint and end
    # at once: it is SIGKILLed after TPUCTL_STOP_GRACE (20 s by default, idle), 2 s here
    hosts.env.update(TPUCTL_STOP_GRACE="2")
    code, out, err = cli("up", "--type", "tpu7x-16", "--zone", ZONE, "-c", "bert", "--yes")
    assert code == 0, err
    return sorted(_wait_agents(hosts, 2), key=lambda h: h.worker)


def traces(host) -> list[Path]:
    """TRACED's notes on `host`, beside the job's code in the agent's run directory (attempt.py: HOME/runs/RUN/wN/code):
    looked for there, not by a glob of the whole host (`**`), which walked the job environment's installed packages,
    thousands of files, at every poll (5 CPU-s of the test)."""
    return list(host.root.glob("home/agent/runs/*/w*/code/trace.jsonl"))


def starts(host) -> list[dict]:
    """What each start of the job on `host` read and wrote (TRACED's notes, split at each start): batch -> rows,
    the files written, whether it held."""
    [trace] = traces(host)
    found: list[dict] = []
    for line in trace.read_text().splitlines():
        kind, value = json.loads(line)
        if kind == "start":
            found.append({"batch": {}, "write": [], "held": False})
        elif kind == "batch":
            found[-1]["batch"][value[0]] = value[1]
        elif kind == "write":
            found[-1]["write"].append(value)
        elif kind == "held":
            found[-1]["held"] = True
    return found


def job_pids(host) -> list[int]:
    """The job's Python on `host` (run under TRACED): its processes that carry the host's agent home and run
    traced.py."""
    def argv(pid: int) -> list[bytes]:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:   # gone since
            return []
    return [pid for pid in marked("TPUCTL_AGENT_HOME", host.env["TPUCTL_AGENT_HOME"]) if b"traced.py" in argv(pid)]


@pytest.mark.slow(160)
def test_bert_across_a_two_host_mig_trains_once_and_a_job_killed_on_one_host_resumes_step_exactly_on_both(
        cloud, cli, tmp_path, monkeypatch, wheel_index):
    """A tpu7x-16 (two hosts, a Compute Engine MIG): the job's Keras is pip-installed on each host, the chief
    prepares the data and writes ckpt-2, then hangs; the other host's job is killed (SIGKILL, as the kernel's OOM
    killer does) while it waits in the next step's collective. tpuctl restarts the run on both hosts (round 2,
    `submit --max-restarts 1`); each goes on from the checkpoint with the batch after it, reading the rows its first
    start had made for those batches, and the run ends at --steps: trained across both hosts on disjoint data, only
    the chief writing, its checkpoints and TensorBoard events in the bucket, `download`, `down`.

    One test for what two did (each booted two hosts, installed Keras and prepared the data): the run across a MIG's
    two hosts, and the kill on a v4-16's (the TPU API). The round restart is the agent's, the same on every provider
    (test_rounds: a job's exit restarting every host of 2 slices x 2); the TPU API's multi-host slices boot their
    agents in test_simulated_hosts (a v4-16 under JAX, a four-host v3-32), and a MIG's hosts learn their worker ids
    in test_gce_tpu. The kill of a two-process JAX run and its resume are this test's alone: test_bert_multihost
    resumes its two processes from an uninterrupted run's ckpt-2 and compares the weights to that run's."""
    found = up_two_hosts(cloud, cli, monkeypatch, wheel_index)
    code, out, err = cli("submit", str(traced_job(tmp_path, hold_at="ckpt-2.weights.h5")), "-c", "bert",
                         "--max-restarts", "1", "--detach", "--", *ARGS)
    assert code == 0, err
    run_id = out.split()[-1]

    def first_starts_ready():   # the chief held; each host's reader had made every batch of the run ahead of need
        got = [starts(h) if traces(h) else [] for h in found]
        return all(got) and got[0][0]["held"] and all(set(range(STEPS)) <= set(s[0]["batch"]) for s in got)
    until(first_starts_ready, 600, lambda: cli("logs", run_id, "-c", "bert", "--all-hosts")[1][-5000:], every=0.5)
    [pid] = job_pids(found[1])
    os.kill(pid, signal.SIGKILL)
    code, out, err = cli("logs", run_id, "-c", "bert", "--follow")
    logs = [out, cli("logs", run_id, "-c", "bert", "--worker", "1")[1]]
    assert code == 0, out[-5000:] + err[-2000:] + "\n--- worker 1\n" + logs[1][-5000:]
    [run] = json.loads(cli("jobs", "-c", "bert", "--json")[1])
    assert run["state"] == "succeeded" and run["step"] == STEPS, run
    assert "the job exited 137: the run restarts on every host (round 2; submit --max-restarts 1)" in logs[1]
    assert "bert: resumed from step 2" in out, out[-5000:]
    # the job's Keras: none in the image, the index's (this environment's), installed by pip into the job's
    # environment on each host
    assert not list(image_site("ubuntu-accel").glob("keras*"))
    for h in found:
        assert [p.name for p in h.root.glob("home/agent/envs/*/lib/python*/site-packages/keras-*.dist-info")] == \
            [f"keras-{version('keras')}.dist-info"]
    # two JAX processes, one per host, each feeding half of every global batch
    for w, log in enumerate(logs):
        assert "backend: jax, 2 cpu replica(s)" in log, log[-3000:]
        assert f"bert: host {w} of 2 feeds {BATCH} of each batch" in log, log[-3000:]
    trained = []
    for w, h in enumerate(found):
        first, second = starts(h)   # the job started twice on each host: the kill's restart, and no other
        # the second start went on from the checkpoint: the batch after it, each with the first start's rows
        assert min(second["batch"]) == 2, (w, sorted(second["batch"]))
        for b in range(2, STEPS):
            assert second["batch"][b] == first["batch"][b], (w, b)
        assert not first["batch"].keys() - set(range(STEPS + 8)) and min(first["batch"]) == 0
        trained.append({r for b in range(STEPS) for r in (first if b < 2 else second)["batch"][b]})
    # across both starts each host trained on its own examples (rows before masks; batches made ahead of need were
    # never trained on), and the loss fell
    assert len(trained[0]) == len(trained[1]) == STEPS * BATCH and not trained[0] & trained[1]
    losses = [float(line.split()[3]) for line in out.splitlines() if line.startswith("step ")]
    assert len(losses) == STEPS // 2 and losses[-1] < losses[0], losses
    # only worker 0 wrote (the prepared data, the run's outputs, its checkpoints): ckpt-2 in its first start, the
    # later ones in its second; the other host nothing
    chief = starts(found[0])
    def weights(start):
        return [w[1].rsplit("/", 1)[1] for w in start["write"] if w[0] == "copy" and w[1].endswith(".weights.h5")]
    assert weights(chief[0]) == ["ckpt-2.weights.h5"]
    assert weights(chief[1]) == [f"ckpt-{s}.weights.h5" for s in range(4, STEPS + 1, 2)]
    assert all(s["write"] == [] for s in starts(found[1]))
    from google.cloud import storage
    bucket = storage.Client(project=PROJECT).bucket(f"{PROJECT}-tpuctl-bert")
    ckpts = sorted(b.name.rsplit("/", 1)[1] for b in bucket.list_blobs(prefix=f"runs/{run_id}/output/checkpoints/")
                   if b.name.endswith(".weights.h5"))
    assert ckpts == [f"ckpt-{s}.weights.h5" for s in range(2, STEPS + 1, 2)], ckpts
    # TensorBoard's events too, on a host without TensorFlow (callbacks.Board copies them through the store client)
    assert list(bucket.list_blobs(prefix=f"runs/{run_id}/output/tensorboard/train/events.out.tfevents."))
    code, out, err = cli("download", run_id, "-c", "bert", "-o", str(tmp_path / "got"))
    assert code == 0, err
    assert (tmp_path / "got" / "checkpoints" / f"ckpt-{STEPS}.weights.h5").stat().st_size > 0
    assert (tmp_path / "got" / "vocab.txt").exists() and (tmp_path / "got" / "metrics.json").exists()
    assert cli("down", "-c", "bert", "--yes")[0] == 0
    assert cloud.leaks() == []
