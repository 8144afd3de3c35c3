"""`--help` as a user reads it (issue 40): the summary names every provider and framework, and every value is
shown as the Python CLI world shows it (JOB_DIR, TEXT, SECONDS), never typer 0.29's `<str>` or `{job_dir}`."""
import re

from tests.helptext import command_paths, help_of


def test_the_summary_names_every_provider_and_framework(env, cli):
    text = " ".join(help_of(cli).split())
    for word in ("TensorFlow", "JAX", "PyTorch", "Google Cloud (gcp)", "GKE (gke)", "Kaggle (kaggle)", "Colab",
                 "this machine (local)"):
        assert word in text, word


def test_no_help_shows_a_python_type_for_a_value(env, cli):
    for path in [(), *command_paths(cli)]:
        text = help_of(cli, *path)
        assert not re.search(r"<\w+(\[\w+\])?>|\{\w+\}", text), (path, text)


def test_values_read_like_the_rest_of_the_python_cli_world(env, cli):
    submit = help_of(cli, "submit")
    assert "Usage: tpuctl submit [OPTIONS] JOB_DIR [-- ARGS]..." in submit
    assert "--give-up-after SECONDS" in submit and "--data PATH" in submit and "-c, --cluster NAME" in submit
    assert "Usage: tpuctl tensorboard [OPTIONS] [RUN_IDS]..." in help_of(cli, "tensorboard")
    assert "Usage: tpuctl ssh [OPTIONS] [-- CMD]..." in help_of(cli, "ssh")
    up = help_of(cli, "up")
    assert "--autostop DURATION" in up and "--runtime TEXT" in up and "--slices N" in up
