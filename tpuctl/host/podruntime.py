"""TensorFlow on a multi-host slice made on a base runtime: every worker's TPU runtime set to the job's TensorFlow
before the program starts on worker 0.

On a slice, TensorFlow runs one program, on worker 0, which drives every host's TPU through the image's
`tpu-runtime.service` (GCP_FACTS §6). A base runtime's service was not made for the TensorFlow the job installs, so
Google's own CI, before each TensorFlow test on a pod made on `v2-alpha-tpuv5*` (its v4-32, v5e-16, v5p-32 tests),
runs on EVERY worker (xlml/apis/task.py: a `tf_` test's setup runs on all workers):

    sudo sed -i 's/TF_DOCKER_URL=.*/TF_DOCKER_URL=gcr.io\\/cloud-tpu-v2-images\\/grpc_tpu_worker:tf-X.Y.Z-pjrt"/' \\
        /etc/systemd/system/tpu-runtime.service
    sudo systemctl daemon-reload && sudo systemctl restart tpu-runtime

(GoogleCloudPlatform/ml-auto-solutions, dags/solutions_team/configs/tensorflow/common.py `set_up_pjrt`, X.Y.Z the
tensorflow-tpu it installed; `set_up_se` is the same with `-se` for StreamExecutor builds; tpuctl installs the PJRT
wheels of libtpu-tf-releases, host/jobenv.py.) Here the same, with the store as the channel between hosts:

1. worker 0, in the run's script once the job's TensorFlow is installed (so the exact X.Y.Z is known), writes the
   run's request (layout.run_tpu_runtime), re-points its own service and waits until every worker says it serves
   that image for this attempt (TPUCTL_RUNTIME_WAIT seconds, 600 by default); a worker that cannot, or a wait that
   runs out, fails the run before the program starts, with the reason in its log;
2. workers N > 0 look for that request while the run is unfinished (claims.py), re-point their service, and write
   what they serve (layout.tpu_runtime_served), which `status` shows.
The service is restarted only when its image changes: between two runs of one TensorFlow nothing restarts.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..core import knobs, layout

IMAGE = "gcr.io/cloud-tpu-v2-images/grpc_tpu_worker:tf-{version}-pjrt"
_URL = re.compile(r"TF_DOCKER_URL=.*")


def applies(record: dict[str, Any], framework: str) -> bool:
    """TensorFlow the host installs (a base runtime) on a TPU VM slice of more than one host."""
    return (framework == "tensorflow" and record.get("arch") == "vm" and record.get("tensorflow_from") == "pip"
            and int(record.get("hosts") or 1) > 1)


def unit() -> Path:
    return Path(os.environ.get("TPUCTL_UNIT_DIR") or "/etc/systemd/system") / "tpu-runtime.service"


def serving() -> str:
    """The image this host's tpu-runtime.service names ("" when it names none)."""
    try:
        m = _URL.search(unit().read_text())
    except OSError:
        return ""
    return m.group(0).removeprefix("TF_DOCKER_URL=").rstrip('"') if m else ""


def serve(image: str) -> bool:
    """Points this host's tpu-runtime.service at `image` as Google's CI does and restarts it; False when it already
    served it. Raises RuntimeError with the reason when the host cannot."""
    path = unit()
    try:
        text = path.read_text()
    except OSError as e:
        raise RuntimeError(f"no TPU runtime service to re-point on this host ({path}: {e.strerror})") from e
    if not _URL.search(text):
        raise RuntimeError(f"{path} names no TF_DOCKER_URL to re-point")
    if serving() == image:
        return False
    path.write_text(_URL.sub(lambda _: f'TF_DOCKER_URL={image}"', text))   # sed's replacement, quote included
    for cmd in (["systemctl", "daemon-reload"], ["systemctl", "restart", "tpu-runtime"]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return True


def read(store: Any, key: str) -> dict[str, Any] | None:
    raw = store.read(key)
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def report(store: Any, worker: int, host: str, stamp: str, image: str = "", error: str = "") -> None:
    store.write(layout.tpu_runtime_served(worker), json.dumps(
        {"worker": worker, "host": host, "image": image, "for": stamp, "error": error, "time": time.time()}).encode())


def follow(store: Any, worker: int, host: str, request: dict[str, Any]) -> str:
    """A worker N > 0's part: serve what the request asks, and say so (or why not). Returns the line to log."""
    try:
        changed = serve(request["image"])
        report(store, worker, host, request["for"], image=request["image"])
        return f"serving {request['image']} for run {request['for']}" + ("" if changed else " (already)")
    except RuntimeError as e:
        report(store, worker, host, request["for"], error=str(e))
        return f"cannot serve {request['image']} for run {request['for']}: {e}"


def lead(store: Any, run_id: str, attempt: int, workers: int, host: str, version: str, wait: float,
         poll: float = 1.0) -> str:
    """Worker 0's part: ask, serve, and wait for every worker. Returns what every worker serves; raises
    RuntimeError naming the workers that did not follow."""
    stamp, image = f"{run_id}#{attempt}", IMAGE.format(version=version)
    store.write(layout.run_tpu_runtime(run_id), json.dumps(
        {"for": stamp, "image": image, "tensorflow": version, "time": time.time()}).encode())
    print(f"tpuctl: every worker's TPU runtime to {image} (TensorFlow {version}), as Google's CI sets it up",
          flush=True)
    print(f"tpuctl: worker 0: {follow(store, 0, host, {'for': stamp, 'image': image})}", flush=True)
    deadline = time.monotonic() + wait
    while True:
        served = {w: read(store, layout.tpu_runtime_served(w)) or {} for w in range(workers)}
        now = {w: r for w, r in served.items() if r.get("for") == stamp}
        failed = [f"worker {w}: {r['error']}" for w, r in now.items() if r.get("error")]
        if failed:
            raise RuntimeError("; ".join(failed))
        missing = [w for w in range(workers) if w not in now]
        if not missing:
            return image
        if time.monotonic() >= deadline:
            raise RuntimeError(f"worker(s) {', '.join(map(str, missing))} did not switch their TPU runtime to "
                               f"{image} within {wait:g}s (TPUCTL_RUNTIME_WAIT); their agents may be down")
        time.sleep(poll)


def installed_tensorflow(python: str) -> str:
    done = subprocess.run([python, "-c", "from importlib.metadata import version; print(version('tensorflow-tpu'))"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"no tensorflow-tpu in the job's environment: {done.stderr.strip()[-300:]}")
    return done.stdout.strip()


def command(store_uri: str, run_id: str, attempt: int, workers: int, host: str, python: str) -> list[str]:
    """Worker 0's step in the run's script (attempt.py), after the job's TensorFlow is installed."""
    return [sys.executable, "-m", "tpuctl.host.podruntime", "--store", store_uri, "--run", run_id, "--attempt",
            str(attempt), "--workers", str(workers), "--host", host, "--python", python]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tpuctl.host.podruntime")
    for flag in ("--store", "--run", "--host", "--python"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--attempt", type=int, default=1)
    ap.add_argument("--workers", type=int, required=True)
    a = ap.parse_args(argv)
    from ..providers.stores import open_store
    try:
        lead(open_store(a.store), a.run, a.attempt, a.workers, a.host, installed_tensorflow(a.python),
             knobs.number("TPUCTL_RUNTIME_WAIT", 600))
    except RuntimeError as e:
        print(f"tpuctl: the slice cannot run this TensorFlow: {e}", flush=True)
        return 1
    print("tpuctl: every worker serves it; starting the program on worker 0", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
