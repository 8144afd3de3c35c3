"""What a Kaggle session is given: the run's inputs as a dataset (`payload`), the script it runs (`render`: the
session script, tpuctl/host/session.py, with the run's values as JSON data after it), and its limits: how long the
job may run in it, its grace to save, the TensorFlow it installs.

The inputs are uploaded so that Kaggle's unpacking of archives cannot touch them (kaggle-cli PR #111: `.zip` and
`.tar` uploads arrive as folders; issues #292, #406): each file is named `<name>.bin` and begins with session.MAGIC,
so neither its name nor its first bytes make it an archive whichever way the backend decides, and a manifest
(sizes and sha256 of what was uploaded) goes with them, named for the inputs' hash: it is also the marker the
session finds them by, wherever Kaggle mounts the dataset.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ...core import backends, knobs
from ...core.jobspec import DEFAULT_TENSORFLOW
from ...core.runs import RunSpec

TPU_SESSION = 9 * 3600      # Kaggle's TPU session limit (kaggle.com/docs/tpu: 9 hours a session, 20 a week)
OTHER_SESSION = 12 * 3600   # GPU and CPU sessions (kaggle.com/docs/notebooks: 12 hours)
MARGIN = 15 * 60            # stopped this long before the limit: time to write the checkpoint and the output
CONTINUE_CODE = 85        # a job's "checkpoint written, continue in the next session"
CONTINUE_MARK = "tpuctl-continue"
EXIT_MARK = "tpuctl-exit"
OUTPUT = "output"         # under /kaggle/working: the job's TPUCTL_OUTPUT_DIR
STORE = "store"           # under /kaggle/working: TPUCTL_STORE, what a job shares across its sessions (the BERT
                          # job's prepared data: prepared once per run, not once per session)
NAMES = {"output": OUTPUT, "store": STORE, "exit": EXIT_MARK, "continue_mark": CONTINUE_MARK,
         "continue_code": CONTINUE_CODE}
_SESSION = Path(__file__).resolve().parents[2] / "host" / "session.py"
MAGIC = b"tpuctl payload 1\n"   # session.MAGIC (this room may not import host/; a test checks they agree)


def payload(job_package: bytes, wheel: bytes, data_tar: bytes) -> tuple[str, dict[str, bytes]]:
    """(digest, the dataset's files): the same inputs always make the same digest and bytes."""
    files = {"job.tar.gz.bin": MAGIC + job_package, "tpuctl.whl.bin": MAGIC + wheel, "data.tar.bin": MAGIC + data_tar}
    digest = hashlib.sha256(b"".join(hashlib.sha256(files[n]).digest() for n in sorted(files))).hexdigest()[:16]
    manifest = {"files": {n: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in files.items()}}
    files[manifest_name(digest)] = json.dumps(manifest, indent=1, sort_keys=True).encode()
    return digest, files


def manifest_name(digest: str) -> str:
    return f"tpuctl-inputs-{digest}.json"


def session_marker(run_id: str, session: int) -> str:
    """The file a session writes first into its output: the next session finds that output by it."""
    return f"tpuctl-{run_id}-s{session}.json"


def source() -> str:
    """The session script's text (its main() is called by what `render` appends)."""
    return _SESSION.read_text()


def config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The session's values as the script reads them: `cfg` (run_id, digest, session, previous: whether a previous
    session's output is attached, command, args, env, requirements, framework, tensorflow, accelerator, deadline,
    grace) with the names and markers derived from it."""
    out = {k: v for k, v in cfg.items() if k not in ("digest", "previous")}
    out.update(names=NAMES, manifest=manifest_name(cfg["digest"]), marker=session_marker(cfg["run_id"], cfg["session"]),
               previous_marker=session_marker(cfg["run_id"], cfg["session"] - 1) if cfg.get("previous") else "")
    return out


def render(script: str, cfg: dict[str, Any]) -> str:
    """The kernel's text: the session script (`source()`), then one call of its main() with the values as a JSON
    string literal (json.dumps then repr: any text of the job's stays data)."""
    return script + f"\n\nsys.exit(main(json.loads({json.dumps(config(cfg))!r})))\n"


def session_seconds(shape: str) -> float:
    """How long a session may run before the script stops its job (TPUCTL_KAGGLE_SESSION_SECONDS overrides)."""
    return knobs.number("TPUCTL_KAGGLE_SESSION_SECONDS",
                         (TPU_SESSION if shape.startswith("Tpu") else OTHER_SESSION) - MARGIN)


def grace_seconds() -> float:
    """After the job's deadline, how long it has to save and stop itself before it is stopped
    (TPUCTL_KAGGLE_GRACE_SECONDS, 120; part of the margin before Kaggle's limit)."""
    return knobs.number("TPUCTL_KAGGLE_GRACE_SECONDS", 120)


def tensorflow_for(job: RunSpec, shape: str) -> str:
    """The TensorFlow a session installs for the job: on a TPU, a TensorFlow job's own (Kaggle's TPU image has only
    tensorflow-cpu: Kaggle/docker-python tpu/requirements.in, "re-enable tensorflow-tpu when a compatible libtpu can
    be found"); elsewhere "" (the image's: Kaggle's GPU and CPU images ship TensorFlow). A Keras 3 job runs on
    the image's JAX (core/backends.py) unless it forces the TensorFlow backend."""
    keras_on_tf = job.framework == "keras" and backends.forced(job.env, job.keras_backend)[0] == "tensorflow"
    if (job.framework != "tensorflow" and not keras_on_tf) or not shape.startswith("Tpu"):
        return ""
    return job.tensorflow or DEFAULT_TENSORFLOW
