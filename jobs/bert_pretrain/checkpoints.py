"""Step-exact checkpoints that every Keras backend reads: OUTPUT/checkpoints/ckpt-STEP.weights.h5 (Keras 3's
backend-independent weights format; of a compiled model it holds the optimizer's variables too, its step among them:
keras/src/saving/saving_lib.py save_weights_only walks the model's saveables, the optimizer one of them) and
ckpt-STEP.state.npz beside it (the dropout layers' seed generator states, which no .weights.h5 holds), so a run started
on JAX resumes on TensorFlow and back, exactly. The state file is written first and the weights last: a checkpoint
exists once its weights file does, so a kill between the two leaves the previous checkpoint the latest. The newest
`keep` are kept. The directory may be gs:// (fileio.py): each file is written locally, then uploaded whole.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile

import fileio
import numpy as np

_NAME = re.compile(r"ckpt-(\d+)\.weights\.h5$")


def _seeds(model) -> list:
    """The seed generators' state variables (Keras 3 keeps them in layer.variables, not in layer.weights, and so
    not in a .weights.h5: keras/src/layers/layer.py `variables`)."""
    weights = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def steps(directory: str) -> list[int]:
    return sorted(int(m.group(1)) for p in fileio.glob(f"{directory}/ckpt-*.weights.h5")
                  if (m := _NAME.search(p)))


def step_of(base: str) -> int:
    """The step DIR/ckpt-N was saved at: N, the batches its run had consumed (train.py's step, which under loss
    scaling can be ahead of the optimizer's iteration count it holds)."""
    return int(base.rsplit("ckpt-", 1)[1])


def latest(directory: str) -> str | None:
    """DIR/ckpt-N (without suffix) of the newest checkpoint, or None."""
    found = steps(directory)
    return f"{directory}/ckpt-{found[-1]}" if found else None


def find(path: str) -> str | None:
    """A checkpoint from what a user names: a directory of them (its newest), or one checkpoint (with or without
    its .weights.h5 suffix)."""
    path = path.rstrip("/")
    if path.endswith(".weights.h5"):
        path = path[:-len(".weights.h5")]
    if fileio.exists(f"{path}.weights.h5"):
        return path
    return latest(path)


def save(directory: str, step: int, model, keep: int = 3, write: bool = True) -> str:
    """Across hosts every process calls this (write=False but on the first): Keras's save_weights is a collective
    there, by way of a fresh optimizer it makes to list what to skip (keras/src/saving/saving_lib.py
    get_attr_skipset), whose variable a multi-process device_put checks equal on every process
    (jax/_src/dispatch.py _device_put_sharding_impl -> multihost_utils.assert_equal); called on one host alone it
    hangs or aborts the others' next step ("Gloo ... collective mismatch"). So each host saves to a temporary file
    and only the writer keeps it."""
    base = f"{directory}/ckpt-{step}"
    tmp = tempfile.mkdtemp(prefix="ckpt-")
    try:
        state = {f"seed_{i}": np.asarray(v.numpy()) for i, v in enumerate(_seeds(model))}
        np.savez(os.path.join(tmp, "state.npz"), **state)
        model.save_weights(os.path.join(tmp, "w.weights.h5"))
        if not write:
            return base
        fileio.makedirs(directory)
        fileio.copy(os.path.join(tmp, "state.npz"), f"{base}.state.npz")
        fileio.copy(os.path.join(tmp, "w.weights.h5"), f"{base}.weights.h5")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in steps(directory)[:-keep]:   # the writer's alone, as the files are
        for suffix in (".weights.h5", ".state.npz"):
            fileio.remove(f"{directory}/ckpt-{old}{suffix}")
    return base


def restore(base: str, model, optimizer=None) -> None:
    """Weights into a built model; with its `optimizer`, the optimizer's state and the seed generators' too;
    without, the weights alone (a new phase, an export). A shape or count that does not match is an error."""
    local = fileio.local_copy(f"{base}.weights.h5")
    if optimizer is None:
        opt = getattr(model, "optimizer", None)
        model.load_weights(local, objects_to_skip=[opt] if opt is not None else None)
        return
    if not optimizer.built:
        optimizer.build(model.trainable_variables)   # its variables exist before the file's are read into them
    model.load_weights(local)
    with np.load(fileio.local_copy(f"{base}.state.npz")) as z:
        saved = [z[f"seed_{i}"] for i in range(len(z.files))]
    seeds = _seeds(model)
    if len(saved) == len(seeds):   # a checkpoint from another dropout setup leaves the fresh seeds
        for v, value in zip(seeds, saved):
            v.assign(value)
