"""Sizes and rows as the user reads them (issue 40): one unit system, a hard-linked file counted once, `download`
saying what it fetches, `status` rows unique with what was spent and what is left."""
import json
import os

from tests.jobs import make_job

JOB = "import os\nopen(os.path.join(os.environ['TPUCTL_OUTPUT_DIR'], 'out.bin'), 'wb').write(b'x' * 300_000)\n"


def _job_with_data(tmp_path):
    job = make_job(tmp_path, JOB, 'data = ["big.bin"]\n')
    (job / "big.bin").write_bytes(os.urandom(1_000_000))
    return job


def test_a_file_linked_into_several_runs_counts_once(local_up, cli, tmp_path):
    local_up("du")
    job = _job_with_data(tmp_path)
    for _ in range(3):   # one blob, linked into three runs' data
        assert cli("submit", str(job), "-c", "du")[0] == 0
    assert cli("down", "-c", "du", "--yes")[0] == 0
    [row] = [r for r in json.loads(cli("ls", "--json")[1]) if r["name"] == "du"]
    assert 1_000_000 < row["store_bytes"] < 2_500_000, row   # 1 MB once, 3 x 0.3 MB outputs, the rest is small
    code, out, err = cli("ls")
    assert " MB kept" in out + err and "MiB" not in out + err


def test_one_unit_system_in_dry_run_and_upload(local_up, cli, tmp_path):
    local_up("units")
    job = _job_with_data(tmp_path)
    code, out, err = cli("submit", str(job), "-c", "units", "--dry-run")
    assert code == 0 and "1.0 MB" in out and "iB" not in out + err
    code, out, err = cli("submit", str(job), "-c", "units")
    assert code == 0 and "1.0 MB" in err and "iB" not in err


def test_download_says_what_it_downloads(local_up, cli, tmp_path):
    local_up("dl")
    job = _job_with_data(tmp_path)
    assert cli("submit", str(job), "-c", "dl")[0] == 0
    run = json.loads(cli("jobs", "-c", "dl", "--json")[1])[0]["id"]
    code, out, err = cli("download", run, "-c", "dl", "-o", str(tmp_path / "got"))
    assert code == 0, err
    assert f"run {run}'s outputs: downloading 300.0 kB" in err and "data downloading" not in err


def test_status_rows_are_unique_and_show_spent_and_left(local_up, cli, monkeypatch):
    monkeypatch.setenv("TPUCTL_PRICE_PER_HOUR", "2")
    local_up("rows")
    assert cli("up", "-c", "rows", "--budget", "5", "--yes")[0] == 0
    code, out, err = cli("status", "-c", "rows")
    assert code == 0, err
    names = [line.split()[0] for line in out.splitlines()[1:] if line.strip()]
    assert len(names) == len(set(names)), out
    assert {"cost_so_far_usd", "spent_usd", "left_usd", "budget_usd"} <= set(names), out
    assert "state=READY" in next(line for line in out.splitlines() if line.startswith("store"))


def test_hashing_shows_progress_once_and_only_where_it_takes_time(local_up, cli, tmp_path, monkeypatch):
    local_up("hash")
    job = _job_with_data(tmp_path)
    code, out, err = cli("submit", str(job), "-c", "hash")
    assert code == 0 and "data: hashing" not in err      # 1 MB: under TPUCTL_HASH_PROGRESS_BYTES (8 MB)
    (job / "big.bin").write_bytes(os.urandom(1_000_000))
    monkeypatch.setenv("TPUCTL_HASH_PROGRESS_BYTES", "500000")
    code, out, err = cli("submit", str(job), "-c", "hash")
    assert code == 0 and "data: hashing 1.0 MB" in err
    code, out, err = cli("submit", str(job), "-c", "hash")
    assert code == 0 and "data: hashing" not in err      # hashed before: the md5 cache answers


def test_a_dry_run_shows_its_hashing_too(local_up, cli, tmp_path, monkeypatch):
    local_up("dryhash")
    monkeypatch.setenv("TPUCTL_HASH_PROGRESS_BYTES", "500000")
    code, out, err = cli("submit", str(_job_with_data(tmp_path)), "-c", "dryhash", "--dry-run")
    assert code == 0 and "data: hashing 1.0 MB" in err
