"""The JobSet of a GKE run: the fields issue 37 lists, valid against the pinned JobSet release's CRD schema (after
the API server's pruning) and, for its Job and pod template, against Kubernetes' own schemas; and `submit --dry-run
--provider gke --manifest FILE`, which writes it with no cluster or credentials."""
import copy
import functools
from pathlib import Path

import pytest
import yaml

from tpuctl.providers.gke import cordoning, dryrun, jobset_install, manifest, schema, tputypes

from jobs import make_job

KUBERNETES_VERSION = "1.34.0"   # GKE's TPU7x needs 1.34 (GKE_FACTS.md); the Job fields used are GA well before


@functools.lru_cache(maxsize=1)
def crd_schema():
    """The v1alpha2 openAPIV3Schema of the CRD in the release manifest tpuctl ships (jobset_install.py)."""
    found = schema.version_schema(jobset_install.release_crd(), "v1alpha2")
    assert found, "no v1alpha2 JobSet schema in the shipped release manifest"
    return found


def validate_jobset(js):
    import jsonschema
    lost = schema.dropped(js, crd_schema())
    assert not lost, f"fields the API server would drop: {lost}"
    jsonschema.Draft7Validator(crd_schema()).validate(js)


def validate_job_and_pod(js):
    """Each replicated job's template as the batch/v1 Job JobSet makes of it, through kubernetes-validate (which
    checks built-in kinds only, GKE_FACTS.md): strict, so an unknown field fails too."""
    import kubernetes_validate
    for rj in js["spec"]["replicatedJobs"]:
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x", **rj["template"].get("metadata", {})},
               "spec": rj["template"]["spec"]}
        kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": job["spec"]["template"]["spec"]}
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


def run(tpu_type="v6e-16", slices=1, max_restarts=3, policy=""):
    return manifest.RunObjects(cluster="c1", run_id="20261126-084500-123-ab12", shape=tputypes.shape(tpu_type),
                               slices=slices, max_restarts=max_restarts, image="python:3.12-slim-bookworm",
                               store_uri="gs://b", agent_version="1.2.3", workload_policy=policy)


@pytest.mark.parametrize("tpu_type,slices,policy", [
    ("v6e-16", 1, ""), ("v5litepod-16", 2, ""), ("tpu7x-16", 1, "wp"), ("v4-8", 1, ""), ("v5p-32", 3, ""),
    ("v6e-1", 1, ""), ("tpu7x-2", 1, "")])
def test_every_shape_validates_against_the_crd_and_kubernetes(tpu_type, slices, policy):
    js = manifest.build_jobset(run(tpu_type, slices, policy=policy))
    validate_jobset(js)
    validate_job_and_pod(js)
    # what the API server receives is the YAML we write: the round trip keeps every field
    assert yaml.safe_load(manifest.dump([js])) == js


def test_the_fields_issue_37_lists():
    shape = tputypes.shape("v5litepod-16")
    js = manifest.build_jobset(run("v5litepod-16", slices=2, max_restarts=5))
    (rj,) = js["spec"]["replicatedJobs"]
    job, pod = rj["template"]["spec"], rj["template"]["spec"]["template"]["spec"]
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and js["kind"] == "JobSet"
    assert rj["replicas"] == 2
    assert job["parallelism"] == job["completions"] == shape.hosts == 4 and job["backoffLimit"] == 0
    (rule,) = job["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["operator"] == "NotIn"
    assert rule["onExitCodes"]["values"] == [42, *range(127, 256)]
    assert rule["onExitCodes"]["containerName"] == pod["containers"][0]["name"]
    fp = js["spec"]["failurePolicy"]
    assert fp["maxRestarts"] == 5
    assert fp["rules"] == [{"name": "fail-on-exit-code", "action": "FailJobSet",
                            "onJobFailureReasons": ["PodFailurePolicy"]}]
    assert js["metadata"]["annotations"] == {"alpha.jobset.sigs.k8s.io/exclusive-topology":
                                             "cloud.google.com/gke-nodepool"}
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                                   "cloud.google.com/gke-tpu-topology": "4x4",
                                   "tpuctl-cluster": "c1"}   # the pools `up` made (issue 57 item 4)
    assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": "4"}
    assert {"key": "google.com/tpu", "operator": "Exists"} in pod["tolerations"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["restartPolicy"] == "Never"


def test_tpu7x_multi_host_selects_its_workload_policy_and_single_host_does_not():
    pod = manifest.build_jobset(run("tpu7x-16", policy="tpuctl-c1-wp"))["spec"]["replicatedJobs"][0]
    sel = pod["template"]["spec"]["template"]["spec"]["nodeSelector"]
    assert sel["cloud.google.com/placement-policy-name"] == "tpuctl-c1-wp"
    assert sel["cloud.google.com/gke-tpu-accelerator"] == "tpu7x"
    single = manifest.build_jobset(run("tpu7x-2"))["spec"]["replicatedJobs"][0]
    assert "cloud.google.com/placement-policy-name" not in single["template"]["spec"]["template"]["spec"]["nodeSelector"]


def test_a_field_the_crd_lacks_is_caught():
    js = manifest.build_jobset(run())
    bad = copy.deepcopy(js)
    bad["spec"]["failurePolicy"]["onExitCodes"] = [42]     # JobSet has no exit-code field (GKE_FACTS.md)
    with pytest.raises(AssertionError, match="onExitCodes"):
        validate_jobset(bad)
    bad = copy.deepcopy(js)
    bad["spec"]["replicatedJobs"][0]["replicas"] = "two"
    import jsonschema
    with pytest.raises(jsonschema.ValidationError):
        validate_jobset(bad)
    bad = copy.deepcopy(js)
    bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["hostNetwrk"] = True
    import kubernetes_validate
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_job_and_pod(bad)


def test_the_longest_pod_name_jobset_derives_fits_63_characters():
    # JobSet's webhook: GenPodName(jobset, rjob, maxJobIndex, maxPodIndex) + "-abcde" must be a DNS-1035 label
    # (pkg/webhooks/jobset_webhook.go v0.10.1).
    longest = f"{manifest.jobset_name('20261126-084500-123-ab12')}-{manifest.REPLICATED_JOB}-99-255-abcde"
    assert len(longest) <= 63


@pytest.mark.parametrize("slices,tpu_type,max_restarts,hint", [
    (0, "v6e-16", 0, "at least one slice"), (2, "v6e-1", 0, "single-host"), (1, "v6e-16", -1, "negative")])
def test_bad_shapes_are_refused(slices, tpu_type, max_restarts, hint):
    from tpuctl.core.errors import TpuctlError
    with pytest.raises(TpuctlError, match=hint):
        manifest.build_jobset(run(tpu_type, slices, max_restarts))


JAX = 'framework = "jax"\n'


def test_dry_run_writes_the_manifest_without_a_cluster(env, cli, tmp_path):
    job = make_job(tmp_path, "print('hi')\n", JAX)
    out_file = tmp_path / "run.yaml"
    code, out, err = cli("submit", str(job), "--dry-run", "--provider", "gke", "--type", "tpu7x-16",
                         "--max-restarts", "4", "--manifest", str(out_file))
    assert code == 0, err
    *rbac, js = list(yaml.safe_load_all(out_file.read_text()))
    assert js["spec"]["failurePolicy"]["maxRestarts"] == 4
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["cloud.google.com/placement-policy-name"] == dryrun.workload_policy_name("CLUSTER")
    validate_jobset(js)
    # what submit applies before the JobSet, in its order: the pods' account and its role to cordon their node
    assert rbac == [obj for _, obj in cordoning.objects(dryrun.NO_CLUSTER, "default")]
    assert pod["serviceAccountName"] == cordoning.account(dryrun.NO_CLUSTER) == rbac[0]["metadata"]["name"]
    assert "wrote 4 Kubernetes objects" in err and "nothing was uploaded" in err


@pytest.mark.parametrize("args,message", [
    (["--provider", "gke", "--manifest", "F"], "needs --type"),
    (["--type", "v6e-16", "--manifest", "F"], "--provider gke"),
    (["--provider", "gke", "--type", "v9-8", "--manifest", "F"], "unknown TPU type"),
    (["--provider", "gke", "--type", "v6e-16", "--slices", "0", "--manifest", "F"], "at least one slice"),
    (["--provider", "gke", "--type", "v6e-16", "--manifest", "/nonexistent/dir/F"], "--manifest"),
    # issue 52 item 7: values that would overflow the JobSet's int32 fields, and a type with a trailing newline
    (["--provider", "gke", "--type", "v6e-16", "--slices", "2147483648", "--manifest", "F"], "give 1 to 64"),
    (["--provider", "gke", "--type", "v6e-16", "--slices", "65", "--manifest", "F"], "give 1 to 64"),
    (["--provider", "gke", "--type", "v6e-16", "--max-restarts", "2147483648", "--manifest", "F"], "give 0 to 1000"),
    (["--provider", "gke", "--type", "v6e-16\n", "--manifest", "F"], "unknown TPU type"),
    (["--provider", "gke", "--type", "v6e-16", "--queue", "Bad Queue", "--manifest", "F"], "invalid --queue"),
    (["--provider", "gke", "--type", "v6e-16", "--priority", "-x", "--manifest", "F"], "invalid --priority"),
])
def test_bad_dry_run_flags_are_one_line_exit_2(env, cli, tmp_path, args, message):
    job = make_job(tmp_path, "print('hi')\n", JAX)
    args = [str(tmp_path / "F") if a == "F" else a for a in args]
    code, out, err = cli("submit", str(job), "--dry-run", *args)
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "F").exists()


@pytest.mark.parametrize("toml,says", [
    ("", "job job is TensorFlow"),
    ('framework = "keras"\nkeras_backend = "tensorflow"\n', "forces Keras's TensorFlow backend"),
    ('framework = "keras"\n[env]\nKERAS_BACKEND = "tensorflow"\n', "forces Keras's TensorFlow backend")])
def test_a_tensorflow_job_is_refused_by_the_dry_run_as_by_submit(env, cli, tmp_path, toml, says):
    # issue 49 item 3 / issue 52 item 7: no TensorFlow on GKE, so no manifest for one (a real submit refuses it too)
    job = make_job(tmp_path, "print('hi')\n", toml)
    code, out, err = cli("submit", str(job), "--dry-run", "--provider", "gke", "--type", "v6e-16", "--slices", "2",
                         "--manifest", str(tmp_path / "F"))
    assert code == 2 and says in err and "TensorFlow does not run on GKE" in err and "Traceback" not in err, err
    assert not (tmp_path / "F").exists()


def test_the_offline_dry_run_looks_up_no_local_cluster(env, cli, tmp_path):
    # issue 49 item 7: two clusters of another provider here, and one of them named default: neither is looked up,
    # and no cluster's name is stamped into the manifest
    from tpuctl.core import state
    from tpuctl.core.models import ClusterSpec, ClusterState, Phase, ProviderName
    for name in ("demo", "other"):
        state.save(ClusterState(spec=ClusterSpec(name=name, provider=ProviderName.LOCAL, store=str(tmp_path / name)),
                                phase=Phase.READY))
    job = make_job(tmp_path, "print('hi')\n", 'framework = "keras"\n')
    code, out, err = cli("submit", str(job), "--dry-run", "--provider", "gke", "--type", "v6e-16", "--manifest",
                         str(tmp_path / "run.yaml"))
    assert code == 0, err
    js = list(yaml.safe_load_all((tmp_path / "run.yaml").read_text()))[-1]
    assert js["metadata"]["labels"][manifest.LABEL_CLUSTER] == dryrun.NO_CLUSTER
    assert "demo" not in (tmp_path / "run.yaml").read_text()
    # what the pod runs, not what a TPU VM on a base runtime would install
    assert "pod      JAX" in out and "TPU VM on a base runtime" not in out


def test_the_manifest_to_stdout_and_kueue_labels_offline(env, cli, tmp_path, monkeypatch):
    # `--manifest -`: the YAML alone on stdout (for `| kubectl apply -f -`), no file named "-"; issue 49 item 10:
    # --queue and --priority shown offline
    monkeypatch.chdir(tmp_path)
    job = make_job(tmp_path, "print('hi')\n", JAX)
    code, out, err = cli("submit", str(job), "--dry-run", "--provider", "gke", "--type", "v6e-16", "--slices", "2",
                         "--queue", "multislice-queue", "--priority", "medium", "--manifest", "-")
    assert code == 0, err
    assert not (tmp_path / "-").exists()
    js = list(yaml.safe_load_all(out))[-1]
    assert js["metadata"]["labels"][manifest.QUEUE_LABEL] == "multislice-queue"
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "medium"
    assert "wrote 4 Kubernetes objects to stdout" in err and "pod      JAX" in err
    validate_jobset(js)
    validate_job_and_pod(js)


def test_manifest_flags_without_dry_run_are_refused(env, cli, tmp_path):
    job = make_job(tmp_path, "print('hi')\n")
    code, out, err = cli("submit", str(job), "--provider", "gke", "--type", "v6e-16", "--manifest",
                         str(tmp_path / "F"))
    assert code == 2 and "GKE dry run" in err


def test_the_shipped_release_is_the_pinned_one():
    assert Path(jobset_install.RELEASE_FILE).name == f"jobset-{jobset_install.JOBSET_VERSION}.yaml"


def test_dry_run_for_a_gke_cluster_uses_its_record(env, cli, tmp_path):
    from tpuctl.core import state
    from tpuctl.core.models import ClusterSpec, ClusterState, Phase, ProviderName
    state.save(ClusterState(spec=ClusterSpec(name="iw", provider=ProviderName.GKE, tpu_type="tpu7x-16", slices=2,
                                             store="gs://iw-bucket"), phase=Phase.READY,
                            record={"gke": {"tpu_type": "tpu7x-16", "slices": 2, "workload_policy": "tpuctl-iw-wp-1",
                                            "image": "us-docker.pkg.dev/p/r/img:1"}}))
    job = make_job(tmp_path, "print('hi')\n", JAX)
    out_file = tmp_path / "run.yaml"
    code, out, err = cli("submit", str(job), "-c", "iw", "--dry-run", "--manifest", str(out_file))
    assert code == 0, err
    js = list(yaml.safe_load_all(out_file.read_text()))[-1]
    rj = js["spec"]["replicatedJobs"][0]
    pod = rj["template"]["spec"]["template"]["spec"]
    assert rj["replicas"] == 2 and pod["nodeSelector"]["cloud.google.com/placement-policy-name"] == "tpuctl-iw-wp-1"
    assert pod["containers"][0]["image"] == "us-docker.pkg.dev/p/r/img:1"
    assert {"name": "TPUCTL_STORE", "value": "gs://iw-bucket"} in pod["containers"][0]["env"]
    validate_jobset(js)
    code, out, err = cli("submit", str(job), "-c", "iw", "--dry-run", "--slices", "3", "--manifest", str(out_file))
    assert code == 2 and "cluster iw has 2" in err
