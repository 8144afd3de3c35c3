"""Which Keras this job runs: Keras 3 on its backend (KERAS_BACKEND), or tf-keras for a Keras 2 job
(TF_USE_LEGACY_KERAS=1); and the version floors features need. TensorFlow is imported only when asked for."""
from __future__ import annotations

import importlib.util
import os
from typing import Any, MutableMapping


def prefer_legacy_keras(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set TF_USE_LEGACY_KERAS=1 (unless already set) only where tf-keras is installed: with the variable set and
    tf-keras absent, `tf.keras` itself fails to import. True when tf.keras will be tf-keras."""
    if importlib.util.find_spec("tf_keras") is None:
        return environ.get("TF_USE_LEGACY_KERAS") == "1"
    environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    return environ["TF_USE_LEGACY_KERAS"] == "1"


def legacy_keras() -> bool:
    """True for a tf-keras (Keras 2) job: TF_USE_LEGACY_KERAS=1 makes tf.keras tf-keras (TensorFlow >= 2.16)."""
    return os.environ.get("TF_USE_LEGACY_KERAS") == "1" and importlib.util.find_spec("tf_keras") is not None


def backend() -> str:
    """The Keras backend of this process: Keras 3's own choice (KERAS_BACKEND, else ~/.keras/keras.json, else
    tensorflow: keras/src/backend/config.py), or "tensorflow" for a tf-keras job or where Keras 3 is absent."""
    if legacy_keras() or importlib.util.find_spec("keras") is None:
        return "tensorflow"
    import keras
    if not hasattr(keras, "backend") or not hasattr(keras.backend, "backend"):
        return "tensorflow"   # Keras 2 installed as `keras`
    return str(keras.backend.backend())


def keras_module() -> Any:
    """tf.keras for a tf-keras job, else Keras 3."""
    if legacy_keras():
        return tf_module().keras
    import keras
    return keras


def tf_module() -> Any:
    import tensorflow as tf
    return tf


def version_tuple(version: str) -> tuple[int, ...]:
    """"3.11.2" -> (3, 11, 2); what follows the numbers is dropped ("3.12.0.dev2024" -> (3, 12, 0))."""
    import re
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", version)
    return tuple(int(g) for g in m.groups() if g is not None) if m else ()


def require_keras(floor: str, what: str, found: str | None = None) -> None:
    """Ends the job with one line naming the Keras `what` needs when the installed one is older (a feature Keras
    lacks otherwise fails deep inside fit(), or, worse, quietly does something else)."""
    if found is None:
        import keras
        found = str(keras.__version__)
    if version_tuple(found) < version_tuple(floor):
        raise SystemExit(f"error: {what} needs keras>={floor}; this environment has keras {found}\n"
                         f"hint: pip install -U 'keras>={floor}' (or list it in the job's requirements.txt)")
