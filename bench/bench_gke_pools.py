"""GKE node pools made at once (issue 49 item 8): `up --provider gke --slices N`'s compute step (the cluster, then
its N node pools, then JobSet: stood in for, instantly) against the GKE fake whose operations each take DELAY s.
The critical path is two operations (the cluster, then a node pool): the goal is N slices within 1.2x of one slice,
and the ratio to 2 x DELAY <= 1.3. The baseline row makes the same N pools one after another, as tpuctl did before,
in this same process. With `strict`, the fake runs one operation per cluster at a time (GKE's concurrent-operations
page allows that reading): the pools then queue, tpuctl waits out each refusal, and the time is N + 1 operations.

    python bench/bench_gke_pools.py [DELAY] [strict]
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from fakes.gke_server import FakeGke  # noqa: E402

DELAY = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
STRICT = "strict" in sys.argv[2:]
SLICES = 4


class Quiet:
    def info(self, message): pass
    def warn(self, message): pass
    def resource(self, kind, name, state, final=None): pass
    def transfer(self, total, verb="upload"): return lambda n: None


def main():
    gke = FakeGke(delay=DELAY)
    gke.one_op_per_cluster = STRICT
    os.environ.update(CONTAINER_EMULATOR_HOST=gke.start(), GOOGLE_CLOUD_PROJECT="bench-proj",
                      TPUCTL_HOME=tempfile.mkdtemp(), TPUCTL_CONFIG="/nonexistent", TPUCTL_POLL_INTERVAL="0.2")
    import google.cloud.container_v1  # noqa: F401  (imports paid before timing)
    from tpuctl.core.models import ClusterState
    from tpuctl.providers.base import UpFlags
    from tpuctl.providers.gke import compute, planning

    def up(name, slices, sequential=False):
        spec = planning.make_spec(name, UpFlags(tpu_type="v5litepod-16", zones=["us-west4-a"], slices=slices,
                                                project="bench-proj"))
        st = ClusterState(spec=spec, zone="us-west4-a")
        c = compute.GkeCompute(lambda project: "sa@bench", lambda rec: "found")
        saved = compute.together
        if sequential:   # the baseline: one pool after another
            compute.together = lambda calls: [call() for call in calls]
        t = time.perf_counter()
        try:
            c.ensure(st, Quiet())
        finally:
            compute.together = saved
        return time.perf_counter() - t

    one = up("b1", 1)
    many = up("b4", SLICES)
    seq = up("s4", SLICES, sequential=True)
    gke.stop()
    mode = "one operation per cluster" if STRICT else "pools at once (xpk's reading)"
    print(f"\nGKE fake: {DELAY:g} s per operation, {mode}")
    print(f"up compute, 1 slice       : {one:6.1f} s   ratio to cluster + pool (2 x {DELAY:g} s) "
          f"{one / (2 * DELAY):4.2f}")
    print(f"up compute, {SLICES} slices      : {many:6.1f} s   {many / one:.2f}x one slice (goal <= 1.2 at once)")
    print(f"one after another, {SLICES}    : {seq:6.1f} s   at once is {seq / many:.2f}x faster")


if __name__ == "__main__":
    main()
