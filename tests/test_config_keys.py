"""Every config key the docs name works, in the config file and as TPUCTL_<KEY> (issue 63, item 2): the keys are
read from the docs themselves (the config-file examples, and each "config key `x`"), so a key documented later
without a probe here fails the test rather than going untried."""
import re
from pathlib import Path

import pytest

from tpuctl.core import config

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))

# key -> (value, the command's arguments, what its stderr then says). Local and Google Cloud dry runs: offline.
GCP = ["--type", "v6e-8", "--dry-run"]
PROBES = {
    "provider": ("local", ["up", "-c", "k", "--dry-run"], "agent for k this machine"),
    "cluster": ("named", ["up", "--provider", "local", "--dry-run"], "Plan for cluster named"),
    "autostop": ("30m", ["up", "-c", "k", "--provider", "local", "--dry-run"], "after 30m with no run"),
    "max_duration": ("2h", ["up", "-c", "k", "--provider", "local", "--dry-run"], "compute 2h after it is made"),
    "budget": (5, ["up", "-c", "k", "--provider", "local", "--dry-run"], "budget $5.00"),   # the plan says it once (issue 58.5)
    "notify": ("https://example.com/hook", ["up", "-c", "k", "--provider", "local", "--dry-run"],
               "notify https://example.com/***"),
    "project": ("proj-one", ["up", "-c", "k", "--zone", "us-east5-b", *GCP], "(project proj-one)"),
    "zone": ("us-east5-b", ["up", "-c", "k", "--project", "proj-one", *GCP], "v6e-8 (8 chips, 1 host, TPU VM) in "
                                                                               "us-east5-b"),
    "api": ("compute", ["up", "-c", "k", "--project", "proj-one", "--zone", "us-east5-b", *GCP],
            "v6e-8 (8 chips) through Compute Engine"),
}


def documented_keys() -> set[str]:
    keys: set[str] = set()
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"```toml\n(.*?)```", text, re.S):
            before = text[max(0, m.start() - 250):m.start()]
            if "config file" in before and "tpuctl.toml" not in before:   # not a job's tpuctl.toml
                keys |= set(re.findall(r"^([a-z_]+)\s*=", m.group(1), re.M))
        for m in re.finditer(r"config keys? \(?((?:`[a-z_]+`(?:, | and |, and )?)+)", text):
            keys |= set(re.findall(r"`([a-z_]+)`", m.group(1)))
    return keys


def test_the_docs_name_the_keys_this_test_knows():
    keys = documented_keys()
    assert {"provider", "project", "api", "budget", "notify", "max_duration"} <= keys, keys   # the reader works
    assert keys == set(PROBES), f"documented but untried: {keys - set(PROBES)}; tried but undocumented: " \
                                f"{set(PROBES) - keys}"
    assert set(config.KEYS) == keys


@pytest.mark.parametrize("where", ["file", "environment"])
@pytest.mark.parametrize("key", sorted(PROBES))
def test_each_documented_key_works_in_the_config_file_and_as_TPUCTL_KEY(env, cli, monkeypatch, key, where):
    value, args, said = PROBES[key]
    if where == "file":
        shown = f'"{value}"' if isinstance(value, str) else str(value)
        Path(config.config_path()).write_text(f"{key} = {shown}\n")
    else:
        monkeypatch.setenv(f"TPUCTL_{key.upper()}", str(value))
    code, out, err = cli(*args)
    assert code == 0 and said in " ".join(err.split()), err


def test_no_project_names_every_place_a_project_comes_from(env, cli):
    code, out, err = cli("up", "-c", "k", "--zone", "us-east5-b", *GCP)
    flat = " ".join(err.split())
    assert code == 2 and "no Google Cloud project given" in flat, err
    assert all(w in flat for w in ("--project", "TPUCTL_PROJECT", "GOOGLE_CLOUD_PROJECT", "config file")), err


def test_the_compute_engine_page_is_linked_and_the_jobs_page_names_every_column():
    """Issue 63.8: docs/compute-engine.md reachable from the README, index.md and gke.md; no nav title says TPU7x
    means GKE; jobs.md names every column `tpuctl jobs` prints; index.md's "Where to start" lists the UI."""
    from tpuctl.cli import results
    for page in ("README.md", "docs/index.md", "docs/gke.md"):
        assert "compute-engine.md" in (ROOT / page).read_text(), page
    assert "GKE and TPU7x" not in (ROOT / "mkdocs.yml").read_text()
    start = (ROOT / "docs" / "index.md").read_text().split("## Where to start")[1].split("##")[0]
    assert "(ui.md)" in start and "(compute-engine.md)" in start
    jobs_md = " ".join((ROOT / "docs" / "jobs.md").read_text().split())
    columns = ["id", "job"] + list(results.JOBS_DROPPED_FIRST)
    assert all(f"`{c}`" in jobs_md for c in columns + ["state", "started", "duration"]), columns
