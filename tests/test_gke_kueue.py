"""Runs on a team's Kueue cluster (issue 49 items 9 and 11): the JobSet carries the LocalQueue's label and the pods
the PriorityClass; Kueue (fakes/kueue.py, each behaviour with its source) holds a run its quota cannot cover, and
a higher priority evicts a lower one, which Kueue requeues and which resumes from its checkpoint."""
import time

from tpuctl.core import layout, runs
from tpuctl.providers.gke import manifest
from tpuctl.providers.gke.runs import GkeRuns

from conftest import until
from fakes.kueue import FakeKueue
from jobs import make_job
from test_gke_runs import _ended, _jobset, _pod_logs, _run_ids, cluster_store, gke  # noqa: F401 (fixture)

# Sleeps until its output holds a file named GO (the test writes it), then ends; a resumed attempt (its
# checkpoint in the outputs) says so and ends at once.
HOLD = """
import os, sys, time
from google.cloud import storage
out = os.environ["TPUCTL_OUTPUT_DIR"]
bucket, _, prefix = out[len("gs://"):].partition("/")
b = storage.Client().bucket(bucket)
ckpt = b.blob(prefix.rstrip("/") + "/ckpt")
if ckpt.exists():
    print("resumed from checkpoint", ckpt.download_as_text(), flush=True)
    sys.exit(0)
ckpt.upload_from_string("step-1")
print("started, checkpoint written", flush=True)
while not b.blob(prefix.rstrip("/") + "/GO").exists() and not os.environ.get("QUICK"):
    time.sleep(0.2)
"""


def _go(run_id):
    from google.cloud import storage
    from test_gke_runs import BUCKET
    storage.Client(project="test-proj").bucket(BUCKET).blob(f"{layout.run_output(run_id)}/GO").upload_from_string("")


def _submit(cli, tmp_path, name, *flags, toml=""):
    job = make_job(tmp_path, HOLD, 'framework = "jax"\n' + toml, name=name)
    code, out, err = cli("submit", str(job), "-c", "gk", "--detach", *flags)
    assert code == 0, err
    return out.strip(), err


def test_a_second_run_waits_in_the_queue_for_the_first(gke, cli, tmp_path):
    fake, cluster, make = gke
    kueue = FakeKueue(fake, cluster)
    make("gk", "v6e-4")
    kueue.install(chips=4)   # one run's worth of google.com/tpu
    first, err = _submit(cli, tmp_path, "first")
    assert "waits in queue lq, cluster gk's only one" in err
    until(lambda: runs.status(cluster_store(), first).state is runs.RunState.RUNNING, 120, "the first running")
    second, _ = _submit(cli, tmp_path, "second")
    js = _jobset(fake, second)
    assert js["metadata"]["labels"][manifest.QUEUE_LABEL] == "lq" and js["spec"]["suspend"] is True
    st = __import__("tpuctl.core.state", fromlist=["load"]).load("gk")
    said = until(lambda: GkeRuns().advance(st, cluster_store(), second) if "insufficient unused quota" in
                 GkeRuns().advance(st, cluster_store(), second) else "", 30, "Kueue's reason")
    assert "queued (Kueue: couldn't assign flavors to pod set slice: insufficient unused quota for " \
           "google.com/tpu in flavor tpu, 4 more needed)" in said
    status = runs.status(cluster_store(), second)
    assert status.state is runs.RunState.QUEUED and status.note.startswith("queued (Kueue: ")   # never "pending"
    code, out, err = cli("jobs", "-c", "gk")
    assert "queued (Kueue:" in out + err, out + err
    assert not [p for p, o in fake.objects.items() if "/pods/" in p and second.lower() in p]
    _go(first)
    _ended(fake, first, "Completed")
    until(lambda: not _jobset(fake, second)["spec"].get("suspend"), 30, "the second admitted")
    _go(second)
    _ended(fake, second, "Completed")
    assert runs.status(cluster_store(), second).state is runs.RunState.SUCCEEDED


def test_a_higher_priority_evicts_a_lower_one_which_resumes_from_its_checkpoint(gke, cli, tmp_path):
    fake, cluster, make = gke
    kueue = FakeKueue(fake, cluster)
    make("gk", "v6e-4")
    kueue.install(chips=4)
    low, _ = _submit(cli, tmp_path, "low", "--priority", "low", "--queue", "lq")
    until(lambda: cluster_store().read(f"{layout.run_output(low)}/ckpt"), 120, "the low run's checkpoint")
    pod = _jobset(fake, low)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "low"
    high, _ = _submit(cli, tmp_path, "high", "--priority", "high", toml='[env]\nQUICK = "1"\n')
    _ended(fake, high, "Completed")
    assert runs.status(cluster_store(), high).state is runs.RunState.SUCCEEDED
    _ended(fake, low, "Completed")
    wl = next(o for p, o in fake.objects.items() if p.endswith(f"/workloads/jobset-tpuctl-{low.lower()}"))
    assert [c["message"] for c in wl["status"]["conditions"] if c["type"] == "Evicted"] == ["Previously: Preempted"]
    final = until(lambda: (lambda s: s if s.state.final else None)(runs.status(cluster_store(), low)), 60, "final")
    assert final.state is runs.RunState.SUCCEEDED, final
    assert _jobset(fake, low)["status"]["restarts"] == 0   # requeued by Kueue, not a JobSet failure
    code, out, err = cli("logs", low, "-c", "gk")
    assert "resumed from checkpoint step-1" in out, out + err + _pod_logs(fake)


def test_cancel_of_a_queued_run_deletes_it_before_it_starts(gke, cli, tmp_path, monkeypatch):
    fake, cluster, make = gke
    kueue = FakeKueue(fake, cluster)
    make("gk", "v6e-4")
    kueue.install(chips=4)
    monkeypatch.setenv("TPUCTL_GKE_CANCEL_GRACE", "60")   # a queued run does not wait for agents it has none of
    first, _ = _submit(cli, tmp_path, "first")
    second, _ = _submit(cli, tmp_path, "second")
    until(lambda: any(c["type"] == "QuotaReserved" for w in [o for p, o in fake.objects.items() if "/workloads/" in p
                                                              and second.lower() in p]
                      for c in w["status"]["conditions"]), 30, "the second held by Kueue")
    t = time.monotonic()
    code, out, err = cli("cancel", second, "-c", "gk")
    assert code == 0, err
    assert time.monotonic() - t < 30 and _jobset(fake, second) is None
    assert runs.status(cluster_store(), second).state is runs.RunState.CANCELLED
    _go(first)
    _ended(fake, first, "Completed")


def test_a_queue_or_priority_the_cluster_lacks_is_refused_before_anything_is_made(gke, cli, tmp_path):
    fake, cluster, make = gke
    make("gk", "v6e-4")
    job = make_job(tmp_path, HOLD, 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "gk", "--queue", "lq")
    assert code == 2 and "the cluster runs no Kueue" in err
    FakeKueue(fake, cluster).install(chips=4)
    code, out, err = cli("submit", str(job), "-c", "gk", "--queue", "other")
    assert code == 2 and "no such LocalQueue" in err and "lq" in err
    code, out, err = cli("submit", str(job), "-c", "gk", "--priority", "urgent")
    assert code == 2 and "no such PriorityClass" in err and "very-high" in err
    assert _run_ids(fake) == []
