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
    tree = ast.parse((Path(__file__).resolve().parent.parent / "tpuctl" / "cli.py").read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "click" not in names
