"""What a first run on a TPU VM made on a base runtime pays for its TensorFlow, and what a second run (or a rebooted
host) pays: the agent's own install step (host/jobenv.py: tensorflow-tpu from the index, tf-keras with --no-deps)
run against a local HTTP index of the REAL wheels (tensorflow-tpu 2.20.0 and its dependencies, ~1 GB, fetched
from PyPI once into ~/.cache/tpuctl-bench-wheels), on an interpreter with no TensorFlow of its own, as on a base
runtime. Baseline in the same run: the cached second run. It also checks, on the real wheels, that the job's
environment ends with exactly one distribution of `tensorflow` (tensorflow-tpu) and that tf-keras is there.

    python bench/bench_tf_install.py
"""
import functools
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pip

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path.home() / ".cache" / "tpuctl-bench-wheels"
WANT = ["tensorflow-tpu==2.20.0", "tf-keras==2.20.1"]
PLATFORMS = ["manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_27_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64", "any"]


def wheels() -> Path:
    if not any(CACHE.glob("tensorflow_tpu-2.20.0-*.whl")):
        CACHE.mkdir(parents=True, exist_ok=True)
        ver = f"{sys.version_info.major}.{sys.version_info.minor}"
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(CACHE), *WANT, "--python-version",
                        ver, "--only-binary=:all:", *(a for p in PLATFORMS for a in ("--platform", p))], check=True)
    return CACHE


def bare_host(tmp: Path) -> Path:
    venv = tmp / "host-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "tpuctl-checkout.pth").write_text(str(ROOT) + "\n")
    shutil.copytree(Path(pip.__file__).parent, site / "pip")
    return venv / "bin" / "python"


def main():
    index = wheels()
    size = sum(p.stat().st_size for p in index.glob("*.whl"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(
        type("Quiet", (SimpleHTTPRequestHandler,), {"log_message": lambda *a: None}), directory=str(index)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    tmp = Path(tempfile.mkdtemp())
    py = bare_host(tmp)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": url,
           "TPUCTL_TF_FIND_LINKS": url, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    gen = ("import sys; from pathlib import Path; from tpuctl.host import jobenv\n"
           "env = jobenv.env_dir(Path(sys.argv[1]), b'', b'tensorflow-tpu~=2.20.0')\n"
           "print(jobenv.script(env, '', Path('/dev/null'), '2.20')); print('#ENV', env)")
    script = subprocess.run([str(py), "-c", gen, str(tmp / "agent")], env=env, capture_output=True, text=True,
                            check=True).stdout
    envdir = script.rsplit("#ENV ", 1)[1].strip()
    times = []
    for _ in range(2):
        t = time.monotonic()
        subprocess.run(["bash", "-c", "set -e\n" + script], env=env, check=True, stdout=subprocess.DEVNULL)
        times.append(time.monotonic() - t)
    check = subprocess.run([f"{envdir}/bin/python", "-c",
                            "import importlib.metadata as m, json; d = m.packages_distributions(); print(json.dumps("
                            "[sorted(set(d.get('tensorflow', []))), sorted(set(d.get('tf_keras', [])))]))"],
                           env=env, capture_output=True, text=True, check=True)
    tf_dists, keras_dists = ([n.lower().replace("_", "-") for n in d] for d in json.loads(check.stdout))
    print(f"index: {len(list(index.glob('*.whl')))} wheels, {size / 1e9:.2f} GB (tensorflow-tpu 2.20.0 and its "
          "dependencies)")
    print(f"first run on a fresh host: {times[0]:.1f} s to install; second run (or after a reboot): "
          f"{times[1] * 1000:.0f} ms (the environment is found ready)")
    print(f"distributions of `tensorflow` in the job's environment: {tf_dists}; tf_keras from {keras_dists}")
    assert tf_dists == ["tensorflow-tpu"] and keras_dists == ["tf-keras"], (tf_dists, keras_dists)
    server.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
