"""`tpuctl up` wall time against its slowest resource, with the fake TPU and Compute APIs taking DELAY s per
operation (goal: ratio <= 1.3, measured after imports). Also runs the same resources one after another, the way a
script of gcloud commands would, as the baseline in this same process. The Multislice row: `up --slices 4` against
one slice through the same queued path (goal: within 1.2x). The Compute Engine rows (issue 48): `up --type v6e-16
--api compute`, a 4-host MIG, whose critical path is two dependent operations (the workload policy and the instance
template, then the MIG that names both), against 2 x DELAY (goal <= 1.3), and `--slices 2`, which takes no longer.

    python bench/bench_up.py [DELAY]
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from fakes.compute_server import FakeCompute  # noqa: E402
from fakes.gcs import FakeGcs  # noqa: E402
from fakes.tpu_server import FakeTpu  # noqa: E402

DELAY = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0


def run_cli(*args):
    from tpuctl.cli import main
    try:
        main(list(args))
    except SystemExit as e:
        if e.code:
            raise RuntimeError(f"tpuctl {' '.join(args)} exited {e.code}")


def main():
    tpu, compute, gcs = FakeTpu(delay=DELAY), FakeCompute(delay=DELAY), FakeGcs()
    tpu.tpu_nodes_allowed = True   # the legacy node path, as for a project Google still lets make Nodes
    os.environ.update(TPU_EMULATOR_HOST=tpu.start(), COMPUTE_EMULATOR_HOST=compute.start(),
                      STORAGE_EMULATOR_HOST=gcs.start(), GOOGLE_CLOUD_PROJECT="bench-proj",
                      TPUCTL_HOME=tempfile.mkdtemp(), TPUCTL_CONFIG="/nonexistent")
    # Imports are paid once, before timing (the goal is "after imports").
    import google.cloud.compute_v1, google.cloud.storage, google.cloud.tpu_v1, google.cloud.tpu_v2  # noqa: F401,E401
    import tpuctl.cli  # noqa: F401
    results = {}
    for arch, tpu_type in (("vm", "v3-8"), ("node", "v2-8")):
        t = time.perf_counter()
        run_cli("up", "--type", tpu_type, "--zone", "us-central1-b", "-c", f"b{arch}", "--arch", arch)
        results[arch] = time.perf_counter() - t
        run_cli("down", "-c", f"b{arch}", "--yes", "--delete-bucket")
    for name, slices in (("q1", []), ("q4", ["--slices", "4"])):
        t = time.perf_counter()
        run_cli("up", "--type", "v4-16", "--zone", "us-central2-b", "-c", name, "--queued", "--framework", "jax",
                "--yes", *slices)
        results[name] = time.perf_counter() - t
        run_cli("down", "-c", name, "--yes", "--delete-bucket")
    for name, slices in (("m1", []), ("m2", ["--slices", "2"])):
        t = time.perf_counter()
        run_cli("up", "--type", "v6e-16", "--api", "compute", "--zone", "us-east5-a", "-c", name, "--yes", *slices)
        results[name] = time.perf_counter() - t
        run_cli("down", "-c", name, "--yes", "--delete-bucket")

    # Baseline: the node architecture's resources created one after another (TPU, then VM).
    from tpuctl.core.models import Arch, ClusterSpec, ClusterState, ProviderName
    from tpuctl.providers.gcp.provider import GcpProvider
    p = GcpProvider()
    spec = ClusterSpec(name="seq", provider=ProviderName.GCP, project="bench-proj", tpu_type="v2-8",
                       zones=["us-central1-b"], arch=Arch.NODE, store="gs://bench-proj-seq", vm_type="n1-standard-2")
    st = ClusterState(spec=spec, zone="us-central1-b", runtime="2.12.0")
    t = time.perf_counter()
    p.ensure_store(spec, "us-central1", lambda s: None)
    p.topology._ensure_tpu(st, "", lambda s: None)
    p.topology._ensure_vm(st, "", lambda s: None)
    sequential = time.perf_counter() - t
    for f in (tpu, compute, gcs):
        f.stop()
    print(f"\nslowest resource        : {DELAY:6.1f} s (fake TPU and VM operations)")
    for arch, wall in ((a, results[a]) for a in ("vm", "node")):
        print(f"tpuctl up --arch {arch:<5}  : {wall:6.1f} s   ratio to slowest {wall / DELAY:4.2f} (goal <= 1.3)")
    print(f"up --queued, one slice  : {results['q1']:6.1f} s")
    print(f"up --queued --slices 4  : {results['q4']:6.1f} s   {results['q4'] / results['q1']:.2f}x one slice (goal <= 1.2)")
    for name, what in (("m1", "--api compute v6e-16   "), ("m2", "  ... --slices 2       ")):
        print(f"up {what}: {results[name]:6.1f} s   ratio to policy+template, then MIG (2 x {DELAY:g} s) "
              f"{results[name] / (2 * DELAY):4.2f} (goal <= 1.3)")
    print(f"sequential node baseline: {sequential:6.1f} s   tpuctl up --arch node is {sequential / results['node']:.2f}x faster")


if __name__ == "__main__":
    main()
