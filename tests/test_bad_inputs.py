"""Every bad input: exit code 2, one line plus a hint, no traceback, and not one mutating call."""
import pytest

BAD = [
    (["up", "--zone", "us-central1-b"], "--type is required"),
    (["up", "--type", "v3-9", "--zone", "us-central1-b"], "v3 has no size 9"),
    (["up", "--type", "tpu-v3", "--zone", "us-central1-b"], "unknown TPU type"),
    (["up", "--type", "v3-8", "--zone", "us-east1-d"], "not offered in us-east1-d"),
    (["up", "--type", "v3-8", "--zone", "uscentral1b"], "malformed zone"),
    (["up", "--type", "v3-8"], "no zone given"),
    (["up", "--type", "v5litepod-8", "--zone", "us-central1-a", "--arch", "node"], "never offered"),
    (["up", "--type", "v3-8", "--zone", "us-central1-b", "--arch", "pod"], "unknown --arch"),
    (["up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "Bad_Name"], "invalid cluster name"),
    (["up", "--type", "v3-8", "--zone", "us-central1-b", "--bucket", "My.Bucket"], "invalid bucket name"),
    (["up", "--type", "v3-8", "--zone", "us-central1-b", "--bucket", "google-data"], "contain 'google'"),
    (["up", "--type", "v3-8", "--zone", "us-central1-b", "--bucket", "ab"], "3-63 characters"),
    (["up", "--type", "v3-8", "--zone", "us-central1-b", "--project", "X"], "invalid project id"),
    (["up", "--type", "v3-8", "--zone", "us-central1-b", "--service-account", "nobody"], "invalid service account"),
    (["up", "--type", "v3-8", "--zone", "us-central1-b", "--provider", "aws"], "unknown provider"),
    (["up", "--type", "v2-8", "--zone", "us-central1-b", "--arch", "node", "--vm-type", "BIG"], "malformed machine"),
]


@pytest.mark.parametrize("args,expect", BAD, ids=[b[1] for b in BAD])
def test_bad_input_exits_2_with_hint_and_calls_nothing(cloud, cli, args, expect):
    code, out, err = cli(*args)
    assert code == 2, err
    assert expect in err
    assert "hint:" in err
    assert "Traceback" not in err
    assert cloud.mutating_calls() == []
    assert not cloud.compute.calls and not cloud.gcs.calls
    # one read-only question is allowed: does a zone the offline table does not list offer the type?
    assert [c[1] for c in cloud.tpu.calls] in ([], ["ListAcceleratorTypes"])


def test_missing_project_names_the_fix(env, cli, monkeypatch):
    monkeypatch.setattr("google.auth.default", lambda *a, **k: (_ for _ in ()).throw(
        __import__("google.auth.exceptions", fromlist=["x"]).DefaultCredentialsError("none")))
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b")
    assert code == 2
    assert "gcloud config set project" in err


def test_missing_credentials_names_the_fix(env, cli, monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "real-proj")
    from google.auth.exceptions import DefaultCredentialsError

    def no_creds(*a, **k):
        raise DefaultCredentialsError("none")
    monkeypatch.setattr("google.auth.default", no_creds)
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b")
    assert code == 5, err
    assert "gcloud auth application-default login" in err


def test_dry_run_makes_no_mutating_call(cloud, cli):
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "--dry-run")
    assert code == 0
    assert "$8.00/hour" in err and "nothing was created" in err
    assert cloud.mutating_calls() == []


def test_spot_price_in_plan(cloud, cli):
    code, out, err = cli("up", "--type", "v5litepod-4", "--zone", "us-west4-a", "--spot", "--dry-run")
    assert code == 0 and "$0.98/hour (spot)" in err


def test_status_of_unknown_cluster(env, cli):
    code, out, err = cli("status", "-c", "nope")   # the clusters there are, inline (none), and how to make one
    assert code == 3 and "none made yet" in err and "tpuctl up --provider local -c nope" in err


def test_a_zone_missing_from_the_table_is_asked_once_read_only(cloud, cli):
    # A zone newer than tpuctl's table: the TPU API decides, with one read-only call, before anything is made.
    cloud.tpu.accelerator_types["us-east1-z"] = ["v3-8"]
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-east1-z", "-c", "newzone", "--dry-run")
    assert code == 0, err
    assert [c[1] for c in cloud.tpu.calls] == ["ListAcceleratorTypes"]
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-east1-y", "-c", "newzone", "--dry-run")
    assert code == 2 and "not offered in us-east1-y" in err


def test_without_credentials_an_unlisted_zone_is_refused_offline(env, cli, monkeypatch):
    from google.auth.exceptions import DefaultCredentialsError

    def no_creds(*a, **k):
        raise DefaultCredentialsError("none")
    monkeypatch.setattr("google.auth.default", no_creds)
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-east1-d", "--project", "some-proj", "--dry-run")
    assert code == 2 and "not offered in us-east1-d" in err and "us-central1-a" in err
