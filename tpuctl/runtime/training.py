"""Training helpers: seeding without TensorFlow on JAX, the learning rate scaled to the batch and its schedule, and
what a callback needs to agree across hosts and read the step without waiting."""
from __future__ import annotations

import sys
from typing import Any

from .keras_env import backend, keras_module, tf_module


def seed(value: int) -> None:
    """keras.utils.set_random_seed(value) without its TensorFlow import on JAX: Keras's function also calls
    tf.random.set_seed wherever TensorFlow is installed (keras/src/utils/rng_utils.py: "the TensorFlow seed is set
    even if you're not using TensorFlow as your backend"), about 5 s of start-up. On JAX what it seeds that matters
    is Python's random and numpy's: every unseeded Keras initializer and SeedGenerator (dropout) draws its seed from
    Python's random (keras/src/random/seed_generator.py make_default_seed). Not done here: keras.utils.get_random_seed
    stays None, and a global SeedGenerator made before this call (keras.random.* called without a seed) is not
    reset. Keras's own function where TensorFlow is the backend or already imported, or on any other backend."""
    if backend() != "jax" or "tensorflow" in sys.modules:
        keras_module().utils.set_random_seed(value)
        return
    import random

    import numpy as np
    random.seed(value)
    np.random.seed(value)


def scaled_lr(base_lr: float, batch: int, base_batch: int, rule: str = "linear") -> float:
    """The learning rate defined at `base_batch`, at the global `batch`: "linear" (Goyal et al. 2017, for SGD) or
    "sqrt" (the square root of the batch ratio, which suits Adam: Malladi et al. 2022)."""
    ratio = batch / base_batch
    return base_lr * (ratio ** 0.5 if rule == "sqrt" else ratio)


def schedule(base_lr: float, batch: int, base_batch: int, warmup_steps: int, total_steps: int,
             end_lr: float = 0.0, rule: str = "linear") -> Any:
    """Linear warm-up to the scaled learning rate, then linear decay to end_lr at total_steps."""
    keras = keras_module()
    ops = keras.ops if hasattr(keras, "ops") else tf_module()   # Keras 3's ops, or TensorFlow's for tf-keras
    clip = ops.clip if hasattr(ops, "clip") else ops.clip_by_value
    peak = scaled_lr(base_lr, batch, base_batch, rule)

    class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[name-defined]  # Keras is imported lazily, so its classes are values here
        def __call__(self, step: Any) -> Any:
            step = ops.cast(step, "float32")
            warm = peak * step / max(1, warmup_steps)
            frac = clip((step - warmup_steps) / max(1, total_steps - warmup_steps), 0.0, 1.0)
            decay = peak + (end_lr - peak) * frac
            return ops.where(step < warmup_steps, warm, decay)

        def get_config(self) -> dict[str, float]:
            return {"peak": peak, "warmup_steps": warmup_steps, "total_steps": total_steps, "end_lr": end_lr}
    return WarmupDecay()


def agree(flag: bool) -> bool:
    """The first process's `flag`, on every process of a JAX run across hosts (a broadcast: call it on all of them
    at the same point), so that a decision taken by a clock (a checkpoint due, a session ending) is the same
    everywhere; the flag itself anywhere else."""
    if backend() != "jax" or "jax" not in sys.modules:
        return flag
    import jax
    if jax.process_count() == 1:
        return flag
    import numpy as np
    from jax.experimental import multihost_utils
    return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


def sync(model: Any) -> None:
    """Puts the state a JAX fit() holds outside the model back into the model's variables (Keras's
    jax_state_sync, keras/src/backend/jax/trainer.py): what a callback does before it reads or changes them (a
    checkpoint, a metrics reset). Nothing to do on TensorFlow."""
    getattr(model, "jax_state_sync", lambda: None)()


def step_of(model: Any) -> int:
    """The optimizer's step, without putting the trainer's state back into the model (sync): inside a JAX fit()
    the model's own variables lag behind the state the train function carries (`model._jax_state`, what the
    trainer hands callbacks), so read it there. Reading it waits for the device to finish the step that made it:
    a callback that wants the step after every batch counts batches instead (metrics_callback)."""
    opt = model.optimizer
    state = getattr(model, "_jax_state", None)
    if state and state.get("optimizer_variables") and not getattr(model, "_jax_state_synced", True):
        for ref, value in zip(opt.variables, state["optimizer_variables"]):
            if ref is opt.iterations:
                return int(value)
    return int(opt.iterations.numpy())
