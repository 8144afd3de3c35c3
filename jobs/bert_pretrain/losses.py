"""The pretraining objective as the reference defines it (tf-models-official BertPretrainerV2 and its
MaskedLMTask): the masked-LM cross-entropy averaged over the REAL masked tokens (masked_lm_weights), not over
every prediction slot; the next-sentence cross-entropy averaged over the batch; the optimised loss is their sum.
Accuracies are weighted the same way."""
from __future__ import annotations

import tensorflow as tf


def terms(out: dict, y: dict, w: dict) -> dict:
    """Each term of one batch, and the weight (count) it averages over, so intervals average exactly."""
    wm = tf.cast(w["mlm"], tf.float32)
    tokens = tf.reduce_sum(wm)
    ce = tf.keras.losses.sparse_categorical_crossentropy(y["mlm"], out["mlm"], from_logits=True)
    hit = tf.cast(tf.equal(tf.cast(tf.argmax(out["mlm"], -1), y["mlm"].dtype), y["mlm"]), tf.float32)
    labels = y["nsp"][:, 0]
    nsp_ce = tf.keras.losses.sparse_categorical_crossentropy(labels, out["nsp"], from_logits=True)
    nsp_hit = tf.cast(tf.equal(tf.cast(tf.argmax(out["nsp"], -1), labels.dtype), labels), tf.float32)
    safe = tf.maximum(tokens, 1.0)
    mlm_loss = tf.reduce_sum(ce * wm) / safe
    nsp_loss = tf.reduce_mean(nsp_ce)
    return {"loss": mlm_loss + nsp_loss, "mlm_loss": mlm_loss, "mlm_acc": tf.reduce_sum(hit * wm) / safe,
            "nsp_loss": nsp_loss, "nsp_acc": tf.reduce_mean(nsp_hit), "tokens": tokens}


# metric -> the weight of its per-batch value in an interval's average
WEIGHTS = {"loss": None, "mlm_loss": "tokens", "mlm_acc": "tokens", "nsp_loss": None, "nsp_acc": None}


class PretrainingModel(tf.keras.Model):
    """A model whose call returns {"mlm": logits at the masked positions, "nsp": next-sentence logits}, trained and
    evaluated on these terms, each tracked as its own metric. The BERT job's pretrainer is one; the parity bench
    puts tf-models-official's network under the same steps."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.trackers = {k: tf.keras.metrics.Mean(name=k) for k in WEIGHTS}

    @property
    def metrics(self):
        return list(self.trackers.values())

    def _track(self, t):
        for k, m in self.trackers.items():
            by = WEIGHTS[k]
            m.update_state(t[k], sample_weight=t[by] if by else None)
        return {k: m.result() for k, m in self.trackers.items()}

    def train_step(self, data):
        x, y, w = data
        with tf.GradientTape() as tape:
            t = terms(self(x, training=True), y, w)
            # Gradients are summed over replicas: each replica's share of the mean (as Keras' own losses do).
            loss = t["loss"] / tf.distribute.get_strategy().num_replicas_in_sync
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        return self._track(t)

    def test_step(self, data):
        x, y, w = data
        return self._track(terms(self(x, training=False), y, w))
