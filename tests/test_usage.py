"""Usage mistakes on the command line: the parser's one line, a hint, exit 2; never a crash or a traceback."""
import ast
from pathlib import Path

import pytest


@pytest.mark.parametrize("args,expect,hint", [
    (["up", "--tpye", "v3-8"], "No such option: --tpye", "`tpuctl up --help` lists its options"),
    (["submit"], "Missing argument", "`tpuctl submit --help`"),
    (["nosuch"], "No such command 'nosuch'", "`tpuctl --help` lists the commands"),
    (["logs", "--worker", "x"], "Invalid value for '--worker'", "`tpuctl logs --help`"),
])
def test_a_usage_mistake_exits_2_with_one_line_and_a_hint(env, cli, args, expect, hint):
    code, out, err = cli(*args)
    assert code == 2, err
    assert expect in err and hint in err
    assert "internal error" not in err and "Traceback" not in err
    assert not (env / "home" / "debug.log").exists()      # a usage mistake is not a bug to report


def test_tpuctl_alone_prints_the_help_and_succeeds(env, cli):
    code, out, err = cli()
    assert code == 0 and out.startswith("Usage: tpuctl") and "submit" in out


def test_the_cli_does_not_import_click():
    # recent typer releases ship their own copy of click: importing click would fail where it is not installed
    for module in sorted((Path(__file__).resolve().parent.parent / "tpuctl").glob("cli*.py")):
        tree = ast.parse(module.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "click" not in names, module.name


def test_version_flag(env, cli):
    from tpuctl import __version__
    for flag in ("--version", "-V"):
        code, out, err = cli(flag)
        assert code == 0 and out.strip() == f"tpuctl {__version__}"


def _complete(cli, monkeypatch, line):
    words = line.split(" ")
    monkeypatch.setenv("_TPUCTL_COMPLETE", "complete_bash")
    monkeypatch.setenv("COMP_WORDS", line)
    monkeypatch.setenv("COMP_CWORD", str(len(words) - 1))
    code, out, err = cli()
    assert code == 0, err
    return out.split()


def test_completion_completes_commands_and_cluster_names(env, cli, monkeypatch):
    clusters = env / "home" / "clusters"
    clusters.mkdir(parents=True)
    for name in ("bert", "big", "other"):
        (clusters / f"{name}.json").write_text("{}")
    assert _complete(cli, monkeypatch, "tpuctl su") == ["submit"]
    assert _complete(cli, monkeypatch, "tpuctl down -c b") == ["bert", "big"]
    assert _complete(cli, monkeypatch, "tpuctl logs --cluster o") == ["other"]


def test_completion_installs_for_bash(env, cli, monkeypatch):
    monkeypatch.setenv("HOME", str(env))
    monkeypatch.setenv("SHELL", "/bin/bash")
    # typer asks shellingham, which walks this process's parents for a shell: a test run detached from its
    # terminal (parents reaped, reparented to init) has none, and the install then says "Shell None is not supported"
    import shellingham
    monkeypatch.setattr(shellingham, "detect_shell", lambda *a, **k: ("bash", "/bin/bash"))
    code, out, err = cli("--install-completion", "bash")
    assert code == 0, out + err
    script = next((env / ".bash_completions").glob("tpuctl*"))
    assert "_TPUCTL_COMPLETE=complete_bash" in script.read_text()
    assert str(script.name) in (env / ".bashrc").read_text()
