"""The README and the documentation site (docs/, mkdocs.yml): the site builds in strict mode, the command reference
holds every command and option `--help` shows, prose lines stay readable, and the short README stays short."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs_hooks"))
import reference  # noqa: E402  (docs_hooks/reference.py: the generator the site's build runs)
from tests.helptext import command_paths, help_of, options_of  # noqa: E402

PAGES = sorted((ROOT / "docs").glob("*.md"))


def _prose(text: str):
    """(line number, line) of every line outside fenced code blocks: tables and lists count as prose."""
    fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            yield n, line


def test_the_site_builds_in_strict_mode(tmp_path):
    """Strict: a broken link or anchor, a page missing from the nav or a nav entry with no page fails the build
    (mkdocs.yml `validation:` makes each a warning, and `--strict` makes warnings fatal). Never with `-q`: MkDocs
    then counts no warnings, and a strict build with a broken link exits 0 (seen with mkdocs 1.6.1)."""
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(site)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    page = (site / "reference" / "index.html").read_text()
    assert "tpuctl submit" in page and "--max-restarts" in page   # the hook filled the generated reference in


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The guard above guards: the same build with a page linking a page that does not exist fails."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for p in PAGES:
        (docs / p.name).write_text(p.read_text())
    (docs / "first-run.md").write_text((docs / "first-run.md").read_text() + "\nSee [nothing](no-such-page.md).\n")
    config = (ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    config = config.replace("  - docs_hooks/reference.py", f"  - {ROOT / 'docs_hooks' / 'reference.py'}")
    (tmp_path / "mkdocs.yml").write_text(config)
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "no-such-page.md" in r.stdout + r.stderr


def test_the_reference_has_every_command_and_option_help_shows(env, cli):
    doc = reference.markdown()
    sections = dict(re.findall(r"^## (tpuctl[^\n]*)\n(.*?)(?=^## |\Z)", doc, re.M | re.S))
    commands = command_paths(cli)
    assert ("submit",) in commands and ("notify", "test") in commands and ("watch",) in commands
    for path in [(), *commands]:
        heading = " ".join(("tpuctl", *path))
        assert heading in sections, f"{heading} is missing from the reference"
        options = options_of(help_of(cli, *path))
        if path and "Commands:" not in help_of(cli, *path):
            assert "--help" in options   # the parse found the options section
        for option in options:
            assert f"{option}," in sections[heading] or f"{option} " in sections[heading] \
                or f"{option}`" in sections[heading], f"{heading}: {option} is missing from the reference"


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    nav = set(re.findall(r":\s*([\w-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    assert nav == {p.name for p in PAGES}


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_prose_lines_are_at_most_120_characters(path):
    long = [f"{path.name}:{n} ({len(line)})" for n, line in _prose(path.read_text()) if len(line) > 120]
    assert not long, long


def test_the_readme_is_short_and_lists_every_command(env, cli):
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    table = text.split("## Every command", 1)[1].split("\n## ", 1)[0]
    for path in command_paths(cli):
        if len(path) == 1 and "Commands:" in help_of(cli, *path):
            continue   # a group: its commands are listed
        assert f"`tpuctl {' '.join(path)}" in table, f"tpuctl {' '.join(path)} is missing from the README's table"


def test_the_readme_keeps_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert ('.venv/bin/tpuctl up --provider local -c demo && .venv/bin/tpuctl submit jobs/bert_pretrain -c demo -- '
            '--preset tiny --steps 30 && .venv/bin/tpuctl down -c demo --yes') in text
    assert 'pip install -e ".[local,test]" && .venv/bin/python -m pytest' in text


# --- issue 52: docs that disagreed with themselves or with the code ---------------------------------------------

def _fenced(text: str):
    """(line number, line) of every line inside fenced code blocks."""
    prose = {n for n, _ in _prose(text)}
    return [(n, line) for n, line in enumerate(text.splitlines(), 1)
            if n not in prose and not line.lstrip().startswith("```")]


def _extras() -> dict[str, set[str]]:
    """pyproject's extras: name -> the distribution names each installs."""
    import tomllib
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {name: {re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower() for req in reqs} for name, reqs in doc.items()}


def _distributions() -> set[str]:
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for rs in project["optional-dependencies"].values() for r in rs]
    return {re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower() for req in reqs}


@pytest.mark.parametrize("path", [ROOT / "README.md", ROOT / "docs" / "first-run.md"], ids=lambda p: p.name)
def test_the_install_lists_name_pyprojects_extras_and_what_each_installs(path):
    """Each install list names every extra pyproject has, and no other; a package a line names is one its extra
    installs (first-run.md said `[local]` brought tf-keras: it brings Keras 3, and tf-keras is the test extra's)."""
    extras, known = _extras(), _distributions()
    lines = [line for _, line in _fenced(path.read_text())]
    listed = {}
    for i, line in enumerate(lines):
        m = re.match(r'pip install -e "\.\[(\w+)\]"\s*(?:#\s*(.*))?$', line)
        if m:   # the line's own comment, or the comment line above it (first-run.md's narrow blocks)
            said = m.group(2) or (lines[i - 1].lstrip("# ") if i and lines[i - 1].startswith("#") else "")
            listed[m.group(1)] = said
    assert set(listed) == set(extras), f"{path.name} lists {sorted(listed)}, pyproject has {sorted(extras)}"
    for extra, said in listed.items():
        named = {w for w in re.findall(r"[a-z][a-z0-9-]*", said.lower().replace("keras 3", "keras")) if w in known}
        assert named and named <= extras[extra], f"{path.name}: [{extra}] is said to install {named - extras[extra]}"


def test_every_extra_a_page_names_exists():
    extras = set(_extras())
    for path in [ROOT / "README.md", *PAGES, *(ROOT / "jobs").glob("*/README.md")]:
        for group in re.findall(r"(?:tpuctl|\.)\[([\w,]+)\]", path.read_text()):
            assert set(group.split(",")) <= extras, f"{path.name} names the extra [{group}]"


# Lines a code block can hold unwrapped at a 1280-pixel window: Material's grid is 61rem with both sidebars shown
# (12.1rem each), 1rem = 20px (html font-size 125%), the content's margins 1.2rem a side, code at .85 of .8rem with
# 1.18em of padding a side: 656 px, about 80 characters of 0.6em monospace. Pages whose blocks are directory trees or
# payloads (development, store, notifications, gke) rely on the wrapping the site's CSS adds.
COPIED_FROM = ["index.md", "first-run.md", "jobs.md", "google-cloud.md", "kaggle-colab.md", "recovery.md",
               "multihost.md"]


@pytest.mark.parametrize("name", COPIED_FROM)
def test_code_blocks_fit_a_1280_pixel_window(name):
    long = [f"{name}:{n} ({len(line)})" for n, line in _fenced((ROOT / "docs" / name).read_text()) if len(line) > 80]
    assert not long, long


def test_the_site_wraps_code_blocks_instead_of_cutting_them():
    config = (ROOT / "mkdocs.yml").read_text()
    css = re.search(r"^extra_css:\n\s+- (\S+)", config, re.M)
    assert css, "mkdocs.yml links no stylesheet"
    assert "white-space: pre-wrap" in (ROOT / "docs" / css.group(1)).read_text()


def test_the_home_page_and_first_run_name_every_place_a_job_runs():
    from tpuctl.core.models import ProviderName
    home = (ROOT / "docs" / "index.md").read_text()
    for path in (ROOT / "docs" / "index.md", ROOT / "README.md"):
        intro = path.read_text().split("\n\n", 2)[1]
        for place in ("Google Cloud TPU", "GKE", "Kaggle", "Colab", "this machine"):
            assert place in intro, f"{path.name}'s first paragraph does not name {place}"
    assert "TensorFlow 2 Keras by default" not in home
    first_run = (ROOT / "docs" / "first-run.md").read_text()
    line = next(line for line in first_run.splitlines() if line.startswith("provider = "))
    assert all(p.value in line for p in ProviderName), line


def test_backends_says_which_backend_runs_on_gke():
    rows = [line for line in (ROOT / "docs" / "backends.md").read_text().splitlines() if line.startswith("| GKE")]
    assert rows and "| JAX" in rows[0]


def test_the_runtime_list_names_every_public_part_of_tpuctl_runtime():
    import inspect

    from tpuctl import runtime
    section = (ROOT / "docs" / "jobs.md").read_text().split("## `tpuctl.runtime`", 1)[1].split("\n## ", 1)[0]
    internal = {"prefer_legacy_keras", "legacy_keras", "Replicas"}   # what tpuctl's agent and jax_replicas use
    public = [n for n in runtime.__all__ if n not in internal]
    # every public function, class and code of its modules is named in __all__ (what `from tpuctl import runtime` offers)
    parts = [m for m in vars(runtime).values() if inspect.ismodule(m) and m.__name__.startswith(runtime.__name__ + ".")]
    unlisted = [f"{m.__name__}.{n}" for m in parts for n, v in vars(m).items() if not n.startswith("_")
                and ((inspect.isfunction(v) or inspect.isclass(v)) and v.__module__ == m.__name__
                     or n.endswith("_CODE")) and n not in runtime.__all__]
    assert parts and unlisted == [f"{runtime.__name__}.keras_env.{n}" for n in ("keras_module", "tf_module")] + \
        [f"{runtime.__name__}.files.{n}" for n in ("records_metrics", "write_text", "read_bytes")]
    assert "Progress" in public
    missing = [n for n in public if f"`{n}" not in section]
    assert not missing, f"jobs.md's tpuctl.runtime list lacks {missing}"


def _slug(heading: str) -> str:
    """The anchor MkDocs' toc extension gives a heading (lowercase, punctuation dropped, spaces to hyphens)."""
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower()))


def test_the_bert_readme_links_and_sections_it_names_exist():
    """It sent readers to the top-level README's "Cost safety" and a performance table, neither of which exists."""
    job = ROOT / "jobs" / "bert_pretrain" / "README.md"
    text = job.read_text()
    readme_headings = re.findall(r"^#+ (.*)$", (ROOT / "README.md").read_text(), re.M)
    for section in re.findall(r"top-level README's \"([^\"]+)\"", text):
        assert section in readme_headings, f"the README has no section {section!r}"
    assert "README's performance table" not in text
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        file = (job.parent / path).resolve() if path else job
        assert file.exists(), f"{target}: no such file"
        if anchor:
            assert anchor in {_slug(h) for h in re.findall(r"^#+ (.*)$", file.read_text(), re.M)}, target


def test_the_readme_headings_agree_with_its_text():
    text = (ROOT / "README.md").read_text()
    assert "Three commands carry most of the work" in text and "## The two commands" not in text


def test_both_sides_of_exit_code_2_are_documented():
    readme = (ROOT / "README.md").read_text()
    troubleshooting = (ROOT / "docs" / "troubleshooting.md").read_text()
    for text in (readme, troubleshooting):
        assert "(job exit code 2)" in text and "`tpuctl jobs --json`" in text and "`state`" in text


def test_the_reference_says_v5e_and_v5litepod_name_the_same_chips():
    text = (ROOT / "docs" / "reference.md").read_text().split(reference.MARKER)[0]
    assert "`v5litepod-N`" in text and "`v5e-8`" in text and "both spellings" in text
