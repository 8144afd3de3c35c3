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
- the image, one of two:
  * "ubuntu", a TPU VM's: a `python3` that knows the image's packages (its own site directory: this test
    environment's site-packages without TensorFlow, tf-keras or Keras, plus TensorFlow installed as `tensorflow-tpu`,
    the name Google's TPU harness installs it under, from fakes/pyindex.py) and pip, but without python3-venv's
    ensurepip, as on fresh Ubuntu images (`python3 -m venv` fails, `--without-pip` works); `apt-get` fails (no
    network here);
  * "ubuntu-base", a TPU VM's on a base runtime (tpu-ubuntu2204-base, v2-alpha-tpuv5, tpu-vm-base...): the same but
    without TensorFlow, the framework-free images on which users install JAX or PyTorch themselves
    (cloud.google.com/tpu/docs/runtimes, "PyTorch and JAX"; tpuctl's tpu.BASE_RUNTIMES): only tpu-vm-tf-* images
    ship TensorFlow (tpu_vm_image);
  * "debian-12", Debian's cloud image that Compute Engine VMs boot (google/vms.py IMAGE): python3 is there (Debian's
    cloud images install unattended-upgrades, which depends on it) but neither pip nor python3-venv (Debian's
    cloud-image FAI package lists, GoCarrot/debian-cloud-images config_space/package_config: no python3-pip, no
    python3-venv), so `python3 -m pip` and `python3 -m ensurepip` fail and `venv --without-pip` makes a venv with no
    pip at all; `apt-get install python3-venv` works (Debian's python3-venv brings ensurepip's wheels:
    /usr/share/doc/python3.11/README.venv, "a copy of pip in it"), after waiting for the dpkg lock that
    unattended-upgrades holds for the first `dpkg_busy` seconds of the boot: with `-o DPkg::Lock::Timeout=N` apt
    waits (apt-get(8), apt >= 1.9.11), without it apt fails at once with "Could not get lock".
  On both, only that python3 knows the image's packages: nothing else of the host's environment points at them (no
  PYTHONPATH); `hostname` answers the TPU VM's `t1v-n-...-w-N` name; pip reaches only the tests' local index
  (PIP_NO_INDEX, PIP_FIND_LINKS), so the packages a VM would take from PyPI stand in the Debian site directory too.
- systemd: a stand-in `systemctl` that starts the unit's ExecStart with its Environment= lines, detached, with no
  PYTHONPATH, as systemd gives a service none.
Not modelled: reboots, the TPU runtime itself, libtpu, real apt (only what the start-up script asks of it).
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path
from typing import Callable

from fakes.procs import kill_marked
from fakes.wire import QuietHandler, serve

SYSTEMCTL = """#!/bin/bash
# systemctl daemon-reload | enable --now UNIT | is-active UNIT: run the unit's ExecStart detached, with Environment=
# A process that exited is not running, even unreaped: `kill -0` succeeds on a zombie, and an init that does not
# reap (a container's) leaves the agent a power-off killed as one; systemd saw it exit.
running() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; [[ ${s:0:1} != [ZX] ]]; }
case "$1" in
  daemon-reload) exit 0;;
  is-active) pid=$(cat "$TPUCTL_UNIT_DIR/agent.pid" 2>/dev/null) && running "$pid"; exit $?;;
  restart|enable) ;;
  *) exit 0;;
esac
case "${@: -1}" in   # the TPU runtime: each restart logged with the image it then serves
  tpu-runtime*) [ "$1" = restart ] && echo "$(date +%s.%N) $(grep -o 'TF_DOCKER_URL=[^"]*' \
                  "$TPUCTL_UNIT_DIR/tpu-runtime.service")" >> "$TPUCTL_UNIT_DIR/tpu-runtime.restarts"; exit 0;;
esac
unit="$TPUCTL_UNIT_DIR/${@: -1}"
if pid=$(cat "$TPUCTL_UNIT_DIR/agent.pid" 2>/dev/null) && running "$pid"; then exit 0; fi
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV   # systemd gives a service none of these
while IFS= read -r line; do
  case "$line" in Environment=*) export "${line#Environment=}";; esac
done < "$unit"
cmd=$(grep '^ExecStart=' "$unit" | cut -d= -f2-)
setsid $cmd >> "$TPUCTL_UNIT_DIR/agent.out" 2>&1 < /dev/null &
echo $! > "$TPUCTL_UNIT_DIR/agent.pid"
"""
PYTHON3 = """#!/bin/bash
# The image's python3: its packages (its own site directory), and ensurepip only once python3-venv is installed
# (neither fresh image has it).
export PYTHONPATH="@IMAGE@"
if [ ! -e "@ROOT@/var/lib/dpkg/info/python3-venv.list" ]; then
  if [ "$1" = "-m" ] && [ "$2" = "venv" ] && [[ " $* " != *" --without-pip "* ]]; then
    echo "The virtual environment was not created successfully because ensurepip is not available.  On Debian/Ubuntu" >&2
    echo "systems, you need to install the python3-venv package using the following command." >&2
    exit 1
  fi
  if [ "$1" = "-m" ] && [ "$2" = "ensurepip" ]; then
    echo "ensurepip is disabled in Debian/Ubuntu for the system python." >&2
    exit 1
  fi
fi
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  # The image's site directory is its system site: a venv made --system-site-packages sees it, and not the site of
  # the interpreter this simulation runs on (which holds a pip the image may not have).
  args=(); system=0
  for a in "$@"; do if [ "$a" = --system-site-packages ]; then system=1; else args+=("$a"); fi; done
  site() {
    (( system )) || return 0
    echo "@IMAGE@" >"$(env -u PYTHONPATH "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_system_site.pth"
  }
  if [ "${#args[@]}" = 4 ] && [ "${args[2]}" = --clear ]; then
    # `venv --clear DIR` with its own pip: the venv this interpreter makes, made once per image and test process
    # and copied, its paths rewritten (bin/'s scripts, pyvenv.cfg). Making it is ensurepip installing and
    # byte-compiling pip and setuptools, ~3 CPU-s a boot; the copy holds the same files. (Their .pyc files name the
    # first venv's paths in a traceback of pip's own.)
    dir="${args[3]}"; made=$(realpath -m "@IMAGE@/../venv-system-$system")
    if [ ! -e "$made/.made" ]; then
      ( flock 9; [ -e "$made/.made" ] || { rm -rf "$made"; env -u PYTHONPATH "@PYTHON@" -m venv --clear "$made" \
          && site "$made" && touch "$made/.made"; } ) 9>"$made.lock" || exit $?
    fi
    rm -rf "$dir" && cp -a "$made" "$dir" && rm "$dir/.made" || exit 1
    grep -rlIZF "$made" "$dir/bin" "$dir/pyvenv.cfg" | xargs -0 -r sed -i "s|$made|$dir|g"
    exit 0
  fi
  env -u PYTHONPATH "@PYTHON@" "${args[@]}" || exit $?
  site "${args[-1]}"
  exit 0
fi
exec "@PYTHON@" "$@"
"""
APT_GET = {"ubuntu": "#!/bin/bash\necho 'E: Failed to fetch: no network' >&2\nexit 100\n",
           "debian-12": """#!/bin/bash
# apt-get [-o DPkg::Lock::Timeout=N] update|install [-y -qq] PKG...: waits for the dpkg lock only when told to
timeout=0
while [ "$1" = "-o" ]; do case "$2" in DPkg::Lock::Timeout=*) timeout="${2#*=}";; esac; shift 2; done
busy_until=$(cat "@ROOT@/var/lib/dpkg/lock-frontend" 2>/dev/null || echo 0)
while (( $(date +%s) < busy_until )); do
  if (( timeout == 0 )); then
    echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 812 (unattended-upgr)" >&2
    exit 100
  fi
  sleep 0.2
done
cmd="$1"; shift
[ "$cmd" = install ] || exit 0
for pkg in "$@"; do
  case "$pkg" in -*) ;; *) touch "@ROOT@/var/lib/dpkg/info/$pkg.list";; esac
done
"""}
APT_GET["ubuntu-base"] = APT_GET["ubuntu"]
# Google's TPU Ubuntu image for Compute Engine TPU VMs (ubuntu-os-accelerator-images): "The image ships Python but
# no pip and no uv" (a Google-authored WeatherNext TPU VM guide, GCE_TPU_FACTS §5), so it boots as Debian's does:
# python3-venv from apt, which has the network a real VM has.
APT_GET["ubuntu-accel"] = APT_GET["debian-12"]
HOSTNAME = "#!/bin/bash\necho \"$SIMULATED_HOSTNAME\"\n"


class _Metadata:
    """The GCE metadata server of one host."""

    def __init__(self, attributes: dict, hostname: str, email: str):
        self.values = {f"instance/attributes/{k}": str(v) for k, v in attributes.items()}
        self.values.update({"instance/hostname": hostname, "instance/service-accounts/default/email": email,
                            "instance/service-accounts/default/token": json.dumps(
                                {"access_token": f"token-of-{email}", "expires_in": 3599, "token_type": "Bearer"})})
        values = self.values

        class Handler(QuietHandler):
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

        self.server = serve(Handler)
        self.host = f"127.0.0.1:{self.server.server_port}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


_IMAGES: dict[str, Path] = {}
_NOT_IN_IMAGE = {"ubuntu": ("tensorflow", "tf_keras", "keras", "tf-keras"),
                 "ubuntu-base": ("tensorflow", "tf_keras", "keras", "tf-keras"),
                 "debian-12": ("tensorflow", "tf_keras", "keras", "tf-keras", "pip"),
                 "ubuntu-accel": ("tensorflow", "tf_keras", "keras", "tf-keras", "pip")}


def tpu_vm_image(runtime_version: str) -> str:
    """The image a TPU VM of this runtime boots: TensorFlow only on tpu-vm-tf-* (the docstring's images)."""
    return "ubuntu" if runtime_version.startswith("tpu-vm-tf") else "ubuntu-base"


def image_site(image: str = "ubuntu") -> Path:
    """The image's site directory, made once per test session: links to this environment's packages but those the
    image lacks (its TensorFlow stack; on Debian pip as well), and on the TPU VM's image the tensorflow-tpu stand-in
    unpacked in their place."""
    if image not in _IMAGES:
        import tempfile
        import zipfile
        from fakes import pyindex
        site = Path(tempfile.mkdtemp(prefix=f"{image}-image-")) / "site-packages"
        atexit.register(shutil.rmtree, site.parent, True)   # with the venv the image's python3 copies (PYTHON3)
        site.mkdir()
        purelib = Path(sysconfig.get_paths()["purelib"])
        lacking = tuple(n.replace("-", "_") for n in _NOT_IN_IMAGE[image])
        for entry in purelib.iterdir():
            if not entry.name.lower().replace("-", "_").startswith(lacking):
                (site / entry.name).symlink_to(entry)
        if image == "ubuntu":
            wheels = pyindex.build(site.parent / "wheels")
            zipfile.ZipFile(wheels / f"tensorflow_tpu-{pyindex.LINES['2.20'][0]}-py3-none-any.whl").extractall(site)
        _IMAGES[image] = site
    return _IMAGES[image]


def python3(image: str) -> str:
    """The image's python3 shim (@ROOT@ left for the host's root): the interpreter itself, not this test
    environment's venv, so only the image's packages show."""
    return PYTHON3.replace("@PYTHON@", getattr(sys, "_base_executable", sys.executable)) \
        .replace("@IMAGE@", str(image_site(image)))


class Host:
    def __init__(self, root: Path, name: str, worker: int, script: str, service_account: str, accelerator: str,
                 gcs, env: dict, image: str = "ubuntu", dpkg_busy: float = 1.0, kind: str = "tpu-vm",
                 tpu_env: dict | None = None, attributes: dict | None = None, agent_worker_number: bool = True):
        self.root, self.name, self.worker, self.image = root, name, worker, image
        for d in ("shims", "etc/systemd/system", "opt/tpuctl", "var/log", "home", "var/lib/dpkg/info"):
            (root / d).mkdir(parents=True, exist_ok=True)
        shims = {"systemctl": SYSTEMCTL, "python3": python3(image), "apt-get": APT_GET[image], "hostname": HOSTNAME}
        (root / "var/lib/dpkg/lock-frontend").write_text(str(int(time.time() + dpkg_busy + 1)))
        for n, text in shims.items():
            (root / "shims" / n).write_text(text.replace("@ROOT@", str(root)))
            (root / "shims" / n).chmod(0o755)
        (root / "startup.sh").write_text(script)
        if kind == "tpu-vm":
            # A TPU VM's TPU runtime unit, with the line Google's CI re-points (set_up_pjrt's sed replaces from
            # TF_DOCKER_URL= to the line's end and closes a quote: Environment="TF_DOCKER_URL=..."). What the image
            # itself names there is not known: a stand-in.
            (root / "etc/systemd/system/tpu-runtime.service").write_text(
                '[Service]\nEnvironment="TF_DOCKER_URL=gcr.io/cloud-tpu-v2-images/grpc_tpu_worker:image-default"\n')
        meta = {"accelerator-type": accelerator, "startup-script": script, **(attributes or {})}
        if agent_worker_number:
            meta["agent-worker-number"] = worker
        if tpu_env is not None:   # `KEY: 'value'` lines (MaxText multihost_job.py reads them with grep and cut)
            ids = {} if kind == "gce-tpu" else {"WORKER_ID": worker}   # Compute Engine's says TPU_WORKER_ID (§5)
            meta["tpu-env"] = "".join(f"{k}: '{v}'\n" for k, v in {**ids, **tpu_env}.items())
        self.metadata = _Metadata(meta, name, service_account)
        self.env = {
            "PATH": f"{root / 'shims'}:{os.environ['PATH']}",
            "HOME": str(root / "home"),
            "SIMULATED_HOSTNAME": name,
            "GCE_METADATA_HOST": self.metadata.host,
            "STORAGE_EMULATOR_HOST": gcs.listen_as(f"serviceAccount:{service_account}"),
            "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "TPUCTL_AGENT_DIR": str(root / "opt/tpuctl"), "TPUCTL_BOOT_LOG": str(root / "var/log/tpuctl-boot.log"),
            "TPUCTL_UNIT_DIR": str(root / "etc/systemd/system"), "TPUCTL_AGENT_HOME": str(root / "home/agent"),
            # each boot draws a new /proc/sys/kernel/random/boot_id (proc_sys_kernel(5)); the simulated hosts share
            # this kernel's, so each gets its own here (tpuctl/host/hostboot.py reads this first)
            "TPUCTL_BOOT_ID": uuid.uuid4().hex,
            **env,
        }
        self.script = subprocess.Popen(["bash", str(root / "startup.sh")], env=self.env, cwd=root,
                                       stdout=open(root / "startup.out", "wb"), stderr=subprocess.STDOUT,
                                       start_new_session=True)

    def boot_log(self) -> str:
        p = self.root / "var/log/tpuctl-boot.log"
        return p.read_text() if p.exists() else ""

    def runtime_restarts(self) -> list[tuple[float, str]]:
        """(when, image) of each restart of the TPU runtime service."""
        p = self.root / "etc/systemd/system/tpu-runtime.restarts"
        return [(float(t), url.removeprefix("TF_DOCKER_URL=")) for t, url in
                (line.split(" ", 1) for line in p.read_text().splitlines())] if p.exists() else []

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
        kill_agent_home(self.env["TPUCTL_AGENT_HOME"])
        self.script.wait(10)
        # Nothing of the running system outlives the power: systemd keeps a unit's main PID in memory and its runtime
        # files on /run, a tmpfs. A PID left on the simulated disk would name another process after PIDs wrap.
        pid_file.unlink(missing_ok=True)
        self.metadata.stop()


def kill_agent_home(home) -> None:
    """SIGKILL to every process of a host's agent and jobs, found by the TPUCTL_AGENT_HOME in their environment (its
    jobs run in sessions of their own, so no process group holds them all): what a power-off does to them."""
    kill_marked("TPUCTL_AGENT_HOME", str(home))


class SimulatedHosts:
    """Boots a Host per worker when a fake API is asked to create a node or VM with a start-up script."""

    def __init__(self, gcs, root: Path):
        self.gcs, self.root = gcs, root
        self.hosts: dict[str, list[Host]] = {}
        self.env: dict[str, str] = {}        # extra environment for every host (short waits in tests)
        self.enabled = False
        # Where a test needs some guests only (worker 0's word that it may end the compute, say): only(resource,
        # kind, worker) says which boot. The APIs still have every node and VM; the others' guests are not simulated
        # (each boot costs seconds of CPU: pip, and ensurepip on an image without pip). None: every one.
        self.only: Callable[[str, str, int], bool] | None = None
        self.boots: dict[str, int] = {}      # resource short name -> times booted

    def boot(self, resource: str, script: str, workers: int, service_account: str, accelerator: str,
             kind: str = "tpu-vm", image: str = "ubuntu", tpu_env: dict | None = None, same_disk: bool = False,
             attributes: dict | None = None, first_worker: int = 0, hostname: str = "",
             agent_worker_number: bool = True) -> None:
        """kind "gce-tpu": one Compute Engine TPU VM (worker `first_worker` of its slice, named `hostname`), with no
        TPU runtime service (no tpu-vm-* runtime on its image, GCE_TPU_FACTS §5)."""
        if not self.enabled or not script:
            return
        short = resource.rsplit("/", 1)[-1]
        if not same_disk or short not in self.boots:
            self.boots[short] = self.boots.get(short, 0) + 1   # a recreated TPU VM boots from a fresh disk
        disk = short if self.boots[short] == 1 else f"{short}.{self.boots[short]}"
        hosts = []
        for w in range(workers):
            if self.only is not None and not self.only(resource, kind, first_worker + w):
                continue
            name = f"t1v-n-{abs(hash(resource)) % 10**8:08d}-w-{w}" if kind == "tpu-vm" else hostname or short
            hosts.append(Host(self.root / disk / f"w{w}", name, first_worker + w, script, service_account,
                              accelerator, self.gcs, self.env, image, kind=kind, tpu_env=tpu_env,
                              attributes=attributes, agent_worker_number=agent_worker_number))
        self.hosts[resource] = hosts

    def power_off(self, resource: str) -> None:
        for h in self.hosts.pop(resource, []):
            h.stop()

    def stop_all(self) -> None:
        for r in list(self.hosts):
            self.power_off(r)
