"""Hints that point the right way (issue 63, item 5): each from a fresh HOME, one error line, one hint, the right
exit code, never "internal error"."""
import pytest

from jobs import make_job
from test_own_mistakes import said_once


def test_after_a_failed_cloud_up_the_hint_names_the_cloud_not_the_local_provider(env, cli):
    code, out, err = cli("up", "-c", "cl", "--type", "v5litepod-8", "--zone", "us-central1-a", "--project",
                         "proj-one", "--yes")
    assert code != 0 and "credentials" in err, err     # no credentials here: it fails before anything is made
    flat = said_once(*cli("status", "-c", "cl")[::2], 3, "no cluster named 'cl'", "tpuctl up --type")
    assert "--provider local" not in flat


def test_a_cluster_taken_down_is_no_ones_default_nor_suggested(local_up, cli):
    local_up("live")
    local_up("gone")
    assert cli("down", "-c", "gone", "--yes")[0] == 0
    code, out, err = cli("status")
    assert code == 0 and "using cluster live, the only one here not down" in err, err
    flat = said_once(*cli("status", "-c", "nosuch")[::2], 3, "clusters here: gone (down), live", "-c live to use it")
    assert "-c gone" not in flat


def test_a_unique_run_id_needs_no_cluster(local_up, cli, tmp_path):
    local_up("one")
    local_up("two")
    code, out, err = cli("submit", str(make_job(tmp_path, "print('on two')\n")), "-c", "two", "--detach")
    run_id = out.strip()
    assert code == 0, err
    for args in (["logs", run_id], ["logs", run_id[-4:]]):
        code, out, err = cli(*args, "-f")
        assert code == 0 and out == "on two\n" and f"is on cluster two" in err, err
    said_once(*cli("logs", "20200101-000000-000-abcd")[::2], 2, "no -c, and 2 clusters here")


def test_an_existing_clusters_name_with_other_flags_says_so(local_up, cli):
    local_up("mine")
    said_once(*cli("up", "-c", "mine", "--type", "v5litepod-8", "--zone", "us-central1-a")[::2], 2,
              "cluster mine already exists (provider local)", "--type, --zone do not apply", "-c OTHER",
              "tpuctl down -c mine")
    for dry in ([], ["--dry-run"]):
        said_once(*cli("up", "-c", "mine", "--provider", "gcp", "--type", "v5litepod-8", "--zone", "us-central1-a",
                       "--project", "proj-one", *dry)[::2], 2, "cluster mine already exists with provider local")


def test_reservation_names_the_compute_engine_path(env, cli):
    code, out, err = cli("up", "--help")
    assert "--api compute or GKE: the Compute Engine reservation" in " ".join(out.split())
    said_once(*cli("up", "-c", "r", "--type", "v6e-8", "--zone", "us-east5-b", "--project", "proj-one",
                   "--reservation", "res1", "--dry-run")[::2], 2, "--reservation applies to --api compute and "
              "--provider gke", "add --api compute")


def test_the_gke_dry_run_needs_type_and_plans_without_a_manifest(env, cli, tmp_path):
    job = make_job(tmp_path, "print(1)\n", 'framework = "jax"\n')
    said_once(*cli("submit", str(job), "--dry-run", "--provider", "gke", "--manifest", "-")[::2], 2,
              "--manifest without a GKE cluster needs --type")
    code, out, err = cli("submit", str(job), "--dry-run", "--provider", "gke", "--type", "v6e-16")
    assert code == 0 and "package" in out and "dry run: nothing was uploaded" in err, err


@pytest.mark.parametrize("toml", ['framework = "tensorflow"\n', ""], ids=["said", "unsaid"])
def test_the_tensorflow_refusal_on_gke_quotes_the_toml_as_it_is(env, cli, tmp_path, toml):
    job = make_job(tmp_path, "print(1)\n", toml)
    flat = said_once(*cli("submit", str(job), "--dry-run", "--provider", "gke", "--type", "v6e-16", "--manifest",
                          str(tmp_path / "m.yaml"))[::2], 2, 'framework = "tensorflow"')
    assert "no `framework` in tpuctl.toml says otherwise" not in flat


def test_kaggle_without_a_network_says_it_is_retrying(monkeypatch, capsys):
    import requests
    from tpuctl.providers.kaggle import client as kc
    monkeypatch.setenv("TPUCTL_RETRY_BASE", "0.001")
    k = kc.Kaggle.__new__(kc.Kaggle)
    k.user, k._token, k.creds = "u", "t", None

    def offline(c):
        raise requests.ConnectionError("no route to host")
    with pytest.raises(kc.TpuctlError, match="cannot reach Kaggle"):
        k._call("list kernels", offline)
    err = capsys.readouterr().err
    assert "list kernels: cannot reach Kaggle (ConnectionError); retrying (1/9)" in err
    assert "retrying (9/9)" in err and "(10/9)" not in err
