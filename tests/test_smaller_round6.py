"""Issue 63, item 6: the smaller things a new user saw."""
import os
import stat
import time

from jobs import make_job

OUTPUT_JOB = """
import os
out = os.environ["TPUCTL_OUTPUT_DIR"]
os.makedirs(os.path.join(out, "ckpt"), exist_ok=True)
open(os.path.join(out, "ckpt", "model.txt"), "w").write("weights")
"""


def test_the_dry_run_warns_about_a_large_job_folder_as_submit_does(local_up, cli, tmp_path, monkeypatch):
    monkeypatch.setenv("TPUCTL_PACKAGE_WARN_BYTES", "100000")
    job = make_job(tmp_path, "print(1)\n")
    (job / "weights.bin").write_bytes(b"\0" * 300_000)
    code, out, err = cli("submit", str(job), "--dry-run", "-c", "nosuch")
    assert code == 0 and "list large inputs under `data`" in " ".join(err.split()), err


def test_the_upload_line_shows_the_time_the_upload_took(local_up, cli, tmp_path, monkeypatch):
    from tpuctl.core.store import LocalStore
    local_up("t")
    slow = LocalStore.upload_file

    def upload(self, *a, **k):
        time.sleep(1.3)
        return slow(self, *a, **k)
    monkeypatch.setattr(LocalStore, "upload_file", upload)
    code, out, err = cli("submit", str(make_job(tmp_path, "print(1)\n")), "-c", "t")
    line = next(ln for ln in err.splitlines() if "uploaded" in ln and "package" in ln)
    assert code == 0 and line.endswith("(1s)"), err


def test_downloaded_files_get_the_users_modes_and_no_lock_file_is_left(local_up, cli, tmp_path):
    local_up("d")
    assert cli("submit", str(make_job(tmp_path, OUTPUT_JOB)), "-c", "d")[0] == 0
    old = os.umask(0o022)   # the user's shell's umask (tpuctl sets its own 0077 for what it keeps)
    try:
        dest = tmp_path / "out" / "run"
        code, out, err = cli("download", "-c", "d", "-o", str(dest))
    finally:
        os.umask(old)
    assert code == 0, err
    assert stat.S_IMODE((dest / "ckpt" / "model.txt").stat().st_mode) == 0o644
    assert all(stat.S_IMODE(d.stat().st_mode) == 0o755 for d in (tmp_path / "out", dest, dest / "ckpt"))
    assert sorted(p.name for p in dest.iterdir()) == [".tpuctl-downloaded.json", "ckpt"]


def test_the_tpu7x_price_line_reads_the_same_on_compute_engine_and_gke(env, cli):
    said = "unknown: tpu7x-8 has no price in tpuctl's catalog (cloud.google.com/tpu/pricing)"
    for provider in ("gcp", "gke"):
        code, out, err = cli("up", "-c", "p", "--provider", provider, "--type", "tpu7x-8", "--zone", "us-central1-c",
                             "--project", "proj-one", "--dry-run")
        assert code == 0 and said in " ".join(err.split()), err


def test_tpu7x_zones_are_checked_on_gke_as_on_compute_engine(env, cli):
    for provider in ("gcp", "gke"):
        code, out, err = cli("up", "-c", "z", "--provider", provider, "--type", "tpu7x-8", "--zone", "europe-west9-a",
                             "--project", "proj-one", "--dry-run")
        assert code == 2 and "tpu7x-8 is not offered in europe-west9-a" in err and "us-central1-c" in err, err
