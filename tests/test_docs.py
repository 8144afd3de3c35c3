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
