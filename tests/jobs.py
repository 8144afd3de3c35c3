"""Small job directories the run tests submit."""
import json
import textwrap
from pathlib import Path


def make_job(root: Path, body: str, toml_extra: str = "", name: str = "job") -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "tpuctl.toml").write_text('command = "python main.py"\n' + toml_extra)
    (d / "main.py").write_text(textwrap.dedent(body))
    return d


ENV_JOB = """
import json, os, sys
keys = ["TPUCTL_RUN_ID", "TPUCTL_STORE", "TPUCTL_DATA_DIR", "TPUCTL_OUTPUT_DIR", "TPUCTL_ACCELERATOR", "TPUCTL_TPU",
        "GREETING"]
print(json.dumps({k: os.environ.get(k) for k in keys} | {"argv": sys.argv[1:]}))
data = os.environ["TPUCTL_DATA_DIR"]
if not data.startswith("gs://"):
    print("corpus:", open(os.path.join(data, "corpus.txt")).read().strip())
    out = os.environ["TPUCTL_OUTPUT_DIR"]
    open(os.path.join(out, "model.txt"), "w").write("weights")
sys.exit(int(os.environ.get("EXIT", "0")))
"""

# 100,000 numbered lines alternating stdout/stderr, partial lines and \r progress updates: every byte once, in order.
FIDELITY_JOB = """
import os
w = os.write
for i in range(100000):
    fd = 1 if i % 2 else 2
    if i % 1000 == 0:
        w(fd, b"partial-")
        w(fd, b"%d\\r50%%\\r100%%\\n" % i)
    else:
        w(fd, b"line %06d\\n" % i)
w(1, b"no newline at the end")
"""


def fidelity_expected() -> bytes:
    out = []
    for i in range(100000):
        out.append(b"partial-%d\r50%%\r100%%\n" % i if i % 1000 == 0 else b"line %06d\n" % i)
    out.append(b"no newline at the end")
    return b"".join(out)


SLEEP_JOB = """
import time
print("started", flush=True)
time.sleep(120)
"""


def tpuctl_within(seconds: float, *args: str) -> tuple[int, str, str]:
    """The real CLI in its own process, killed past `seconds`: a command that should give up but waits forever
    fails the test instead of hanging the suite."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "tpuctl", *args], capture_output=True, text=True, timeout=seconds,
                       stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout, r.stderr


def submit_to_store(store, job_dir: Path) -> str:
    """What `tpuctl submit` writes, straight into a store: the package and the run's job.json."""
    from tpuctl.core import layout, packaging, runindex, runs
    pkg, sha = packaging.build(job_dir)
    store.create(layout.job_package(sha), pkg)
    run_id = runs.new_id()
    store.create(layout.run_job(run_id), json.dumps(
        runs.RunSpec(id=run_id, name="job", command="python main.py", package=sha).to_json()).encode())
    runindex.register(store, run_id)
    return run_id


def make_wheel(dest: Path, name: str, version: str, module_src: str) -> Path:
    """A pure-Python wheel written by hand (no build backend, no network): `name`.py holding module_src."""
    return build_wheel(dest, name, version, {f"{name}.py": module_src})


def build_wheel(dest: Path, dist_name: str, version: str, files: dict, requires=(), extras=()) -> Path:
    """A pure-Python wheel of distribution `dist_name` holding `files` (path -> text), with Requires-Dist lines (and
    the Provides-Extra lines that name the extras they use)."""
    import base64
    import hashlib
    import zipfile
    stem = dist_name.replace("-", "_")
    dist = f"{stem}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires) + "".join(f"Provides-Extra: {e}\n" for e in extras)
    files = {**files, f"{dist}/METADATA": metadata,
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    path = dest / f"{stem}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            data = text.encode()
            z.writestr(n, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{n},sha256={digest},{len(data)}")
        z.writestr(f"{dist}/RECORD", "\n".join(record + [f"{dist}/RECORD,,"]) + "\n")
    return path
