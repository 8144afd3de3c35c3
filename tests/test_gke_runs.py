"""GKE runs end to end against fakes: the CLI's submit -> logs -> succeeded -> download on a GKE cluster whose
record (the gke-contract's `gke` dict) is written straight into local state, the JobSet made through the official
`kubernetes` client on the Kubernetes API fake, its pods run by the fake kubelet as local processes, each running the
pod's real command: tpuctl's agent wheel fetched from the bucket (the fake GCS) and pip-installed into the pod's own
image, then `python -m tpuctl.agent --run`. Also: a restart on exit 42, a failure on exit 1, cancel deleting the
JobSet, and a pod whose agent never started read through pods/log."""
import os
import sysconfig
import time
import venv
from pathlib import Path

import pytest

from tpuctl.core import layout, runs, state
from tpuctl.core.models import ClusterSpec, ClusterState, Framework, HostFacts, Phase, ProviderName, cluster_record
from tpuctl.providers import agent_package
from tpuctl.providers.gke import jobset_install, kube, tputypes

from conftest import until
from fakes.k8s_cluster import FakeCluster
from fakes.k8s_server import FakeKube, write_kubeconfig
from jobs import make_job

BUCKET = "tpuctl-gke-test"

JOB = """
import os, sys
print("hello from slice", os.environ.get("MEGASCALE_SLICE_ID", "?"), "worker", os.environ.get("TPUCTL_WORKER", "?"))
out = os.environ["TPUCTL_OUTPUT_DIR"]
print("restarts so far:", os.environ.get("TPUCTL_RESTARTS"))
if os.environ.get("WRITE"):   # the output dir is gs://: written as a job's checkpoint would be
    from google.cloud import storage
    bucket, _, prefix = out[len("gs://"):].partition("/")
    storage.Client().bucket(bucket).blob(prefix.rstrip("/") + "/model.txt").upload_from_string("weights")
want = os.environ.get("EXIT", "0")
if want == "42-once" and os.environ.get("TPUCTL_RESTARTS") == "0":
    print("asking for a restart"); sys.exit(42)
sys.exit(0 if want == "42-once" else int(want))
"""


_IMAGE_SITE: list[Path] = []


def _image_site() -> Path:
    """The pods' image's packages, made once per test process: pip (python:3.12-slim has it) and what the pod
    script would install, google-cloud-storage with its dependencies, linked from this environment's site; not its
    ~180 other distributions, which no pod image holds and every pip run in a pod would read."""
    if not _IMAGE_SITE:
        import atexit
        import shutil
        import tempfile
        from importlib.metadata import distribution
        from packaging.requirements import Requirement
        site = Path(tempfile.mkdtemp(prefix="gke-pod-image-"))
        atexit.register(shutil.rmtree, site, True)
        purelib, seen, wanted = Path(sysconfig.get_paths()["purelib"]), set(), ["pip", "google-cloud-storage"]
        while wanted:
            dist = distribution(wanted.pop())
            if dist.metadata["Name"].lower() in seen:
                continue
            seen.add(dist.metadata["Name"].lower())
            wanted += [r.name for r in map(Requirement, dist.requires or []) if r.marker is None
                       or r.marker.evaluate({"extra": ""})]
            for top in {f.parts[0] for f in dist.files or [] if ".." not in f.parts}:
                if (purelib / top).exists() and not (site / top).exists():
                    (site / top).symlink_to(purelib / top)
        _IMAGE_SITE.append(site)
    return _IMAGE_SITE[0]


def _image(root):
    """A pod's image: a python with pip and the packages of _image_site (visible through a .pth, as an image's own
    site-packages would hold them), but tpuctl only as the pod installs it from the bucket."""
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(root)
    site = next((root / "lib").glob("python3*/site-packages"))
    (site / "_image.pth").write_text(f"import site; site.addsitedir({str(_image_site())!r})\n")
    # Its pip reports no conflicts among what is installed (the image's own pip.conf: pip reads sys.prefix/pip.conf,
    # and a store_false option such as --no-warn-conflicts is turned on by "false" in a configuration file, pip's
    # docs "Configuration"): this environment's ~180 distributions, which no pod image holds, would otherwise have
    # every pip run in every pod parse all their requirements for a report no test reads (a second of CPU a pod).
    (root / "pip.conf").write_text("[install]\nno-warn-conflicts = false\n")
    return str(root / "bin" / "python")


@pytest.fixture
def gke(cloud, env, tmp_path, monkeypatch):
    from google.cloud import storage
    storage.Client(project="test-proj").create_bucket(BUCKET)
    store_uri = f"gs://{BUCKET}"
    fake = FakeKube()
    image_env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "podhome"), "TMPDIR": str(tmp_path / "podtmp"),
                 "STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"], "PIP_NO_INDEX": "1",
                 "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                 "TPUCTL_LOG_FLUSH_SECONDS": "0.1", "TPUCTL_STOP_GRACE": "2", "GOOGLE_CLOUD_PROJECT": "test-proj"}
    os.makedirs(image_env["TMPDIR"])
    cluster = FakeCluster(fake, image_env, image=lambda pod: {"TPUCTL_PYTHON": _image(tmp_path / "images" / pod)})
    monkeypatch.setenv("CONTAINER_EMULATOR_HOST", "fake")   # anonymous to the Kubernetes API (clients.access_token)
    monkeypatch.setattr(kube, "_CLIENTS", {})   # kube.py keeps one client per endpoint and process: none of another's
    monkeypatch.setenv("TPUCTL_GKE_POLL_SECONDS", "0")
    monkeypatch.setenv("TPUCTL_GKE_CANCEL_GRACE", "3")
    monkeypatch.setenv("TPUCTL_LOG_POLL_MAX", "0.2")
    # The GKE API's side (clusters, node pools) is the other issue-37 half's fake (gke_server.py): here the node
    # pools are the Kubernetes fake's nodes, and the provider's look at the GKE API is answered "all present".
    from tpuctl.providers.gke.provider import GkeProvider
    monkeypatch.setattr(GkeProvider, "_missing", lambda self, st: [])

    def make(name, tpu_type, slices=1, own=True):
        """`own=False`: node pools as a tpuctl before issue 57 made them, with no label or taint of its own."""
        shape = tputypes.shape(tpu_type)
        for k in range(slices):
            cluster.add_node_pool(f"tpuctl-{name}-np-{k}", shape.hosts, {
                "cloud.google.com/gke-tpu-accelerator": shape.accelerator,
                "cloud.google.com/gke-tpu-topology": shape.topology, **({"tpuctl-cluster": name} if own else {})},
                [{"key": "tpuctl-cluster", "value": name, "effect": "NoSchedule"}] if own else [])   # as `up` does
        jobset_install.ensure_jobset(kube.connect(fake.url, "", ""))
        spec = ClusterSpec(name=name, provider=ProviderName.GKE, tpu_type=tpu_type, store=store_uri,
                           slices=slices, framework=Framework.JAX, project="test-proj", zones=["us-central1-a"])
        st = ClusterState(spec=spec, zone="us-central1-a", phase=Phase.READY, host=HostFacts(hosts=shape.hosts),
                          record={"gke": {"project": "test-proj", "location": "us-central1", "cluster": f"tpuctl-{name}",
                                          "adopted": False, "endpoint": fake.url, "ca_certificate": "",
                                          "node_pools": [f"tpuctl-{name}-np-{k}" for k in range(slices)],
                                          "workload_policy": "", "service_account": "", "image": "",
                                          "slices": slices, "tpu_type": tpu_type}})
        st.compute_started(time.time())
        state.save(st)
        b = storage.Client(project="test-proj").bucket(BUCKET)
        b.blob(agent_package.key()).upload_from_string(agent_package.build())
        b.blob(layout.CLUSTER_RECORD).upload_from_string(__import__("json").dumps(cluster_record(st, "")))
        return st
    yield fake, cluster, make
    cluster.stop()
    fake.stop()


def _jobsets(fake):
    return [p for p in fake.objects if "/jobsets/" in p]


def _run_ids(fake):
    return [p.rsplit("/", 1)[1][len("tpuctl-"):] for p in _jobsets(fake)]


def _jobset(fake, run_id):
    return fake.objects.get(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/tpuctl-{run_id}")


def _ended(fake, run_id, kind):
    return until(lambda: any(c["type"] == kind for c in (_jobset(fake, run_id) or {}).get("status", {})
                             .get("conditions", [])), 90, f"JobSet {kind}")


def _pod_logs(fake):
    return "".join(f"--- {p}\n{b.decode(errors='replace')}" for p, b in fake.logs.items())


def test_one_slice_runs_to_success_and_downloads(gke, cli, tmp_path):
    fake, cluster, make = gke
    make("g1", "v6e-1")
    job = make_job(tmp_path, JOB, 'framework = "jax"\n[env]\nWRITE = "1"\n')
    code, out, err = cli("submit", str(job), "-c", "g1")
    assert code == 0, err + _pod_logs(fake)
    assert "hello from slice" in out
    (run_id,) = _run_ids(fake)
    _ended(fake, run_id, "Completed")
    js = _jobset(fake, run_id)
    pod = next(o for p, o in fake.objects.items() if "/pods/" in p)
    assert pod["spec"]["nodeName"] == "gke-tpuctl-g1-np-0-0"    # scheduled by the node selectors
    assert runs.status(cluster_store(), run_id).state is runs.RunState.SUCCEEDED
    code, out, err = cli("download", run_id, "-c", "g1", "-o", str(tmp_path / "dl"))
    assert code == 0, err
    assert (tmp_path / "dl" / "model.txt").exists(), (out, err, list((tmp_path / "dl").rglob("*")))
    assert (tmp_path / "dl" / "model.txt").read_text() == "weights"
    assert js["spec"]["failurePolicy"]["maxRestarts"] == 5   # GKE's default (runs.DEFAULT_RESTARTS)
    # `status` shows the cluster's JobSets; `down` deletes them (an adopted cluster outlives down)
    from tpuctl.providers.gke.runs import GkeRuns
    st = state.load("g1")
    (row,) = GkeRuns().describe(st).values()
    assert row["state"] == "Completed" and row["restarts"] == 0
    assert row["pods"].endswith("Succeeded@gke-tpuctl-g1-np-0-0"), row
    said = []
    GkeRuns().delete_all(st, said.append)
    assert _jobsets(fake) == [] and said == [f"JobSet tpuctl-{run_id} deleted"]
    assert GkeRuns().describe(st) == {}


def cluster_store():
    from tpuctl.providers.google.gcs_store import GcsStore
    return GcsStore(f"gs://{BUCKET}", "test-proj")


def test_two_slices_run_on_every_host_of_both(gke, cli, tmp_path):
    fake, cluster, make = gke
    name = "g2" + "x" * 22   # the longest cluster name tpuctl takes (core/models.check_cluster_name: 24)
    make(name, "v6e-8", slices=2)   # two hosts a slice: 4 pods, one per node of two node pools
    job = make_job(tmp_path, MEGASCALE_JOB, 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", name)
    assert code == 0, err + _pod_logs(fake)
    (run_id,) = _run_ids(fake)
    assert len(run_id) == 24   # a real run id's length: the names and labels JobSet derives from it are valid
    _ended(fake, run_id, "Completed")
    assert cluster.refused == {}
    pods = [o for p, o in fake.objects.items() if "/pods/" in p]
    assert len(pods) == 4 and {p["spec"]["nodeName"] for p in pods} == {
        f"gke-tpuctl-{name}-np-{k}-{i}" for k in (0, 1) for i in (0, 1)}
    store = cluster_store()
    assert all(runs.status(store, run_id, w).state is runs.RunState.SUCCEEDED for w in range(4))
    # Each host's job sees the Multislice environment JobSet's annotations give (issue 49 item 1): slice 0's worker
    # 0 by its stable DNS name, never the agent's ":8081" from a record that has no host ip.
    prefix = f"{layout.run_output(run_id)}/env-"
    seen = {k[len(prefix):]: __import__("json").loads(store.read(k)) for k, _ in store.list(prefix)}
    coordinator = f"tpuctl-{run_id.lower()}-slice-0-0.tpuctl-{run_id.lower()}"
    (first,) = [p for p in pods if p["metadata"]["annotations"]["jobset.sigs.k8s.io/job-index"] == "0"
                and p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "0"]
    assert coordinator == f"{first['spec']['hostname']}.{first['spec']['subdomain']}"   # its DNS name
    assert seen == {f"{k}-{w}": {"MEGASCALE_COORDINATOR_ADDRESS": coordinator, "MEGASCALE_NUM_SLICES": "2",
                                 "MEGASCALE_SLICE_ID": str(k), "MEGASCALE_PORT": None}
                    for k in (0, 1) for w in (0, 1)}, seen


MEGASCALE_JOB = """
import json, os
from google.cloud import storage
out = os.environ["TPUCTL_OUTPUT_DIR"]
bucket, _, prefix = out[len("gs://"):].partition("/")
env = {k: os.environ.get(k) for k in ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID",
                                      "MEGASCALE_PORT")}
name = f"env-{os.environ['MEGASCALE_SLICE_ID']}-{int(os.environ['TPUCTL_WORKER']) % 2}"
storage.Client().bucket(bucket).blob(prefix.rstrip("/") + "/" + name).upload_from_string(json.dumps(env))
"""


def test_a_tensorflow_job_is_refused_before_anything_is_made(gke, cli, tmp_path):
    # issue 49 item 3: a TensorFlow job (no `framework`: tpuctl.toml's default) on GKE, said in one line
    fake, cluster, make = gke
    make("gtf", "v6e-1")
    code, out, err = cli("submit", str(make_job(tmp_path, JOB)), "-c", "gtf")
    assert code == 2 and "TensorFlow does not run on GKE" in err and "Traceback" not in err, err
    assert _jobsets(fake) == [] and not list(cluster_store().list(layout.OUTPUTS_PREFIX))


def test_an_agent_package_late_in_the_store_is_waited_for_not_a_failed_run(gke, cli, tmp_path):
    # issue 49 item 4: the pod's installs are retried as the TPU VM's start-up script retries them; before, the
    # first failed download exited 1, which the pod failure policy turns into FailJob and FailJobSet
    from google.cloud import storage
    fake, cluster, make = gke
    make("gpip", "v6e-1")
    blob = storage.Client(project="test-proj").bucket(BUCKET).blob(agent_package.key())
    wheel = blob.download_as_bytes()
    blob.delete()
    code, out, err = cli("submit", str(make_job(tmp_path, JOB, 'framework = "jax"\n')), "-c", "gpip", "--detach")
    assert code == 0, err
    run_id = out.strip()
    until(lambda: b"the agent package in the store failed" in b"".join(fake.logs.values()), 60, "a failed fetch")
    blob.upload_from_string(wheel)
    _ended(fake, run_id, "Completed")
    assert runs.status(cluster_store(), run_id).state is runs.RunState.SUCCEEDED
    assert _jobset(fake, run_id)["status"]["restarts"] == 0


def test_a_submit_while_jobsets_webhooks_do_not_serve_waits_for_them(gke, cli, tmp_path):
    # issue 49 item 2: JobSet's controller restarting (its webhooks, failurePolicy Fail, have no endpoint): the
    # API server refuses every JobSet with "failed calling webhook"; dispatch retries within the deadline
    from fakes.k8s_server import CONTROLLER
    fake, cluster, make = gke
    make("gwh", "v6e-1")
    dep = fake.objects[CONTROLLER]
    serving = dep["status"]
    dep["status"] = {"conditions": [{"type": "Available", "status": "False"}]}
    fake.later(3, lambda: dep.update(status=serving))
    code, out, err = cli("submit", str(make_job(tmp_path, JOB, 'framework = "jax"\n')), "-c", "gwh")
    assert code == 0, err + _pod_logs(fake)
    assert "waiting for JobSet's webhooks" in err + out
    refused = [r for r in fake.requests if r[0] == "PATCH" and "/jobsets/tpuctl-" in r[1]]
    assert len(refused) >= 2   # refused at least once, then created


def test_a_disrupted_pod_restarts_the_run_by_default(gke, cli, tmp_path):
    # issue 49 item 5: a pod killed from outside (137, as an eviction or a node going away) restarts the run under
    # the GKE default of --max-restarts; before, the default 0 ended the run with ReachedMaxRestarts
    fake, cluster, make = gke
    make("gdis", "v6e-1")
    body = ("import os, sys, time\nprint('attempt', os.environ.get('TPUCTL_RESTARTS'), flush=True)\n"
            "if os.environ.get('TPUCTL_RESTARTS') == '0':\n    time.sleep(300)\n")
    code, out, err = cli("submit", str(make_job(tmp_path, body, 'framework = "jax"\n')), "-c", "gdis", "--detach")
    assert code == 0, err
    run_id = out.strip()
    until(lambda: runs.status(cluster_store(), run_id).state is runs.RunState.RUNNING, 120, "the job running")
    (path,) = [p for p in cluster.procs if "/pods/" in p]
    os.killpg(cluster.procs[path].pid, 9)   # the whole container, as a node that goes away takes it
    _ended(fake, run_id, "Completed")
    js = _jobset(fake, run_id)
    assert js["spec"]["failurePolicy"]["maxRestarts"] == 5 and js["status"]["restarts"] == 1
    until(lambda: runs.status(cluster_store(), run_id).state is runs.RunState.SUCCEEDED, 30, "the run succeeded")


def test_a_pod_that_cannot_pull_its_image_or_be_scheduled_is_said_not_pending(gke, cli, tmp_path, monkeypatch):
    # issue 49 item 4: `jobs` and `status` say what keeps the pods Pending, where, and the fix
    fake, cluster, make = gke
    monkeypatch.setenv("TPUCTL_GKE_STUCK_SECONDS", "0")   # said at once (test_gke_stuck.py: the threshold)
    st = make("gimg", "v6e-1")
    st.record["gke"]["image"] = "registry.example/team/none:1"
    state.save(st)
    cluster.unpullable.add("registry.example/team/none:1")
    code, out, err = cli("submit", str(make_job(tmp_path, JOB, 'framework = "jax"\n')), "-c", "gimg", "--detach")
    assert code == 0, err
    run_id = out.strip()
    said = until(lambda: (lambda o: o if "cannot pull image" in o else "")("".join(cli("jobs", "-c", "gimg")[1:])),
                 30, "jobs saying the image")
    assert "stuck for 0 min: cannot pull image registry.example/team/none:1 (ImagePullBackOff" in \
        " ".join(said.split()), said
    assert "cannot pull image" in runs.status(cluster_store(), run_id).note
    code, out, err = cli("cancel", run_id, "-c", "gimg")
    assert code == 0, err
    # no node fits (the node pool gone): unschedulable, said with the fix
    st.record["gke"]["image"] = ""
    state.save(st)
    for p in [p for p in fake.objects if "/nodes/" in p]:
        fake.objects.pop(p)
    code, out, err = cli("submit", str(make_job(tmp_path, JOB, 'framework = "jax"\n', name="j2")), "-c", "gimg",
                         "--detach")
    assert code == 0, err
    said = until(lambda: (lambda o: o if "unschedulable" in o else "")("".join(cli("jobs", "-c", "gimg")[1:])),
                 30, "jobs saying unschedulable")
    assert "tpuctl status" in said


def test_exit_42_restarts_the_jobset_and_exit_1_fails_it(gke, cli, tmp_path):
    fake, cluster, make = gke
    make("g3", "v6e-1")
    job = make_job(tmp_path, JOB, 'framework = "jax"\n[env]\nEXIT = "42-once"\n', name="again")
    code, out, err = cli("submit", str(job), "-c", "g3", "--max-restarts", "2")
    assert code == 0, err + _pod_logs(fake)
    (run_id,) = _run_ids(fake)
    _ended(fake, run_id, "Completed")
    assert _jobset(fake, run_id)["status"]["restarts"] == 1
    assert "asking for a restart" in out and "the JobSet restarts the run" in out
    assert "restarts so far: 1" in out
    job = make_job(tmp_path, JOB, 'framework = "jax"\n[env]\nEXIT = "1"\n', name="fails")
    code, out, err = cli("submit", str(job), "-c", "g3", "--max-restarts", "2")
    assert code == 1, err
    (failed,) = [r for r in _run_ids(fake) if r != run_id]
    _ended(fake, failed, "Failed")
    js = _jobset(fake, failed)
    assert js["status"]["restarts"] == 0
    assert js["status"]["conditions"][-1]["reason"] == "FailJobSetFailurePolicyAction"


def test_cancel_deletes_the_jobset_after_the_agents_grace(gke, cli, tmp_path):
    fake, cluster, make = gke
    make("g4", "v6e-1")
    job = make_job(tmp_path, "import time\nprint('started', flush=True)\ntime.sleep(300)\n", 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "g4", "--detach")
    assert code == 0, err
    run_id = out.strip()
    until(lambda: b"started" in b"".join(fake.logs.values()) or
          runs.status(cluster_store(), run_id).state is runs.RunState.RUNNING, 120, "the job running")
    code, out, err = cli("cancel", run_id, "-c", "g4")
    assert code == 0, err
    assert _jobset(fake, run_id) is None
    assert not [p for p in fake.objects if "/pods/" in p or "/jobs/" in p]
    st = runs.status(cluster_store(), run_id)
    assert st.state is runs.RunState.CANCELLED and st.host != "gke", st   # the agent ended it, in its grace


def test_a_pod_whose_agent_never_started_shows_its_own_log(gke, cli, tmp_path):
    fake, cluster, make = gke
    make("g5", "v6e-1")
    cluster.image = lambda pod: {"TPUCTL_PYTHON": "/nonexistent/python3"}   # an image without the python it needs
    job = make_job(tmp_path, JOB, 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "g5")
    assert code != 0
    (run_id,) = _run_ids(fake)
    assert _jobset(fake, run_id)["status"]["conditions"][-1]["type"] == "Failed"
    assert "without the agent reporting the run's end" in out and "/nonexistent/python3" in out, out + err
    code, out, err = cli("logs", run_id, "-c", "g5")
    assert "pod tpuctl-" in out


def test_the_run_in_words_names_conditions_restarts_phases_and_nodes():
    from tpuctl.providers.gke.jobset_status import words
    js = {"metadata": {"name": "tpuctl-x"}, "spec": {"failurePolicy": {"maxRestarts": 3}},
          "status": {"restarts": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "ReachedMaxRestarts"}]}}
    pods = [{"spec": {"nodeName": f"gke-np-{i}"}, "status": {"phase": ph}} for i, ph in enumerate(["Failed", "Running"])]
    assert words(js, pods) == ("JobSet tpuctl-x failed (ReachedMaxRestarts), restarts 1 of 3; "
                               "pods: 1 Failed, 1 Running on gke-np-0, gke-np-1")
    assert words({"metadata": {"name": "tpuctl-y"}, "spec": {}}, []) == \
        "JobSet tpuctl-y running, restarts 0 of 0; pods: none yet"


def test_a_kubeconfig_context_reaches_the_cluster(tmp_path, monkeypatch):
    fake = FakeKube()
    try:
        cfg = tmp_path / "kubeconfig"
        write_kubeconfig(cfg, fake.url)
        monkeypatch.setenv("KUBECONFIG", str(cfg))
        api = kube.connect_context("mine")
        assert kube.get(api, jobset_install.CRD_PATH) is None and fake.requests[-1] == ("GET", jobset_install.CRD_PATH)
        from tpuctl.core.errors import TpuctlError
        with pytest.raises(TpuctlError, match="kubeconfig context 'nosuch'"):
            kube.connect_context("nosuch")
    finally:
        fake.stop()


def test_one_client_per_cluster_whose_token_is_refreshed_and_whose_ca_stays_in_memory(tmp_path, monkeypatch):
    # issue 49 item 8: before, each 5-second poll made a new client and wrote the CA to a new temp file
    import base64
    import tempfile
    fake = FakeKube()
    monkeypatch.setattr(kube, "_CLIENTS", {})
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        tokens = iter(["t1", "t2", "t3", "t4"])
        rec = {"endpoint": fake.url, "ca_certificate": base64.b64encode(b"-----BEGIN CERTIFICATE-----").decode()}
        api = kube.for_record(rec, lambda: next(tokens))
        assert kube.for_record(rec, lambda: "unused") is api
        assert api.configuration.ca_cert_data == "-----BEGIN CERTIFICATE-----" and list(tmp_path.iterdir()) == []
        kube.get(api, jobset_install.CRD_PATH)
        assert api.configuration.api_key == {"BearerToken": "t2"}   # asked again before the request
    finally:
        fake.stop()


def test_max_restarts_is_refused_where_the_service_does_not_restart(env, cli, tmp_path):
    # RemoteRuns.restarts: GKE's JobSet restarts (the tests above); a Kaggle session chains by CONTINUE_CODE instead
    st = ClusterState(spec=ClusterSpec(name="kg", provider=ProviderName.KAGGLE, tpu_type="v5e-8",
                                       store=str(tmp_path / "kstore")), phase=Phase.READY)
    state.save(st)
    code, out, err = cli("submit", str(make_job(tmp_path, JOB)), "-c", "kg", "--max-restarts", "1")
    assert code == 2 and "service's sessions" in err, err
