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


# Every combination `up` or `submit` refuses, refused alike with and without --dry-run (issue 63.3): one error line
# and its hint, exit 2, no plan printed before it, nothing made. (name, arguments, what the error says)
GCE = ["up", "-c", "gce", "--type", "v6e-8", "--zone", "us-east5-b", "--project", "proj-one", "--api", "compute"]
REFUSED_UP = [
    ("flex-start without --max-duration", [*GCE, "--flex-start"], "--flex-start needs --max-duration"),
    ("flex-start past 7 days", [*GCE, "--flex-start", "--max-duration", "8d"], "at most 7 days"),
    ("flex-start with --max-duration 0", [*GCE, "--flex-start", "--max-duration", "0"],
     "--flex-start needs --max-duration"),
    ("a budget that is no amount", ["up", "-c", "loc", "--provider", "local", "--budget", "abc"],
     "--budget 'abc' is not an amount of dollars"),
    ("a budget less than nothing", ["up", "-c", "loc", "--provider", "local", "--budget", "-5"], "--budget"),
    ("a bad --max-duration", ["up", "-c", "loc", "--provider", "local", "--max-duration", "8x"], "not a duration"),
]
REFUSED_SUBMIT = [
    ("--queue on a local cluster", ["--queue", "q"], "--queue, --priority and --namespace apply to --provider gke"),
    ("--priority on a local cluster", ["--priority", "high"], "--queue, --priority and --namespace apply to --provider gke"),
    ("--chain on a local cluster", ["--chain", "3"], "--chain 3: cluster sub's runs do not run in sessions"),
    ("--keep-inputs on a local cluster", ["--keep-inputs"], "--keep-inputs: cluster sub's runs have no input"),
    ("--max-restarts below 0", ["--max-restarts", "-1"], "--max-restarts -1 must be 0 or more"),
]


def _refused(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and err.count("hint:") == 1 and "internal error" not in err, err
    assert "Plan for cluster" not in err, err   # refused before the plan, not after it
    return lines[0]


def test_up_refuses_the_same_with_and_without_dry_run(env, cli):
    from tpuctl.core import state
    for what, args, said in REFUSED_UP:
        seen = []
        for dry in (["--dry-run"], ["--yes"]):
            code, out, err = cli(*args, *dry)
            assert code == 2 and said in err, f"{what} {dry}: {err}"
            seen.append(_refused(err))
        assert seen[0] == seen[1], what
        assert state.load(args[2]) is None, what


def test_submit_refuses_the_same_with_and_without_dry_run(local_up, cli, tmp_path):
    local_up("sub")
    job = make_job(tmp_path, "print('hi')\n")
    for what, args, said in REFUSED_SUBMIT:
        seen = []
        for dry in (["--dry-run"], []):
            code, out, err = cli("submit", str(job), "-c", "sub", *args, *dry)
            assert code == 2 and said in " ".join(err.split()), f"{what} {dry}: {err}"
            seen.append(_refused(err))
        assert seen[0] == seen[1], what
    assert LocalProvider().store(state.load("sub")).list("tpuctl/runs/") == []   # nothing run


def test_a_limit_given_as_0_is_said_in_the_plan(env, cli):
    code, out, err = cli("up", "-c", "z", "--provider", "local", "--max-duration", "0", "--autostop", "off",
                         "--dry-run")
    flat = " ".join(err.split())
    assert code == 0 and "no deadline (--max-duration 0 turns it off)" in flat, err
    assert "nothing ends an idle host (--autostop off turns it off)" in flat, err
