"""The host start-up script on a simulated fresh TPU VM (tests/fakes/tpu_host.py), outside `up`: a failed boot
lands in the store, and a second boot (a reboot, or the script run again) keeps what is in place."""
from conftest import PROJECT, until

import subprocess

from fakes.tpu_host import Host, python3
from tpuctl.providers import agent_package
from tpuctl.core.models import OBJECT_ROLES
from tpuctl.providers.google.gcs_store import STORAGE
from tpuctl.providers.gcp.startup import render

BUCKET = "boot-test"
SA = "trainer@test-proj.iam.gserviceaccount.com"


def _bucket(with_package: bool):
    from google.cloud import storage
    client = storage.Client(project=PROJECT)
    b = client.create_bucket(BUCKET, location="us-central1")
    policy = b.get_iam_policy(requested_policy_version=3)
    policy.version = 3
    for role in OBJECT_ROLES:
        policy.bindings.append({"role": role, "members": {f"serviceAccount:{SA}"}})
    b.set_iam_policy(policy)
    if with_package:
        b.blob(agent_package.key()).upload_from_string(agent_package.build())
    return b


def _boot(cloud, tmp_path, name="w0", image="ubuntu", role="tpu-vm", dpkg_busy=2.0, storage_req=STORAGE, **env):
    script = render(f"gs://{BUCKET}", "boot", role, "v3-8", "local").replace(f'STORAGE_REQ="{STORAGE}"',
                                                                           f'STORAGE_REQ="{storage_req}"')
    return Host(tmp_path / name, "t1v-n-boot-w-0", 0, script, SA, "v3-8", cloud.gcs,
                {"TPUCTL_BOOT_RETRY_SECONDS": "60", **env}, image=image, dpkg_busy=dpkg_busy)


def _wait(host, text, timeout=60):
    def said():
        return host.boot_log() + (host.root / "startup.out").read_text()
    until(lambda: text in host.boot_log() or host.script.poll() not in (None, 0), timeout, said)   # or it failed
    assert text in host.boot_log(), said()


def test_a_failed_boot_is_logged_into_the_store(cloud, tmp_path):
    b = _bucket(with_package=False)
    host = _boot(cloud, tmp_path, TPUCTL_BOOT_RETRY_SECONDS="3")
    try:
        assert host.script.wait(60) == 1
        log = b.blob("tpuctl/boot/t1v-n-boot-w-0.log").download_as_text()
        assert "waiting for the agent package in the store" in log and "404" in log
        assert log.rstrip().endswith("FAILED: agent package not in the store")
    finally:
        host.stop()


def test_a_second_boot_keeps_what_is_in_place(cloud, tmp_path):
    _bucket(with_package=True)
    host = _boot(cloud, tmp_path)
    try:
        _wait(host, "agent running")
        # the image's google-cloud-storage is in the agent's range: kept, pip not asked
        assert f"{STORAGE}: google-cloud-storage 3." in host.boot_log() and "pip install google" not in host.boot_log()
        pid = (host.root / "etc/systemd/system/agent.pid").read_text()
        again = _boot(cloud, tmp_path)          # the same disk boots again
        assert again.script.wait(60) == 0
        second = again.boot_log().split("boot: cluster boot")[-1]
        assert "python environment" in second and "already there" in second
        assert "agent 0.1.0 already installed" in second and "fetching" not in second
        assert (host.root / "etc/systemd/system/agent.pid").read_text() == pid   # still the one agent
        again.metadata.stop()
    finally:
        host.stop()


def test_a_store_client_out_of_the_agents_range_is_asked_of_pip(cloud, tmp_path):
    """A range the image's copy does not meet goes to pip (which has none to give here: the boot fails, saying so)."""
    _bucket(with_package=True)
    host = _boot(cloud, tmp_path, storage_req="google-cloud-storage>=99", TPUCTL_BOOT_RETRY_SECONDS="3")
    try:
        assert host.script.wait(60) == 1
        log = host.boot_log()
        assert "giving up on pip install google-cloud-storage>=99" in log, log   # asked of pip
        assert log.rstrip().endswith("FAILED: pip install google-cloud-storage>=99"), log
    finally:
        host.stop()


def test_a_debian_image_without_pip_gets_python3_venv_from_apt(cloud, tmp_path):
    """Debian 12's cloud image (the watcher's VM) has no pip and no ensurepip: `venv --without-pip` succeeds there
    and leaves a venv with no pip, so the script installs python3-venv (waiting on the dpkg lock that
    unattended-upgrades holds at boot) and makes the venv again with its own pip."""
    _bucket(with_package=True)
    host = _boot(cloud, tmp_path, image="debian-12", dpkg_busy=6.0)   # apt must wait for the lock
    try:
        _wait(host, "agent running", timeout=120)
        log = host.boot_log()
        assert "installed python3-venv; python environment" in log and "with its own pip" in log
        assert "giving up" not in log and "FAILED" not in log
        assert "waiting for apt-get" not in log, log    # apt waited on unattended-upgrades' lock, did not fail on it
        assert (host.root / "var/lib/dpkg/info/python3-venv.list").exists()
        again = _boot(cloud, tmp_path, image="debian-12")          # a reboot keeps the venv and its pip
        assert again.script.wait(60) == 0
        assert "already there" in again.boot_log().split("boot: cluster boot")[-1]
        again.metadata.stop()
    finally:
        host.stop()


def test_the_images_venv_with_pip_is_made_once_and_each_copy_is_its_own(tmp_path):
    """The simulated image's `python3 -m venv --clear DIR` copies a venv made once (ensurepip's seconds of CPU at
    every boot): each copy must be the venv python would make there, its pip its own."""
    (tmp_path / "var/lib/dpkg/info").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/info/python3-venv.list").touch()
    shim = tmp_path / "python3"
    shim.write_text(python3("debian-12").replace("@ROOT@", str(tmp_path)))
    shim.chmod(0o755)
    for name in ("a", "b"):
        subprocess.run([str(shim), "-m", "venv", "--system-site-packages", "--clear", str(tmp_path / name)],
                       check=True)
    a, b = tmp_path / "a", tmp_path / "b"
    assert f"-m venv --clear {b}\n" in (b / "pyvenv.cfg").read_text()
    assert (b / "bin/pip").read_text().startswith(f"#!{b}/bin/python")
    assert f'VIRTUAL_ENV="{b}"' in (b / "bin/activate").read_text()
    where = subprocess.run([b / "bin/pip", "--version"], capture_output=True, text=True, check=True).stdout
    assert f"from {b}/lib/" in where, where
    prefix = subprocess.run([b / "bin/python", "-c", "import sys; print(sys.prefix)"], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert prefix == str(b) and not (a / "pyvenv.cfg").read_text().count(str(b))   # pip installs into b alone
    # the image's site is the venv's system site, as before
    assert subprocess.run([b / "bin/python", "-c", "import google.cloud.storage"]).returncode == 0


def test_the_scripts_url_encoding_and_token_reading_match_pythons():
    """enc and token are bash (a python3 start each cost more than the request): enc gives what
    urllib.parse.quote(name, safe="") gives, UTF-8 bytes included; token reads the metadata server's JSON."""
    import subprocess
    import urllib.parse
    script = render("gs://b", "c", "tpu-vm", "v3-8", "local")
    functions = script[script.index("\nenc() {"):script.index("\n# Cloud Storage JSON API")]
    names = ["tpuctl/boot/t1v-n-1234-w-0.log", "a b+c&d=é/ü?#%", "x~y_z.Q-1", "漢字 $x \\ '\"", ""]
    meta = 'meta() { echo \'{"access_token": "token-of-a@b.iam", "expires_in": 3599, "token_type": "Bearer"}\'; }'
    program = (f"set -euo pipefail\n{meta}\n{functions}\n" + "".join(f'enc "${i + 1}"\n' for i in range(len(names)))
               + "token\n")
    r = subprocess.run(["bash", "-c", program, "bash", *names], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:-1] == [urllib.parse.quote(n, safe="") for n in names] + ["token-of-a@b.iam"]
