"""BERT in Keras 3 (keras.layers and keras.ops only, so one definition runs on the TensorFlow and JAX backends), in
tf-models-official's shape: a BertConfig, a BertEncoder usable alone (sequence and pooled outputs), masked-LM and
next-sentence heads, and a BertPretrainer composing them.

As the original BERT: post-LN blocks, GELU (tanh approximation), every weight drawn from a truncated normal of
standard deviation 0.02, 512 position embeddings whatever the sequence length (sliced to it), so a checkpoint of
phase 1 (seq 128) starts phase 2 (seq 512). Layer names are stable (`encoder/layer_3/attention`), and each class
has get_config, so a saved `.keras` file loads back.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import fileio
import keras
import numpy as np
from keras import ops
from losses import PretrainingModel

PRESETS = {  # layers, hidden, heads, intermediate
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


@dataclass
class BertConfig:
    vocab_size: int
    layers: int = 2
    hidden: int = 128
    heads: int = 2
    intermediate: int = 512
    max_positions: int = 512
    type_vocab: int = 2
    dropout: float = 0.1
    initializer_range: float = 0.02

    @classmethod
    def preset(cls, name: str, vocab_size: int, **kw) -> "BertConfig":
        layers, hidden, heads, inter = PRESETS[name]
        return cls(vocab_size, layers, hidden, heads, inter, **kw)

    def get_config(self) -> dict:
        return asdict(self)

    @classmethod
    def from_config(cls, d: dict) -> "BertConfig":
        return cls(**d)

    def write(self, directory: str) -> str:
        """DIR/bert_config.json (DIR may be gs://): what train.py leaves beside its checkpoints and export.py
        beside the encoder."""
        path = f"{directory}/bert_config.json"
        fileio.write(path, json.dumps(self.get_config(), indent=2).encode())
        return path

    @classmethod
    def read(cls, directory: str) -> "BertConfig | None":
        path = f"{directory}/bert_config.json"
        if not fileio.exists(path):
            return None
        return cls.from_config(json.loads(fileio.read(path)))

    def init(self):
        """A new initializer for each weight: one unseeded instance used twice gives the same values twice."""
        return keras.initializers.TruncatedNormal(stddev=self.initializer_range)


def example_inputs(seq: int, max_pred: int) -> dict:
    """One sequence of the given shape: what builds a model's variables without reading any data."""
    ones = np.ones([1, seq], np.int32)
    return {"input_ids": ones, "input_mask": ones, "segment_ids": np.zeros_like(ones),
            "masked_lm_positions": np.zeros([1, max_pred], np.int32)}


def symbolic(inputs: dict) -> dict:
    """`inputs` as Keras's symbolic tensors, their shapes and dtypes alone: a model called on them builds its
    variables (the same values, drawn from the same seeds) and traces its call without computing anything. Called
    on numbers, the model ran its forward pass op by op just to build, each op a program of its own on JAX: about
    one CPU-second of every start of the job, compiled or read back from a compilation cache."""
    return {k: keras.KerasTensor(np.shape(v), dtype=str(np.asarray(v).dtype)) for k, v in inputs.items()}


def _config(config) -> BertConfig:
    return config if isinstance(config, BertConfig) else BertConfig.from_config(config)


def _gelu(x):
    return keras.activations.gelu(x, approximate=True)


@keras.utils.register_keras_serializable(package="bert")
class TransformerBlock(keras.layers.Layer):
    """Post-LN transformer block as in the original BERT."""

    def __init__(self, config, **kw):
        super().__init__(**kw)
        c = self.config = _config(config)
        self.attention = keras.layers.MultiHeadAttention(c.heads, c.hidden // c.heads, dropout=c.dropout,
                                                         kernel_initializer=c.init(), name="attention")
        self.attention_norm = keras.layers.LayerNormalization(epsilon=1e-12, name="attention_layer_norm")
        self.intermediate = keras.layers.Dense(c.intermediate, activation=_gelu, kernel_initializer=c.init(),
                                               name="intermediate")
        self.output_dense = keras.layers.Dense(c.hidden, kernel_initializer=c.init(), name="output")
        self.output_norm = keras.layers.LayerNormalization(epsilon=1e-12, name="output_layer_norm")
        self.drop = keras.layers.Dropout(c.dropout)

    def call(self, x, mask, training=False):
        a = self.attention(x, x, attention_mask=mask, training=training)
        x = self.attention_norm(x + self.drop(a, training=training))
        f = self.output_dense(self.intermediate(x))
        return self.output_norm(x + self.drop(f, training=training))

    def get_config(self):
        return {**super().get_config(), "config": self.config.get_config()}


@keras.utils.register_keras_serializable(package="bert")
class BertEncoder(keras.Model):
    """input_ids, input_mask, segment_ids [batch, seq] -> {"sequence_output": [batch, seq, hidden],
    "pooled_output": [batch, hidden]} (the [CLS] position through a tanh dense layer, as BERT's pooler)."""

    def __init__(self, config, **kw):
        kw.setdefault("name", "encoder")
        super().__init__(**kw)
        c = self.config = _config(config)
        self.word_embeddings = keras.layers.Embedding(c.vocab_size, c.hidden, embeddings_initializer=c.init(),
                                                      name="word_embeddings")
        self.position_embeddings = keras.layers.Embedding(c.max_positions, c.hidden, embeddings_initializer=c.init(),
                                                          name="position_embeddings")
        self.type_embeddings = keras.layers.Embedding(c.type_vocab, c.hidden, embeddings_initializer=c.init(),
                                                      name="type_embeddings")
        self.embeddings_norm = keras.layers.LayerNormalization(epsilon=1e-12, name="embeddings_layer_norm")
        self.drop = keras.layers.Dropout(c.dropout)
        self.blocks = [TransformerBlock(c, name=f"layer_{i}") for i in range(c.layers)]
        self.pooler = keras.layers.Dense(c.hidden, activation="tanh", kernel_initializer=c.init(), name="pooler")

    def call(self, inputs, training=False):
        # ids as int32 whatever comes in: Keras's symbolic build (under tf.distribute) traces with float inputs
        ids = ops.cast(inputs["input_ids"], "int32")
        seq = ops.shape(ids)[1]
        x = self.word_embeddings(ids) + self.position_embeddings(ops.arange(seq))[None] \
            + self.type_embeddings(ops.cast(inputs["segment_ids"], "int32"))
        x = self.drop(self.embeddings_norm(x), training=training)
        mask = ops.cast(inputs["input_mask"][:, None, :], "bool")
        for b in self.blocks:
            x = b(x, mask, training=training)
        return {"sequence_output": x, "pooled_output": self.pooler(x[:, 0])}

    def get_config(self):
        return {"config": self.config.get_config(), "name": self.name}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.utils.register_keras_serializable(package="bert")
class MaskedLMHead(keras.layers.Layer):
    """Hidden states at the masked positions -> logits over the vocabulary, through the encoder's (tied) word
    embeddings."""

    def __init__(self, config, embeddings, **kw):
        kw.setdefault("name", "masked_lm")
        super().__init__(**kw)
        c = self.config = _config(config)
        # the encoder's layer, reached through a function so that it is not tracked here a second time (its table
        # would be saved twice in a checkpoint, once under each owner)
        self._table = lambda: embeddings.embeddings
        self.transform = keras.layers.Dense(c.hidden, activation=_gelu, kernel_initializer=c.init(), name="transform")
        self.norm = keras.layers.LayerNormalization(epsilon=1e-12, name="transform_layer_norm")

    def build(self, shape):
        self.transform.build(shape)
        self.norm.build(tuple(shape[:-1]) + (self.config.hidden,))
        self.bias = self.add_weight(name="output_bias", shape=[self.config.vocab_size], initializer="zeros")

    def call(self, picked):
        h = ops.cast(self.norm(self.transform(picked)), "float32")
        # One [batch * predictions, hidden] x [hidden, vocab] product. A batched matmul against the shared table
        # would make its gradient a [batch, hidden, vocab] tensor summed over the batch (the parity bench measured
        # 0.93x the reference's examples per CPU-second with it, 0.98x without).
        flat = ops.reshape(h, [-1, self.config.hidden])
        # float32 logits under mixed precision (Keras autocasts variables read in call to the compute dtype)
        table = ops.cast(self._table(), "float32")
        logits = ops.matmul(flat, ops.transpose(table)) + ops.cast(self.bias, "float32")
        return ops.reshape(logits, [-1, h.shape[1], self.config.vocab_size])


class BertPretrainer(PretrainingModel):
    """The encoder and both heads, trained on the reference's objective (losses.PretrainingModel: the logged and
    optimised loss is the sum of the normalised masked-LM and next-sentence terms)."""

    def __init__(self, config, **kw):
        super().__init__(**kw)
        c = self.config = _config(config)
        self.encoder = BertEncoder(c)
        self.masked_lm = MaskedLMHead(c, self.encoder.word_embeddings)
        self.next_sentence = keras.layers.Dense(2, kernel_initializer=c.init(), name="next_sentence")

    def call(self, f, training=False):
        enc = self.encoder(f, training=training)
        picked = gather(enc["sequence_output"], f["masked_lm_positions"])
        return {"mlm": self.masked_lm(picked),
                "nsp": ops.cast(self.next_sentence(enc["pooled_output"]), "float32")}


def gather(sequence, positions):
    """sequence [batch, seq, hidden] at positions [batch, predictions] -> [batch, predictions, hidden]: one gather
    from the flattened batch (every backend's take), rather than a batched gather some backends lack."""
    seq, hidden = ops.shape(sequence)[1], sequence.shape[-1]
    positions = ops.cast(positions, "int32")
    offsets = ops.arange(ops.shape(positions)[0])[:, None] * seq
    flat = ops.reshape(positions + ops.cast(offsets, positions.dtype), [-1])
    picked = ops.take(ops.reshape(sequence, [-1, hidden]), flat, axis=0)
    return ops.reshape(picked, [-1, positions.shape[1], hidden])
