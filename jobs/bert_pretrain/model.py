"""A BERT encoder with masked-LM and next-sentence heads, in tf-keras (TF_USE_LEGACY_KERAS=1)."""
from __future__ import annotations

import tensorflow as tf

keras = tf.keras

PRESETS = {  # layers, hidden, heads, intermediate
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


def _gelu(x):
    return tf.nn.gelu(x, approximate=True)


class Layer(keras.layers.Layer):
    """Post-LN transformer block as in the original BERT."""

    def __init__(self, hidden, heads, inter, dropout, **kw):
        super().__init__(**kw)
        self.attn = keras.layers.MultiHeadAttention(heads, hidden // heads, dropout=dropout)
        self.ln1 = keras.layers.LayerNormalization(epsilon=1e-12)
        self.ff1 = keras.layers.Dense(inter, activation=_gelu)
        self.ff2 = keras.layers.Dense(hidden)
        self.ln2 = keras.layers.LayerNormalization(epsilon=1e-12)
        self.drop = keras.layers.Dropout(dropout)

    def call(self, x, mask, training=False):
        a = self.attn(x, x, attention_mask=mask, training=training)
        x = self.ln1(x + self.drop(a, training=training))
        f = self.ff2(self.ff1(x))
        return self.ln2(x + self.drop(f, training=training))


class Bert(keras.Model):
    def __init__(self, vocab_size, preset="tiny", max_seq=512, dropout=0.1, **kw):
        super().__init__(**kw)
        layers, hidden, heads, inter = PRESETS[preset]
        self.hidden = hidden
        self.tok = keras.layers.Embedding(vocab_size, hidden, name="word_embeddings")
        self.pos = keras.layers.Embedding(max_seq, hidden, name="position_embeddings")
        self.seg = keras.layers.Embedding(2, hidden, name="type_embeddings")
        self.ln = keras.layers.LayerNormalization(epsilon=1e-12)
        self.drop = keras.layers.Dropout(dropout)
        self.blocks = [Layer(hidden, heads, inter, dropout, name=f"layer_{i}") for i in range(layers)]
        self.mlm_dense = keras.layers.Dense(hidden, activation=_gelu)
        self.mlm_ln = keras.layers.LayerNormalization(epsilon=1e-12)
        self.pool = keras.layers.Dense(hidden, activation="tanh")
        self.nsp = keras.layers.Dense(2, name="nsp")
        self.mlm_bias = self.add_weight(name="mlm_bias", shape=[vocab_size], initializer="zeros")

    def call(self, f, training=False):
        ids = f["input_ids"]
        seq = tf.shape(ids)[1]
        x = self.tok(ids) + self.pos(tf.range(seq))[tf.newaxis] + self.seg(f["segment_ids"])
        x = self.drop(self.ln(x), training=training)
        mask = tf.cast(f["input_mask"][:, tf.newaxis, :], tf.bool)
        for b in self.blocks:
            x = b(x, mask, training=training)
        # Masked LM: only the masked positions, projected with the (tied) word embeddings.
        picked = tf.gather(x, f["masked_lm_positions"], batch_dims=1)
        h = self.mlm_ln(self.mlm_dense(picked))
        logits = tf.matmul(tf.cast(h, tf.float32), self.tok.embeddings, transpose_b=True) + self.mlm_bias
        nsp = self.nsp(self.pool(x[:, 0]))
        return {"mlm": logits, "nsp": tf.cast(nsp, tf.float32)}
