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
