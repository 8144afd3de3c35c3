"""What printing help imports: `tpuctl --help` and every `tpuctl COMMAND --help` load the command line's own modules
and the error type, nothing a command's body needs (the flows, the store, notifications' urllib and http.client, a
cloud client, TensorFlow, rich, pydantic). bench/bench_help.py measures what that buys."""
import json
import subprocess
import sys

# Every help screen rendered in one interpreter (so the union of what they import is checked), then the modules
# that importing typer alone does not load. A command found by walking the app, so a new command is covered.
RENDER_ALL = """
import contextlib, io, json, sys
before = set(sys.modules)
import typer
from tpuctl.cli import app, main
import tpuctl.cli.clusters   # registers every command on app, as main() does on its first call

def paths(cmd, prefix):
    yield prefix
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from paths(sub, prefix + [name])

rendered = []
for argv in paths(typer.main.get_command(app), []):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([*argv, "--help"])
        except SystemExit as e:
            assert not e.code, (argv, e.code)
    assert "Usage: tpuctl" in out.getvalue(), argv
    rendered.append(" ".join(argv))
print(json.dumps({"rendered": rendered, "loaded": sorted(set(sys.modules) - before)}))
"""
TYPER_ALONE = "import json, sys, typer, typer.main; print(json.dumps(sorted(sys.modules)))"

# What help may load beyond `import typer`: the command line's modules, the error type they raise, the TPUCTL_*
# knobs' check every command runs first (math and os), the user's umask kept as tpuctl sets its own (os alone), and
# the parts of typer's copy of click that render help, a text codec.
ALLOWED = ("__future__", "tpuctl", "tpuctl.cli", "tpuctl.core", "tpuctl.core.errors", "tpuctl.core.knobs",
           "tpuctl.core.umask")
ALLOWED_PREFIXES = ("tpuctl.cli.", "typer._click.", "encodings.")


def _run(code):
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_help_loads_only_the_command_line():
    typer_alone = set(_run(TYPER_ALONE))
    got = _run(RENDER_ALL)
    assert {"", "up", "submit", "logs", "down", "notify", "notify test"} <= set(got["rendered"])
    extra = [m for m in got["loaded"] if m not in typer_alone and m not in ALLOWED
             and not m.startswith(ALLOWED_PREFIXES)]
    assert extra == [], f"help imported what only a command's body needs: {extra}"
