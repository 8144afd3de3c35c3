"""Run the rendered host startup script against a local store, with shims for gsutil, systemctl and the metadata
server: it installs the agent package from the store, starts the agent, and the agent runs a submitted run."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from jobs import make_job, submit_to_store
from tpuctl import __version__, agent_package, runs
from tpuctl.providers.gcp.startup import render
from tpuctl.store import LocalStore

GSUTIL = """#!/bin/bash
# gsutil [-q] cp SRC DST, for local paths
[ "$1" = "-q" ] && shift
[ "$1" = "cp" ] || exit 2
mkdir -p "$(dirname "$3")" 2>/dev/null
[ -d "$3" ] && exec cp "$2" "$3/"
exec cp "$2" "$3"
"""
SYSTEMCTL = """#!/bin/bash
# systemctl daemon-reload | enable --now UNIT: run the unit's ExecStart in the background with its Environment=
[ "$1" = "daemon-reload" ] && exit 0
unit="$TPUCTL_UNIT_DIR/$3"
while IFS= read -r line; do
  case "$line" in Environment=*) export "${line#Environment=}";; esac
done < "$unit"
cmd=$(grep '^ExecStart=' "$unit" | cut -d= -f2-)
setsid $cmd > "$TPUCTL_UNIT_DIR/agent.out" 2>&1 < /dev/null &
echo $! > "$TPUCTL_UNIT_DIR/agent.pid"
"""
CURL = "#!/bin/bash\nexit 22\n"   # no metadata server here: worker 0


def _shims(d: Path) -> Path:
    d.mkdir()
    for name, text in (("gsutil", GSUTIL), ("systemctl", SYSTEMCTL), ("curl", CURL)):
        (d / name).write_text(text)
        (d / name).chmod(0o755)
    return d


def _run_script(tmp_path, store_dir):
    script = tmp_path / "startup.sh"
    script.write_text(render(str(store_dir), "boot", "tpu-vm", "v3-8", "local"))
    units = tmp_path / "units"
    units.mkdir()
    env = dict(os.environ, PATH=f"{_shims(tmp_path / 'shims')}:{os.environ['PATH']}",
               TPUCTL_AGENT_DIR=str(tmp_path / "agent"), TPUCTL_BOOT_LOG=str(tmp_path / "boot.log"),
               TPUCTL_UNIT_DIR=str(units), TPUCTL_PYTHON=sys.executable,
               PIP_TARGET=str(tmp_path / "site"), PIP_NO_DEPS="1", PIP_NO_BUILD_ISOLATION="0",
               PYTHONPATH=str(tmp_path / "site"), TPUCTL_AGENT_HOME=str(tmp_path / "work"))
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
    return r, units


def test_startup_script_installs_and_starts_the_agent(tmp_path):
    store_dir = tmp_path / "store"
    store = LocalStore(store_dir)
    store.write(agent_package.key(), agent_package.build())
    r, units = _run_script(tmp_path, store_dir)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        boot = next((store_dir / "tpuctl" / "boot").glob("*.log")).read_text()
        assert "boot: cluster boot" in boot and "agent running" in boot
        assert (tmp_path / "site" / "tpuctl" / "agent.py").is_file()   # the store's copy, not this checkout
        job = make_job(tmp_path, "import os, tpuctl\nprint(os.environ['TPUCTL_ACCELERATOR'], "
                                 "os.environ['TPUCTL_TPU'], tpuctl.__file__)\n")
        run_id = submit_to_store(store, job)
        out = []
        st = runs.follow(store, run_id, out.append, sleep=lambda s: time.sleep(min(s, 0.2)))
        assert st.state is runs.RunState.SUCCEEDED, (units / "agent.out").read_text()
        accel, tpu, where = b"".join(out).decode().split()
        assert (accel, tpu) == ("v3-8", "local")
        assert where.startswith(str(tmp_path / "site"))
    finally:
        pid = units / "agent.pid"
        if pid.exists():
            os.killpg(int(pid.read_text()), signal.SIGTERM)


def test_a_failed_boot_is_logged_into_the_store(tmp_path):
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    r, _ = _run_script(tmp_path, store_dir)   # no agent package in the store
    assert r.returncode == 1
    boot = next((store_dir / "tpuctl" / "boot").glob("*.log")).read_text()
    assert "FAILED: agent package not in the store" in boot
    assert f"tpuctl {__version__}" in boot
