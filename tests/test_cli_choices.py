"""What the CLI decides for the user (issue 40): an option it does not know is refused, never handed to the job;
the cluster is found when there is one; the hints name the provider and flags the user actually needs."""
import json
from pathlib import Path

import pytest

from tests.jobs import make_job

ENV_JOB = "import json, sys\nprint(json.dumps({'argv': sys.argv[1:]}))\n"


def _runs(st) -> list[Path]:
    return list((Path(st.spec.store) / "tpuctl" / "runs").glob("*"))


@pytest.mark.parametrize("typo", [["--max-restart", "1"], ["--detatch"], ["--bogus"], ["extra"]])
def test_submit_refuses_an_option_it_does_not_know_before_the_double_dash(local_up, cli, tmp_path, typo):
    st = local_up("typo")
    job = make_job(tmp_path, ENV_JOB)
    code, out, err = cli("submit", str(job), "-c", "typo", *typo)
    assert code == 2 and "Traceback" not in err
    assert typo[0] in err and "go after `--`" in err and "tpuctl submit --help" in err
    assert len(err.strip().splitlines()) == 2   # the parser's one line and the hint
    assert not _runs(st)                         # nothing submitted


def test_the_suggestion_names_the_option_meant(local_up, cli, tmp_path):
    local_up("typo")
    code, out, err = cli("submit", str(make_job(tmp_path, ENV_JOB)), "-c", "typo", "--max-restart", "1")
    assert code == 2 and "--max-restarts" in err


def test_arguments_after_the_double_dash_reach_the_job_unchanged(local_up, cli, tmp_path):
    local_up("args")
    job = make_job(tmp_path, ENV_JOB)
    code, out, err = cli("submit", str(job), "-c", "args", "--", "--max-restart", "1", "--", "x y")
    assert code == 0, err
    seen = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert seen["argv"] == ["--max-restart", "1", "--", "x y"]


@pytest.mark.parametrize("command", [["notebook", "{job}", "-o", "{out}"], ["ssh", "-c", "x"]])
def test_every_command_passing_arguments_on_refuses_unknown_options(env, cli, tmp_path, command):
    job = make_job(tmp_path, ENV_JOB)
    args = [a.replace("{job}", str(job)).replace("{out}", str(tmp_path / "j.ipynb")) for a in command]
    code, out, err = cli(*args, "--bogus")
    assert code == 2 and "--bogus" in err and "go after `--`" in err
    assert not (tmp_path / "j.ipynb").exists()


def test_the_only_cluster_is_used_without_c_and_said_once(local_up, cli, tmp_path):
    local_up("ede3")
    job = make_job(tmp_path, ENV_JOB)
    code, out, err = cli("submit", str(job), "--detach")
    assert code == 0, err
    assert err.count("using cluster ede3") == 1
    code, out, err = cli("jobs", "--json")
    assert code == 0 and len(json.loads(out)) == 1 and err.count("using cluster ede3") == 1


def test_several_clusters_and_no_c_is_one_line_listing_them(local_up, cli):
    local_up("one")
    local_up("two")
    code, out, err = cli("jobs")
    assert code == 2 and "one, two" in err and "-c one" in err and "TPUCTL_CLUSTER" in err
    assert "Traceback" not in err


def test_default_still_wins_and_the_setting_beats_the_pick(local_up, cli, monkeypatch):
    local_up("default")
    local_up("other")
    assert cli("status", "--json")[0] == 0                 # `default` exists: used, as before, without a word
    monkeypatch.setenv("TPUCTL_CLUSTER", "other")
    code, out, err = cli("status", "--json")
    assert code == 0 and json.loads(out)["cluster"] == "other" and "using cluster" not in err


def test_no_cluster_yet_says_how_to_make_one_on_each_provider(env, cli):
    code, out, err = cli("logs")
    assert code == 3 and "none made yet" in err
    assert "--provider local" in err and "--provider kaggle" in err and "--zone" in err


def test_the_hint_names_the_provider_the_user_works_with(local_up, cli, tmp_path):
    local_up("mine")
    code, out, err = cli("submit", str(make_job(tmp_path, ENV_JOB)), "-c", "fresh")
    assert code == 3 and "clusters here: mine" in err and "tpuctl up --provider local -c fresh" in err
    assert "--zone" not in err
    code, out, err = cli("up", "-c", "fresh")   # making a Google Cloud TPU: its next step (issue 52)
    assert code == 2 and "--type v5litepod-8 --zone us-west4-a -c fresh" in err and "--provider local" not in err


def test_a_dry_run_needs_no_cluster_even_among_several(local_up, cli, tmp_path):
    local_up("one")
    local_up("two")
    code, out, err = cli("submit", str(make_job(tmp_path, ENV_JOB)), "--dry-run")
    assert code == 0, err
    assert "no cluster to compare with" in out
