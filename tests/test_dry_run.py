"""`submit` checks the job before it looks for a cluster; `submit --dry-run` says what would be sent, with or
without a cluster, and sends nothing."""
from tpuctl.core import state
from tpuctl.providers.local import LocalProvider

from jobs import make_job


def _job(tmp_path):
    job = make_job(tmp_path, "print('hi')\n", 'data = ["a/x.txt", "b/x.txt", "b/same.txt"]\n')
    for d, text in (("a", "first"), ("b", "second")):
        (job / d).mkdir()
        (job / d / "x.txt").write_text(text)
    (job / "b" / "same.txt").write_text("first")          # the same content as a/x.txt: sent once
    return job


def test_a_bad_job_is_refused_before_the_cluster_is_looked_for(env, cli, tmp_path):
    job = make_job(tmp_path, "", 'colour = 1\n')
    code, out, err = cli("submit", str(job), "-c", "nosuch")
    assert code == 2 and "unknown key 'colour'" in err and "no cluster" not in err


def test_dry_run_without_a_cluster_shows_the_package_and_where_data_lands(env, cli, tmp_path):
    code, out, err = cli("submit", str(_job(tmp_path)), "-c", "nosuch", "--dry-run")
    assert code == 0, err
    assert "package" in out and "sha256" in out
    assert "3 files" in out and "2 distinct contents" in out
    assert "a/x.txt  <-" in out and "b/x.txt  <-" in out and "b/same.txt  <-" in out
    assert "no cluster to compare with" in out and "nothing was uploaded" in err
    assert state.load("nosuch") is None and not (env / "home" / "data").exists()


def test_dry_run_against_a_cluster_counts_only_what_is_new(local_up, cli, tmp_path):
    job = _job(tmp_path)
    st = local_up("dry")
    code, out, err = cli("submit", str(job), "-c", "dry", "--dry-run")
    assert code == 0 and "  new" in out and "2 of 2 data contents new" in out, out + err
    assert LocalProvider().store(st).list("tpuctl/runs/") == []              # nothing run
    assert cli("submit", str(job), "-c", "dry")[0] == 0
    code, out, err = cli("submit", str(job), "-c", "dry", "--dry-run")
    assert "already in the store" in out and "0 of 2 data contents new" in out and "to send  0 B" in out
    (job / "a" / "x.txt").write_text("changed")
    code, out, err = cli("submit", str(job), "-c", "dry", "--dry-run")
    assert "1 of 3 data contents new" in out and "to send  7 B" in out, out


def test_dry_run_of_a_keras_job_names_the_backend_it_would_run_on_and_installs_tensorflow_only_for_it(
        local_up, cli, tmp_path, monkeypatch):
    """Issue 52.7: on a machine without TensorFlow the preview said TensorFlow 2.20 would be installed for a Keras
    job, while the run went to JAX."""
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else
                        real(name, *a))
    local_up("kdry")
    job = make_job(tmp_path, "print('hi')\n", 'framework = "keras"\n')
    code, out, err = cli("submit", str(job), "-c", "kdry", "--dry-run")
    assert code == 0 and "keras    jax (no TensorFlow on this machine)" in out, out + err
    assert "tensorflow 2." not in out, out
    forced = make_job(tmp_path / "f", "print('hi')\n", 'framework = "keras"\nkeras_backend = "tensorflow"\n')
    code, out, err = cli("submit", str(forced), "-c", "kdry", "--dry-run")
    assert "keras    tensorflow (forced by keras_backend in tpuctl.toml)" in out and "tensorflow 2." in out, out
    code, out, err = cli("submit", str(job), "-c", "nosuch", "--dry-run")   # no cluster: where it would go
    assert "keras    backend picked where the run runs" in out and "tensorflow 2." not in out, out
