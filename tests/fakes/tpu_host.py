"""Simulated TPU VM hosts (and the legacy node's companion VM): what the fake TPU and Compute APIs boot while a
node or VM is being created, so the real start-up script meets the boot order Google has.

Each host is a directory prefix (not a chroot) in which the rendered start-up script runs with bash, as the guest
agent runs `startup-script` metadata at boot while the API still reports CREATING (GCP_FACTS §6; Google's
"Manage TPU resources" page: the script runs on every worker). Modelled, with sources:
- an emulated metadata server (`GCE_METADATA_HOST`, honoured by google-auth and by the script): instance
  attributes `agent-worker-number` (read by JAX's cloud_tpu_cluster.py the same way), `accelerator-type`,
  `startup-script`, `instance/hostname`, and a token for the host's service account; requests without
  `Metadata-Flavor: Google` are refused (Compute Engine docs, "About VM metadata");
- the host's identity: its own port on the fake Cloud Storage (`FakeGcs.listen_as`), so IAM grants and their
  propagation delay apply to it, while the script's downloads go through curl (a real HTTP client) and the agent's
  through google-cloud-storage;
- the image: a `python3` that knows the image's packages (its own site directory: this test environment's
  site-packages without TensorFlow, tf-keras or Keras, plus TensorFlow installed as `tensorflow-tpu`, the name
  Google's TPU harness installs it under, from fakes/pyindex.py) but without python3-venv's ensurepip, as on fresh
  Ubuntu images (`python3 -m venv` fails, `--without-pip` works); only that python3 has them: nothing else of the
  host's environment points at them (no PYTHONPATH); `apt-get` fails (no network here); `hostname` answers the TPU
  VM's `t1v-n-...-w-N` name; pip reaches only the tests' local index (PIP_NO_INDEX, PIP_FIND_LINKS).
- systemd: a stand-in `systemctl` that starts the unit's ExecStart with its Environment= lines, detached, with no
  PYTHONPATH, as systemd gives a service none.
Not modelled: reboots, the TPU runtime itself, libtpu, the dpkg lock, real apt.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SYSTEMCTL = """#!/bin/bash
# systemctl daemon-reload | enable --now UNIT | is-active UNIT: run the unit's ExecStart detached, with Environment=
case "$1" in
  daemon-reload) exit 0;;
  is-active) pid=$(cat "$TPUCTL_UNIT_DIR/agent.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; exit $?;;
  restart|enable) ;;
  *) exit 0;;
esac
unit="$TPUCTL_UNIT_DIR/${@: -1}"
if pid=$(cat "$TPUCTL_UNIT_DIR/agent.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; then exit 0; fi
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV   # systemd gives a service none of these
while IFS= read -r line; do
  case "$line" in Environment=*) export "${line#Environment=}";; esac
done < "$unit"
cmd=$(grep '^ExecStart=' "$unit" | cut -d= -f2-)
setsid $cmd >> "$TPUCTL_UNIT_DIR/agent.out" 2>&1 < /dev/null &
echo $! > "$TPUCTL_UNIT_DIR/agent.pid"
"""
PYTHON3 = """#!/bin/bash
# The image's python3: its packages (its own site directory), but no ensurepip (python3-venv is not installed on
# fresh Ubuntu images).
export PYTHONPATH="@IMAGE@"
if [ "$1" = "-m" ] && [ "$2" = "venv" ] && [[ " $* " != *" --without-pip "* ]]; then
  echo "The virtual environment was not created successfully because ensurepip is not available.  On Debian/Ubuntu" >&2
  echo "systems, you need to install the python3-venv package using the following command." >&2
  exit 1
fi
exec "@PYTHON@" "$@"
"""
APT_GET = "#!/bin/bash\necho 'E: Failed to fetch: no network' >&2\nexit 100\n"
HOSTNAME = "#!/bin/bash\necho \"$SIMULATED_HOSTNAME\"\n"


class _Metadata:
    """The GCE metadata server of one host."""

    def __init__(self, attributes: dict, hostname: str, email: str):
        self.values = {f"instance/attributes/{k}": str(v) for k, v in attributes.items()}
        self.values.update({"instance/hostname": hostname, "instance/service-accounts/default/email": email,
                            "instance/service-accounts/default/token": json.dumps(
                                {"access_token": f"token-of-{email}", "expires_in": 3599, "token_type": "Bearer"})})
        values = self.values

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                key = self.path.split("?", 1)[0].removeprefix("/computeMetadata/v1/")
                if self.headers.get("Metadata-Flavor") != "Google":
                    body, status = b"Missing Metadata-Flavor:Google header.", 403
                elif key in values:
                    body, status = values[key].encode(), 200
                else:
                    body, status = b"not found", 404
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.host = f"127.0.0.1:{self.server.server_port}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


_IMAGE: list[Path] = []
_NOT_IN_IMAGE = ("tensorflow", "tf_keras", "keras", "tf-keras")


def image_site() -> Path:
    """The image's site directory, made once per test session: links to this environment's packages but its
    TensorFlow stack, and the tensorflow-tpu stand-in unpacked in their place."""
    if not _IMAGE:
        import tempfile
        import zipfile
        from fakes import pyindex
        site = Path(tempfile.mkdtemp(prefix="tpu-image-")) / "site-packages"
        site.mkdir()
        purelib = Path(sysconfig.get_paths()["purelib"])
        for entry in purelib.iterdir():
            if not entry.name.lower().replace("-", "_").startswith(tuple(n.replace("-", "_") for n in _NOT_IN_IMAGE)):
                (site / entry.name).symlink_to(entry)
        wheels = pyindex.build(site.parent / "wheels")
        zipfile.ZipFile(wheels / f"tensorflow_tpu-{pyindex.LINES['2.20'][0]}-py3-none-any.whl").extractall(site)
        _IMAGE.append(site)
    return _IMAGE[0]


class Host:
    def __init__(self, root: Path, name: str, worker: int, script: str, service_account: str, accelerator: str,
                 gcs, env: dict, tpu_env: dict | None = None):
        self.root, self.name, self.worker = root, name, worker
        for d in ("shims", "etc/systemd/system", "opt/tpuctl", "var/log", "home"):
            (root / d).mkdir(parents=True, exist_ok=True)
        shims = {"systemctl": SYSTEMCTL,
                 # the interpreter itself, not this test environment's venv, so only the image's packages show
                 "python3": PYTHON3.replace("@PYTHON@", getattr(sys, "_base_executable", sys.executable))
                                   .replace("@IMAGE@", str(image_site())),
                 "apt-get": APT_GET, "hostname": HOSTNAME}
        for n, text in shims.items():
            (root / "shims" / n).write_text(text)
            (root / "shims" / n).chmod(0o755)
        (root / "startup.sh").write_text(script)
        attributes = {"agent-worker-number": worker, "accelerator-type": accelerator, "startup-script": script}
        if tpu_env is not None:   # `KEY: 'value'` lines (MaxText multihost_job.py reads them with grep and cut)
            attributes["tpu-env"] = "".join(f"{k}: '{v}'\n" for k, v in {"WORKER_ID": worker, **tpu_env}.items())
        self.metadata = _Metadata(attributes, name, service_account)
        self.env = {
            "PATH": f"{root / 'shims'}:{os.environ['PATH']}",
            "HOME": str(root / "home"),
            "SIMULATED_HOSTNAME": name,
            "GCE_METADATA_HOST": self.metadata.host,
            "STORAGE_EMULATOR_HOST": gcs.listen_as(f"serviceAccount:{service_account}"),
            "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "TPUCTL_AGENT_DIR": str(root / "opt/tpuctl"), "TPUCTL_BOOT_LOG": str(root / "var/log/tpuctl-boot.log"),
            "TPUCTL_UNIT_DIR": str(root / "etc/systemd/system"), "TPUCTL_AGENT_HOME": str(root / "home/agent"),
            **env,
        }
        self.script = subprocess.Popen(["bash", str(root / "startup.sh")], env=self.env, cwd=root,
                                       stdout=open(root / "startup.out", "wb"), stderr=subprocess.STDOUT,
                                       start_new_session=True)

    def boot_log(self) -> str:
        p = self.root / "var/log/tpuctl-boot.log"
        return p.read_text() if p.exists() else ""

    def agent_out(self) -> str:
        p = self.root / "etc/systemd/system/agent.out"
        return p.read_text() if p.exists() else ""

    def stop(self):
        """Power off: the script, the agent and its jobs, even those in sessions of their own, all go at once."""
        pid_file = self.root / "etc/systemd/system/agent.pid"
        pids = [self.script.pid] + ([int(pid_file.read_text())] if pid_file.exists() else [])
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        marker = f"TPUCTL_AGENT_HOME={self.env['TPUCTL_AGENT_HOME']}".encode()
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        self.script.wait(10)
        self.metadata.stop()


class SimulatedHosts:
    """Boots a Host per worker when a fake API is asked to create a node or VM with a start-up script."""

    def __init__(self, gcs, root: Path):
        self.gcs, self.root = gcs, root
        self.hosts: dict[str, list[Host]] = {}
        self.env: dict[str, str] = {}        # extra environment for every host (short waits in tests)
        self.enabled = False
        self.boots: dict[str, int] = {}      # resource short name -> times booted

    def boot(self, resource: str, script: str, workers: int, service_account: str, accelerator: str,
             kind: str = "tpu-vm", tpu_env: dict | None = None) -> None:
        if not self.enabled or not script:
            return
        short = resource.rsplit("/", 1)[-1]
        self.boots[short] = self.boots.get(short, 0) + 1   # a recreated TPU VM boots from a fresh disk
        disk = short if self.boots[short] == 1 else f"{short}.{self.boots[short]}"
        hosts = []
        for w in range(workers):
            name = f"t1v-n-{abs(hash(resource)) % 10**8:08d}-w-{w}" if kind == "tpu-vm" else short
            hosts.append(Host(self.root / disk / f"w{w}", name, w, script, service_account, accelerator, self.gcs,
                              self.env, tpu_env))
        self.hosts[resource] = hosts

    def power_off(self, resource: str) -> None:
        for h in self.hosts.pop(resource, []):
            h.stop()

    def stop_all(self) -> None:
        for r in list(self.hosts):
            self.power_off(r)
