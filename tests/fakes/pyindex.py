"""A local package index: stand-ins for what Google's libtpu TF release index and PyPI serve, as wheels built here and
served over HTTP as a find-links page (pip reads the links of a directory listing), so installs on the simulated
hosts and agents go through a real pip against a real HTTP index with no network.

- tensorflow-tpu X: the `tensorflow` package under the distribution name Google's TPU harness installs
  (GoogleCloudPlatform/ml-auto-solutions, configs/tensorflow/common.py install_tf: `pip install tensorflow-tpu==X -f
  https://storage.googleapis.com/libtpu-tf-releases/index.html`). Its `tf.keras` is tf_keras when
  TF_USE_LEGACY_KERAS=1, as in TensorFlow >= 2.16.
- tensorflow-tpu also requires `libtpu~=0.0.14`, as the real 2.20.0 wheel declares (PyPI METADATA of
  tensorflow-tpu 2.20.0, ../shared/KAGGLE_FACTS.md; the 2.19 stand-in is given the same requirement, unchecked), so a
  libtpu installed outside the job's environment (Kaggle's TPU image's 0.0.17) satisfies it and pip installs none.
- libtpu X: a `libtpu` package as the real wheels lay it out (libtpu 0.0.42.1's libtpu/__init__.py:
  `get_library_path()` is `libtpu.so` beside the module, and importing it sets TPU_LIBRARY_PATH unless set), with a
  `libtpu.so` file. 0.0.14 (what tensorflow-tpu resolves to alone), 0.0.17 (Kaggle's TPU image), 0.0.42.1 (what
  jax[tpu] 0.10.2 pins).
- jax 0.10.2: its `tpu` extra requires `libtpu==0.0.42.*`, as jax 0.10.2's METADATA declares
  (`Requires-Dist: libtpu==0.0.42.*; extra == "tpu"`); `jax.devices()` lists the simulated TPU's cores when a libtpu
  imports, else one CPU. No real computation: it stands in where a test asks what was installed.
- tf-keras X: requires `tensorflow` by that name, as the real wheels do (tf_keras 2.20.1 METADATA:
  `Requires-Dist: tensorflow<2.21,>=2.20`).
- tensorflow X: PyPI's TensorFlow. An install that pulls it beside tensorflow-tpu leaves two distributions of
  `tensorflow` behind, which is what the tests look for.
- keras (PyPI's, as this environment installed it: `WheelIndex.serve_installed`): a job that needs Keras 3 on JAX
  installs it from the index, as a real host installs it from PyPI (no TPU image has it: tpu_host.py), so the real
  library, not a stand-in, is what runs there.
- tensorflow-cpu X: what the legacy TPU Node's companion VM installs to match the node (the fake TPU API's
  TensorFlow versions), and what Kaggle's TPU image holds (KAGGLE_TPU_TF: Kaggle/docker-python tpu/requirements.in,
  `tensorflow-cpu==${TENSORFLOW_VERSION}`, 2.20.0 in tpu/config.txt).

Each stand-in answers the calls a TPU check makes (TPUClusterResolver(tpu="local"), initialize_tpu_system,
config.list_logical_devices): a simulated TPU (FAKE_TPU_CORES, set by the fake Kaggle's TPU sessions) shows only to
tensorflow-tpu loaded through PJRT (TF_PLUGGABLE_DEVICE_LIBRARY_PATH set, as Google's harness sets it for a
pip-installed tensorflow-tpu); a path set there that names no file fails `import tensorflow` with FileNotFoundError,
as TensorFlow's `load_pluggable_device_library` does at import (KAGGLE_FACTS.md, reproduced with TF 2.21);
tensorflow-cpu and PyPI's tensorflow see the CPU alone, as they do on a TPU VM
(Kaggle/docker-python PR #1499: "No TPU platform found").
"""
from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

from fakes.tpu_server import TF_VERSIONS
from fakes.wire import QuietHandler, serve
from jobs import build_wheel

KAGGLE_TPU_TF = "2.20.0"
KAGGLE_LIBTPU = "0.0.17"                   # Kaggle's TPU image (issue 36; Kaggle/docker-python tpu/Dockerfile)
TPU_TF_LIBTPU = "libtpu~=0.0.14"           # tensorflow-tpu 2.20.0's Requires-Dist
LIBTPU_VERSIONS = ("0.0.14", KAGGLE_LIBTPU, "0.0.42.1")
JAX, JAX_LIBTPU = "0.10.2", "0.0.42.*"     # jax 0.10.2 METADATA: Requires-Dist: libtpu==0.0.42.*; extra == "tpu"
LINES = {"2.19": ("2.19.1", "2.19.0"), "2.20": ("2.20.0", "2.20.1")}   # line -> (tensorflow[-tpu], tf-keras)


_TF = '''import os as _os
from types import SimpleNamespace as _NS

__version__ = "{version}"
__distribution__ = "{dist}"
if _os.environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH") and \
        not _os.path.exists(_os.environ["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"]):
    raise FileNotFoundError(2, "No such file or directory", _os.environ["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"])


def _tpu_cores():
    if __distribution__ != "tensorflow-tpu" or not _os.environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH"):
        return 0
    return int(_os.environ.get("FAKE_TPU_CORES") or 0)


def _initialize_tpu_system(resolver):
    if not _tpu_cores():
        raise RuntimeError("No TPU platform found")


def _devices(kind=None):
    found = [_NS(name="/device:CPU:0", device_type="CPU")] + \
        [_NS(name=f"/device:TPU:{{i}}", device_type="TPU") for i in range(_tpu_cores())]
    return [d for d in found if kind in (None, d.device_type)]


config = _NS(list_logical_devices=_devices)
distribute = _NS(cluster_resolver=_NS(TPUClusterResolver=lambda tpu=None: _NS(tpu=tpu)))
tpu = _NS(experimental=_NS(initialize_tpu_system=_initialize_tpu_system))
# Keras 3's keras.utils.set_random_seed calls tf.random.set_seed whenever TensorFlow imports, whatever the backend
# (keras/src/utils/rng_utils.py `set_random_seed`): Kaggle's TPU image has tensorflow-cpu, so a JAX job there calls it
random = _NS(set_seed=lambda seed: None)


def __getattr__(name):
    if name == "keras":
        import importlib
        import os
        if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
            return importlib.import_module("tf_keras")
        raise AttributeError("this stand-in has no Keras 3: set TF_USE_LEGACY_KERAS=1 and install tf-keras")
    if name == "io":   # TensorBoard's writer files events through tf.io.gfile wherever TensorFlow imports (a JAX job on
        # Kaggle's TPU image, which has tensorflow-cpu): TensorBoard's own copy of that API stands in for it
        from tensorboard.compat.tensorflow_stub import io
        return io
    raise AttributeError(name)
'''


_LIBTPU = '''import os

__version__ = "{version}"


def get_library_path():
    return os.path.join(os.path.dirname(__file__), "libtpu.so")


if not os.environ.get("TPU_LIBRARY_PATH"):
    os.environ["TPU_LIBRARY_PATH"] = get_library_path()
'''

_JAX = '''import importlib.util as _u
import os as _os
from types import SimpleNamespace as _NS

__version__ = "{version}"


def devices():
    if _u.find_spec("libtpu") and _os.environ.get("FAKE_TPU_CORES"):
        return [_NS(platform="tpu", id=i) for i in range(int(_os.environ["FAKE_TPU_CORES"]))]
    return [_NS(platform="cpu", id=0)]
'''


def build(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for line, (tf, keras) in LINES.items():
        nxt = f"{line.split('.')[0]}.{int(line.split('.')[1]) + 1}"
        for dist in ("tensorflow-tpu", "tensorflow"):
            build_wheel(dest, dist, tf, {"tensorflow/__init__.py": _TF.format(version=tf, dist=dist)},
                        requires=[TPU_TF_LIBTPU] if dist == "tensorflow-tpu" else [])
        build_wheel(dest, "tf-keras", keras, {"tf_keras/__init__.py": f'__version__ = "{keras}"\n'},
                    requires=[f"tensorflow<{nxt},>={line}"])
    for version in TF_VERSIONS + [KAGGLE_TPU_TF]:
        build_wheel(dest, "tensorflow-cpu", version,
                    {"tensorflow/__init__.py": _TF.format(version=version, dist="tensorflow-cpu")})
    for version in LIBTPU_VERSIONS:
        libtpu_wheel(dest, version)
    build_wheel(dest, "jax", JAX, {"jax/__init__.py": _JAX.format(version=JAX)},
                requires=[f'libtpu=={JAX_LIBTPU}; extra == "tpu"'], extras=["tpu"])
    return dest


def libtpu_wheel(dest: Path, version: str) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    return build_wheel(dest, "libtpu", version, {"libtpu/__init__.py": _LIBTPU.format(version=version),
                                                 "libtpu/libtpu.so": f"stand-in libtpu {version}\n"})


def installed_wheel(dest: Path, dist_name: str) -> Path:
    """A wheel of this environment's installed `dist_name`, pure Python (its WHEEL says Root-Is-Purelib: true and
    Tag: py3-none-any; anything else is refused): the files its RECORD lists, as the wheel that installed them held
    them. Left out: bytecode (__pycache__, which pip writes at install) and what an installer adds to .dist-info
    (INSTALLER, REQUESTED, direct_url.json: packaging.python.org "Recording installed projects" and "Recording the
    Direct URL Origin"); RECORD made again for what the wheel holds, with each file's sha256 and size, RECORD itself
    without (packaging.python.org "Binary distribution format", the .dist-info directory)."""
    import base64
    import hashlib
    import zipfile
    from importlib import metadata
    dist = metadata.distribution(dist_name)
    wheel = dist.read_text("WHEEL") or ""
    if "Root-Is-Purelib: true" not in wheel or "Tag: py3-none-any" not in wheel:
        raise ValueError(f"{dist_name} is not a pure-Python wheel: {wheel!r}")
    info = f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}.dist-info"
    installed_only = {f"{info}/{n}" for n in ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")}
    files = [f for f in dist.files or [] if "__pycache__" not in f.parts and str(f) not in installed_only
             and not str(f).startswith("..")]
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{info.removesuffix('.dist-info')}-py3-none-any.whl"
    part = path.with_name(path.name + ".part")   # the index lists the directory: never a half-written wheel
    record = []
    with zipfile.ZipFile(part, "w") as z:   # stored, not deflated: made once a session, read over loopback
        for f in files:
            data = f.read_binary()
            z.writestr(str(f), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{f},sha256={digest},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
    part.replace(path)
    return path


class WheelIndex:
    def __init__(self, root: Path) -> None:
        self.root = build(root)
        self._lock = threading.Lock()
        handler = functools.partial(_Quiet, directory=str(self.root))
        self.server = serve(handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def serve_installed(self, dist_name: str) -> None:
        """Serve this environment's `dist_name` from now on (installed_wheel; made once)."""
        with self._lock:
            if not list(self.root.glob(f"{dist_name.replace('-', '_')}-*.whl")):
                installed_wheel(self.root, dist_name)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Quiet(QuietHandler, SimpleHTTPRequestHandler):
    """Files from the index's directory (SimpleHTTPRequestHandler), with the fakes' quiet log."""
