"""JobSet on the cluster (providers/gke/jobset_install.py), through the official `kubernetes` client against the
Kubernetes API fake: the shipped release applied server-side when the cluster lacks it, nothing applied when it is
there, an older one refused with the upgrade command."""
import copy

import pytest

from tpuctl.core.errors import TpuctlError
from tpuctl.providers.gke import jobset_install, kube, manifest, tputypes

from fakes.k8s_server import CRD_PREFIX, JOBSET_CRD, FakeKube


@pytest.fixture
def fake():
    k = FakeKube()
    yield k
    k.stop()


@pytest.fixture
def api(fake):
    return kube.connect(fake.url, "", "token")


def sample():
    return manifest.build_jobset(manifest.RunObjects(
        cluster="c1", run_id="20261126-084500-123-ab12", shape=tputypes.shape("v6e-16"), slices=1, max_restarts=0,
        image="python:3.12", store_uri="gs://b", agent_version="1.0"))


def test_a_cluster_without_jobset_gets_the_pinned_release(fake, api):
    assert kube.get(api, "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets") is None   # no CRD: 404
    said = []
    assert jobset_install.ensure_jobset(api, sample(), said.append) == "installed v0.10.1"
    assert said[0] == "installing JobSet v0.10.1"
    for obj in jobset_install.release_objects():
        assert jobset_install.path_of(obj) in fake.objects, obj["kind"]
    dep = fake.objects[jobset_install.CONTROLLER_PATH]
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"].endswith("jobset:v0.10.1")
    patches = [r for r in fake.requests if r[0] == "PATCH" and jobset_install.PROBE_NAME not in r[1]]
    assert len(patches) == len(jobset_install.release_objects())
    assert jobset_install.PROBE_NAME not in str(list(fake.objects))   # the admission probe was a dry run
    # now the JobSet collection is served, and a JobSet as tpuctl writes it is accepted
    kube.apply(api, f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{sample()['metadata']['name']}",
               sample())
    # again: found, nothing applied
    assert jobset_install.ensure_jobset(api, sample()) == "found v0.10.1"
    assert len([r for r in fake.requests if r[0] == "PATCH" and jobset_install.PROBE_NAME not in r[1]]) == \
        len(patches) + 1


def test_up_waits_until_jobset_admits_a_jobset(fake, api):
    # issue 49 item 2: JobSet's webhooks (failurePolicy Fail) serve only once its controller's certificates are
    # ready; before, ensure_jobset returned right after applying and the first submit was refused
    fake.controller_delay = 1.5
    said = []
    assert jobset_install.ensure_jobset(api, sample(), said.append) == "installed v0.10.1"
    assert "waiting for JobSet: its controller not yet Available" in said
    path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{sample()['metadata']['name']}"
    kube.apply(api, path, sample())   # the first JobSet after `up` is admitted


def test_a_jobset_controller_that_never_serves_is_a_timeout(fake, api, monkeypatch):
    fake.controller_delay = 3600
    monkeypatch.setenv("TPUCTL_GKE_JOBSET_READY_SECONDS", "1")
    with pytest.raises(TpuctlError) as e:
        jobset_install.ensure_jobset(api)
    assert "its controller not yet Available after 1s" in e.value.message and "jobset-system" in e.value.hint
    # and a JobSet meanwhile is refused as the API server refuses it while the webhook has no endpoint
    with pytest.raises(kube.KubeError) as refused:
        kube.apply(api, f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{sample()['metadata']['name']}",
                   sample())
    assert refused.value.status == 500 and jobset_install.webhook_down(refused.value)


def test_an_older_jobset_is_refused_with_the_upgrade_command(fake, api):
    jobset_install.ensure_jobset(api)
    dep = fake.objects[jobset_install.CONTROLLER_PATH]
    dep["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.k8s.io/jobset/jobset:v0.5.2"
    with pytest.raises(TpuctlError) as e:
        jobset_install.ensure_jobset(api, sample())
    assert "v0.5.2" in e.value.message and jobset_install.UPGRADE in e.value.hint
    assert "--server-side --force-conflicts" in e.value.hint and "v0.10.1/manifests.yaml" in e.value.hint


def test_a_jobset_of_unknown_version_whose_schema_lacks_a_field_is_refused(fake, api):
    # Installed some other way (no release Deployment), by a CRD before failurePolicy rules existed: the fields
    # tpuctl writes would be pruned away silently by the API server (xpk#443), so it is refused.
    crd = copy.deepcopy(jobset_install.release_crd())
    for v in crd["spec"]["versions"]:
        props = v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["failurePolicy"]["properties"]
        props.pop("rules")
    fake.applied(CRD_PREFIX + JOBSET_CRD, crd)   # Established, as the API server makes it
    fake.put(CRD_PREFIX + JOBSET_CRD, crd)
    with pytest.raises(TpuctlError) as e:
        jobset_install.ensure_jobset(api, sample())
    assert ".spec.failurePolicy.rules" in e.value.message and "upgrade it" in e.value.hint
    crd = copy.deepcopy(jobset_install.release_crd())
    fake.applied(CRD_PREFIX + JOBSET_CRD, crd)
    fake.put(CRD_PREFIX + JOBSET_CRD, crd)
    assert jobset_install.ensure_jobset(api, sample()) == "found JobSet (version unknown)"


def test_the_fake_refuses_an_apply_without_a_field_manager_and_an_invalid_jobset(fake, api):
    with pytest.raises(kube.KubeError) as e:
        kube.request(api, "PATCH", "/api/v1/namespaces/x", {"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": "x"}}, content_type=kube.APPLY)
    assert e.value.status == 400 and "field manager" in e.value.message
    jobset_install.ensure_jobset(api)
    bad = sample()
    bad["spec"]["replicatedJobs"][0]["replicas"] = "two"
    with pytest.raises(kube.KubeError) as e:
        kube.apply(api, f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{bad['metadata']['name']}", bad)
    assert e.value.status == 422 and e.value.reason == "Invalid"


def test_a_server_error_is_raised_not_taken_for_absence(fake, api):
    fake.faults.append(("GET", jobset_install.CRD_PATH, 503))
    with pytest.raises(kube.KubeError) as e:
        jobset_install.ensure_jobset(api)
    assert e.value.status == 503
    assert not [r for r in fake.requests if r[0] == "PATCH"]


def test_an_api_server_that_does_not_answer_is_one_clear_error():
    fake = FakeKube()
    url = fake.url
    fake.stop()   # nothing listens there now
    api = kube.connect(url, "", "")
    api.configuration.retries = 0
    with pytest.raises(TpuctlError) as e:
        kube.get(api, jobset_install.CRD_PATH)
    assert "did not answer" in e.value.message and "tpuctl status" in e.value.hint
