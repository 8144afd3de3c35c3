"""Reliability campaign: `tpuctl up` (a TPU VM, a legacy node, or a Multislice queued request) killed with SIGKILL at a random moment, then `tpuctl down` from a fresh
process; after each round the fakes must hold no TPU, queued resource, VM, bucket or bucket grant. TPU and VM operations take DELAY
seconds, bucket grants take effect after IAM_DELAY, so kills land in every phase (before the bucket, between grant
and create, while the TPU is CREATING, between READY and the final record). Too long for the test suite.

    python bench/bench_faults.py [ROUNDS] [DELAY]
"""
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from fakes.compute_server import FakeCompute  # noqa: E402
from fakes.gcs import FakeGcs  # noqa: E402
from fakes.tpu_server import FakeTpu  # noqa: E402

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
DELAY = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
PROJECT = "bench-proj"


def tpuctl(*args, timeout=120):
    r = subprocess.run([sys.executable, "-m", "tpuctl", *args], capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return r.returncode, r.stderr


def leftovers(tpu, compute, gcs, bucket):
    from google.cloud import storage
    left = [f"TPU {n}" for v in (1, 2) for n in tpu.nodes[v]] + [f"VM {k[2]}" for k in compute.instances] \
        + [f"queued resource {n}" for n in tpu.queued]
    b = storage.Client(project=PROJECT).lookup_bucket(bucket)
    if b is not None:
        left.append(f"bucket {bucket}")
        members = {m for r in b.get_iam_policy(requested_policy_version=3).bindings for m in r["members"]}
        left += [f"grant to {m}" for m in members if m.startswith("serviceAccount:")]
    return left


def main():
    tpu, compute, gcs = FakeTpu(delay=DELAY), FakeCompute(delay=DELAY), FakeGcs()
    tpu.tpu_nodes_allowed = True   # the legacy node path, as for a project Google still lets make Nodes
    gcs.iam_delay = 0.5
    os.environ.update(TPU_EMULATOR_HOST=tpu.start(), COMPUTE_EMULATOR_HOST=compute.start(),
                      STORAGE_EMULATOR_HOST=gcs.start(), GOOGLE_CLOUD_PROJECT=PROJECT,
                      TPUCTL_HOME=tempfile.mkdtemp(), TPUCTL_CONFIG="/nonexistent", TPUCTL_POLL_INTERVAL="0.1",
                      TPUCTL_RETRY_BASE="0.05")
    rng = random.Random(7)
    held = 0
    phases = {}
    started = time.perf_counter()
    for i in range(ROUNDS):
        arch, tpu_type, zone = rng.choice([("vm", "v3-8", "us-central1-b"), ("node", "v2-8", "us-central1-b"),
                                           ("multislice", "v4-16", "us-central2-b")])
        name = f"k{i}"
        how = ["--arch", arch] if arch != "multislice" else ["--slices", "2", "--framework", "jax"]
        proc = subprocess.Popen([sys.executable, "-m", "tpuctl", "up", "--type", tpu_type, "--zone", zone, "-c", name,
                                 *how, "--yes"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.3, 2.5 + DELAY))           # imports take ~1 s; the TPU takes DELAY
        proc.send_signal(signal.SIGKILL)
        finished = proc.wait() == 0
        made = tpu.nodes[1] or tpu.nodes[2] or tpu.queued
        phase = "after up finished" if finished else ("TPU existed" if made else "before TPU")
        phases[arch, phase] = phases.get((arch, phase), 0) + 1
        code, err = tpuctl("down", "-c", name, "--yes", "--delete-bucket")
        if code == 3:                                        # killed before its state was saved: nothing made
            pass
        elif code != 0:
            print(f"round {i}: down exited {code}: {err.strip()[-300:]}")
        time.sleep(DELAY + 0.3)                              # let the fakes' delete operations finish
        left = leftovers(tpu, compute, gcs, f"{PROJECT}-tpuctl-{name}")
        if left:
            print(f"round {i} ({arch}, {phase}): LEFT {left}")
        else:
            held += 1
    wall = time.perf_counter() - started
    for f in (tpu, compute, gcs):
        f.stop()
    print(f"\nkills of `tpuctl up` (SIGKILL, random moment), then `down`: {ROUNDS} rounds in {wall:.0f} s")
    print("where the kills landed: " + ", ".join(f"{a} {p}: {v}" for (a, p), v in sorted(phases.items())))
    print(f"nothing left behind   : {held} of {ROUNDS}")


if __name__ == "__main__":
    main()
