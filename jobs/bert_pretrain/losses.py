"""The pretraining objective as the reference defines it (tf-models-official BertPretrainerV2 and its
MaskedLMTask): the masked-LM cross-entropy averaged over the REAL masked tokens (masked_lm_weights), not over
every prediction slot; the next-sentence cross-entropy averaged over the batch; the optimised loss is their sum.
Accuracies are weighted the same way.

Expressed as Keras 3 compile() losses and weighted metrics, so that each backend's own train step computes the
gradients, applies loss scaling (mixed_float16) and divides by the replicas under tf.distribute (Keras's Loss does:
keras/src/losses/loss.py scale_loss_for_distribution). "mean_with_sample_weight" divides the weighted sum by the
sum of the weights (keras/src/losses/loss.py reduce_values), i.e. by the number of real masked tokens.
"""
from __future__ import annotations

import keras

# metric names in the logs, as the job has always printed them
NAMES = ("loss", "mlm_loss", "mlm_acc", "nsp_loss", "nsp_acc")


def objective() -> dict:
    """compile() arguments: one loss per output (Keras logs each as `<output>_loss`: mlm_loss, nsp_loss, and
    their sum as loss), accuracies weighted by the data's weights (mlm_acc over the real masked tokens)."""
    ce = keras.losses.SparseCategoricalCrossentropy
    return {"loss": {"mlm": ce(from_logits=True, reduction="mean_with_sample_weight"),
                     "nsp": ce(from_logits=True)},
            "weighted_metrics": {"mlm": [keras.metrics.SparseCategoricalAccuracy(name="acc")],
                                 "nsp": [keras.metrics.SparseCategoricalAccuracy(name="acc")]}}


class PretrainingModel(keras.Model):
    """A model whose call returns {"mlm": logits at the masked positions, "nsp": next-sentence logits}, compiled on
    the objective above (data: (x, y, sample weights), y and weights keyed "mlm" and "nsp"). The BERT job's
    pretrainer is one."""

    def compile(self, optimizer="adam", **kw):   # noqa: A003 (Keras's name)
        super().compile(optimizer=optimizer, **objective(), **kw)


def build(model, x, y, sample_weight=None) -> None:
    """The compiled losses', metrics' and optimizer's variables, made from one example batch before fit(), where
    Keras would make them inside its first train step: on TensorFlow with no tf.distribute strategy (one device),
    fit() leaves them to the trace (keras/src/backend/tensorflow/trainer.py _maybe_symbolic_build), and a
    tf.function that makes variables is traced twice (tensorflow/.../polymorphic_function.py: the trace that made
    them, then one that may not): ~2 CPU-seconds more for each start. Under a strategy, and on JAX, Keras builds
    them before its first trace itself, so this leaves them to it."""
    if keras.backend.backend() != "tensorflow":
        return
    import tensorflow as tf
    if tf.distribute.has_strategy():
        return
    y_pred = model(x, training=False)
    model.compute_loss(x, y, y_pred, sample_weight, training=False)
    model.compute_metrics(x, y, y_pred, sample_weight)
    model.reset_metrics()   # the example's values are not the first step's (fit() resets them too, each epoch)
    model.optimizer.build(model.trainable_variables)


def example_targets(max_pred: int) -> tuple[dict, dict]:
    """(y, sample weights) of one sequence, shaped as records.split gives them: what builds the objective's variables."""
    import numpy as np
    return ({"mlm": np.zeros([1, max_pred], np.int32), "nsp": np.zeros([1, 1], np.int32)},
            {"mlm": np.ones([1, max_pred], np.float32), "nsp": np.ones([1, 1], np.float32)})
