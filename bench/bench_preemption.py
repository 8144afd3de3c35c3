"""Preemption campaign: a deterministic job that checkpoints every K steps runs on a simulated TPU VM (the real
start-up script and agent, tests/fakes/tpu_host.py) of a cluster armed with `up --recover`, watched by
`tpuctl watch --detach`. The fake TPU API preempts the node at random moments, at least PREEMPTIONS times; nothing
is typed after `submit`. The run must end with exactly the final metrics of an uninterrupted run of the same seed
(the baseline, computed here first), its log must show each resume, and nothing may be left after `down`.
Prints goodput and the time from each preemption to training again (median, max).

    python bench/bench_preemption.py [PREEMPTIONS] [STEPS]
"""
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from fakes.compute_server import FakeCompute  # noqa: E402
from fakes.gcs import FakeGcs  # noqa: E402
from fakes.pyindex import WheelIndex  # noqa: E402
from fakes.resource_manager import FakeResourceManager  # noqa: E402
from fakes.tpu_host import SimulatedHosts  # noqa: E402
from fakes.tpu_server import FakeTpu  # noqa: E402

PREEMPTIONS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 240
EVERY, STEP_SECONDS, SEED = 20, 0.1, 1234
PROJECT, ZONE, NAME = "bench-proj", "us-central1-b", "pre"
NODE = f"projects/{PROJECT}/locations/{ZONE}/nodes/tpuctl-{NAME}"

# The job: a seeded random walk standing in for training. Each step's update depends only on the seed, the step and
# the state the checkpoint holds, so a resumed run reaches exactly the uninterrupted run's state.
JOB = f'''
import json, os, random, sys, time
from tpuctl import runtime
from tpuctl.providers.stores import open_store

def update(w, step):
    return w * 0.99 + random.Random({SEED} * 100003 + step).gauss(0, 1)

if __name__ == "__main__":
    store = open_store(os.environ["TPUCTL_STORE"])
    key = f"runs/{{runtime.run_id()}}/output/ckpt.json"
    raw = store.read(key)
    ck = json.loads(raw) if raw else {{"step": 0, "w": 0.0}}
    print("restored step", ck["step"], flush=True)
    progress = runtime.Progress(ck["step"], every={EVERY})
    w = ck["w"]
    for step in range(ck["step"] + 1, {STEPS} + 1):
        t0 = time.perf_counter()
        w = update(w, step)
        time.sleep({STEP_SECONDS})
        progress.step(step, time.perf_counter() - t0, loss=w * w)
        if step % {EVERY} == 0:
            store.write(key, json.dumps({{"step": step, "w": w}}).encode())
            print("step", step, "loss", repr(w * w), flush=True)
    print("final loss", repr(w * w), flush=True)
'''


def baseline() -> float:
    w = 0.0
    for step in range(1, STEPS + 1):
        w = w * 0.99 + random.Random(SEED * 100003 + step).gauss(0, 1)
    return w * w


def tpuctl(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "tpuctl", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def start_fakes(tmp: Path):
    tpu, compute, gcs, iam = FakeTpu(), FakeCompute(), FakeGcs(), FakeResourceManager()
    th, ch, sh, rh, trh = tpu.start(), compute.start(), gcs.start(), iam.start(), tpu.start_rest()
    tpu.iam = compute.iam = iam
    iam.reset(f"{compute.project_number}-compute@developer.gserviceaccount.com")
    index = WheelIndex(tmp / "index")
    pip = {"TPUCTL_TF_FIND_LINKS": index.url, "PIP_FIND_LINKS": index.url, "PIP_NO_INDEX": "1"}
    hosts = SimulatedHosts(gcs, tmp / "hosts")
    hosts.enabled = True
    fast = {"TPUCTL_STALE_SECONDS": "3", "TPUCTL_LOG_POLL_MAX": "0.2", "TPUCTL_POLL_INTERVAL": "0.1",
            "TPUCTL_PROGRESS_SECONDS": "0.3"}
    hosts.env.update(TPU_REST_EMULATOR_HOST=trh, COMPUTE_EMULATOR_HOST=ch, RESOURCE_MANAGER_EMULATOR_HOST=rh,
                     **pip, **fast)
    tpu.hosts = compute.hosts = hosts
    os.environ.update(TPU_EMULATOR_HOST=th, COMPUTE_EMULATOR_HOST=ch, STORAGE_EMULATOR_HOST=sh,
                      RESOURCE_MANAGER_EMULATOR_HOST=rh, GOOGLE_CLOUD_PROJECT=PROJECT, TPUCTL_HOME=str(tmp / "home"),
                      TPUCTL_CONFIG="/nonexistent", TPUCTL_RETRY_BASE="0.05", TPUCTL_WATCH_POLL="0.5",
                      TPUCTL_LEASE_SECONDS="6", TPUCTL_RECOVER_BACKOFF="1", **pip, **fast)
    return tpu, compute, gcs, iam, hosts, index


def metrics_doc():
    from google.cloud import storage
    b = storage.Client(project=PROJECT).bucket(f"{PROJECT}-tpuctl-{NAME}")
    for blob in b.list_blobs(prefix="runs/"):
        if blob.name.endswith("/output/metrics.json"):
            return json.loads(blob.download_as_bytes())
    return None


def preempter(tpu, done: threading.Event, preempted: list, rng: random.Random):
    """Preempt the node at a random moment of each stretch of training, PREEMPTIONS times."""
    while len(preempted) < PREEMPTIONS and not done.is_set():
        doc = metrics_doc()
        attempts = (doc or {}).get("attempts", [])
        node = tpu.nodes[2].get(NODE)
        # training again on a READY node since the last preemption: preempt it a random while later
        if node is not None and node.state.name == "READY" and len(attempts) == len(preempted) + 1 \
                and attempts[-1]["step"] > attempts[-1]["from"]:
            time.sleep(rng.uniform(0.5, EVERY * STEP_SECONDS * 2.5))
            if done.is_set():
                return
            tpu.set_state(2, NODE, "PREEMPTED")
            preempted.append(time.time())
        time.sleep(0.2)


def main():
    tmp = Path(tempfile.mkdtemp())
    tpu, compute, gcs, iam, hosts, index = start_fakes(tmp)
    job = tmp / "job"
    job.mkdir()
    (job / "train.py").write_text(JOB)
    (job / "tpuctl.toml").write_text('name = "walk"\ncommand = "python train.py"\n')
    want = baseline()
    t0 = time.time()
    r = tpuctl("up", "--type", "v3-8", "--zone", ZONE, "-c", NAME, "--runtime", "tpu-vm-tf-2.18.0-pjrt-v5p-and-below",
               "--recover", "--max-recoveries", str(PREEMPTIONS + 3), "--yes")
    assert r.returncode == 0, r.stderr
    assert tpuctl("watch", "-c", NAME, "--detach").returncode == 0
    preempted: list = []
    done = threading.Event()
    killer = threading.Thread(target=preempter, args=(tpu, done, preempted, random.Random(7)), daemon=True)
    killer.start()
    submitted = time.time()
    r = tpuctl("submit", str(job), "-c", NAME, timeout=1800)
    done.set()
    wall = time.time() - submitted
    log = r.stdout
    doc = metrics_doc() or {}
    status = json.loads(tpuctl("status", "-c", NAME, "--json").stdout)
    rows = json.loads(tpuctl("jobs", "-c", NAME, "--json").stdout)
    down = tpuctl("down", "-c", NAME, "--yes")
    time.sleep(1)
    left = [n for n in tpu.nodes[2]] + [q for q in tpu.queued] + [f"grant {m}" for b in gcs.granted.values()
                                                                  for _, m in b if m.startswith("serviceAccount:")]
    watch_log = (tmp / "home" / "watchers" / f"{NAME}.log").read_text()
    hosts.stop_all()
    for f in (tpu, compute, gcs, iam, index):
        f.stop()
    starts = [a["start"] for a in doc.get("attempts", [])][1:]
    gaps = [s - p for p, s in zip(preempted, starts)]
    final = [line for line in log.splitlines() if line.startswith("final loss")]
    got = float(final[-1].split()[-1]) if final else None
    print(f"submit exit {r.returncode}; {len(preempted)} preemptions; {log.count('run resumed on')} resumes in the log;"
          f" recoveries recorded: {len(status.get('recoveries', []))}")
    print(f"final loss {got!r} vs uninterrupted {want!r}: {'EXACT' if got == want else 'DIFFERENT'}")
    g = rows[-1] if rows else {}
    parts = g.get("goodput_parts") or {}
    print(f"run wall {wall:.1f} s (uninterrupted steps alone: {STEPS * STEP_SECONDS:.1f} s); goodput {g.get('goodput')}%"
          f" = productive {parts.get('productive_seconds')} s; wasted progress {parts.get('wasted_progress_seconds')} s"
          f" ({parts.get('steps_redone')} steps re-done); lost to preemption and re-provisioning "
          f"{parts.get('disruption_seconds')} s; other {parts.get('other_seconds')} s; `jobs` counts "
          f"{g.get('recoveries')} recoveries during the run")
    if gaps:
        print(f"preemption -> training again: median {statistics.median(gaps):.1f} s, max {max(gaps):.1f} s "
              f"({', '.join(f'{x:.1f}' for x in gaps)})")
    print(f"down exit {down.returncode}; left after down: {left or 'nothing'}; campaign {time.time() - t0:.0f} s")
    ok = r.returncode == 0 and got == want and len(preempted) >= PREEMPTIONS and not left and down.returncode == 0 \
        and log.count("run resumed on") >= PREEMPTIONS
    if not ok:
        print("FAILED\n--- submit stderr\n" + r.stderr[-3000:] + "\n--- watcher\n" + watch_log[-3000:])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
