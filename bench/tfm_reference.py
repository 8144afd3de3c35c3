"""The reference BERT for the parity bench and test: tf-models-official 2.20's BertEncoder + BertPretrainerV2 on
tf-keras (TensorFlow), built as its MaskedLMTask.build_model builds them, the name and shape mapping of its weights
onto this job's Keras 3 BertPretrainer (whichever backend runs it), and its training step on the job's objective.

tf-keras is a package of its own, so it runs beside Keras 3 in one process on either Keras 3 backend (checked:
`KERAS_BACKEND=jax` Keras 3 and tf_keras import and run together). TF_USE_LEGACY_KERAS is not needed: the
reference's modules import `tf_keras` themselves (official/nlp/modeling/*), and leaving it unset keeps tpuctl.runtime
on Keras 3 for our model.

    pip install --no-deps tf-models-official==2.20.0 && pip install sentencepiece gin-config scipy pyyaml tf-keras
"""
from __future__ import annotations

import re

import numpy as np

# (our variable's path after the model's own name, the reference's variable name without ":0"): regular
# expressions, ours fully matched, the reference's a template on our groups. The reference's names come from
# official/nlp/modeling: networks/bert_encoder.py (word_embeddings, position_embedding, type_embeddings,
# embeddings/layer_norm, transformer/layer_N with TransformerEncoderBlock's self_attention*, intermediate,
# output*), models/bert_pretrainer.py's MaskedLM under bert/cls/predictions (layers/masked_lm.py), and
# layers/cls_head.py's ClassificationHead (pooler_dense, logits) named next_sentence.
MAPPING = [
    (r"encoder/word_embeddings/embeddings", "word_embeddings/embeddings"),
    (r"encoder/position_embeddings/embeddings", "position_embedding/embeddings"),
    (r"encoder/type_embeddings/embeddings", "type_embeddings/embeddings"),
    (r"encoder/embeddings_layer_norm/(gamma|beta)", r"embeddings/layer_norm/\1"),
    (r"encoder/(layer_\d+)/attention/(\w+/(?:kernel|bias))", r"transformer/\1/self_attention/\2"),
    (r"encoder/(layer_\d+)/attention_layer_norm/(gamma|beta)", r"transformer/\1/self_attention_layer_norm/\2"),
    (r"encoder/(layer_\d+)/(intermediate|output|output_layer_norm)/(\w+)", r"transformer/\1/\2/\3"),
    # Our pooler (the [CLS] state through a tanh dense layer) is what our next-sentence layer reads, as in the
    # original BERT and Hugging Face's BertForPreTraining. The reference's next-sentence head does the same with
    # its own dense layer (ClassificationHead: dense + tanh on sequence_output[:, 0], dropout, logits), so that is
    # our pooler's counterpart; the reference encoder's own pooler_transform feeds only its pooled_output, which no
    # loss reads (UNREAD below).
    (r"encoder/pooler/(kernel|bias)", r"bert/next_sentence/pooler_dense/\1"),
    (r"masked_lm/output_bias", "bert/cls/predictions/output_bias/bias"),
    (r"masked_lm/transform/(kernel|bias)", r"bert/cls/predictions/transform/dense/\1"),
    (r"masked_lm/transform_layer_norm/(gamma|beta)", r"bert/cls/predictions/transform/LayerNorm/\1"),
    (r"next_sentence/(kernel|bias)", r"bert/next_sentence/logits/\1"),
]
UNREAD = ("pooler_transform/kernel", "pooler_transform/bias")


def reference(config, dropout: float | None = None):
    """tf-models-official's pretrainer for our BertConfig, as official/nlp/tasks/masked_lm.py MaskedLMTask.build_model
    makes it from a BertEncoderConfig (gelu: official/modeling/activations/gelu.py is the tanh approximation, as
    ours; truncated normal 0.02; 512 positions; type vocabulary 2) with one next-sentence ClassificationHead."""
    import tf_keras
    from official.modeling import tf_utils
    from official.nlp.modeling import layers, models, networks
    rate = config.dropout if dropout is None else dropout

    def init():
        return tf_keras.initializers.TruncatedNormal(stddev=config.initializer_range)
    encoder = networks.BertEncoder(
        vocab_size=config.vocab_size, hidden_size=config.hidden, num_layers=config.layers,
        num_attention_heads=config.heads, intermediate_size=config.intermediate,
        activation=tf_utils.get_activation("gelu"), dropout_rate=rate, attention_dropout_rate=rate,
        max_sequence_length=config.max_positions, type_vocab_size=config.type_vocab, initializer=init(),
        dict_outputs=True)
    net = models.BertPretrainerV2(
        encoder_network=encoder, mlm_activation=tf_utils.get_activation("gelu"), mlm_initializer=init(),
        classification_heads=[layers.ClassificationHead(inner_dim=config.hidden, num_classes=2, dropout_rate=rate,
                                                        name="next_sentence")])
    return _reference_class()(net)


def _reference_class():
    import tensorflow as tf
    import tf_keras

    class Reference(tf_keras.Model):
        """The reference behind our input and output names ({"mlm", "nsp"} logits in float32), trained on the
        objective of MaskedLMTask.build_losses (official/nlp/tasks/masked_lm.py): the masked-LM cross-entropy summed
        over the weighted predictions and divided by the sum of masked_lm_weights, plus the batch mean of the
        next-sentence cross-entropy. The job's losses.objective is the same in Keras 3 terms."""

        def __init__(self, net):
            super().__init__(name="reference")
            self.net = net

        def call(self, f, training=False):
            out = self.net({"input_word_ids": f["input_ids"], "input_mask": f["input_mask"],
                            "input_type_ids": f["segment_ids"], "masked_lm_positions": f["masked_lm_positions"]},
                           training=training)
            return {"mlm": tf.cast(out["mlm_logits"], tf.float32), "nsp": tf.cast(out["next_sentence"], tf.float32),
                    "sequence_output": out["sequence_output"]}

        def train_step(self, data):
            x, y, w = data
            with tf.GradientTape() as tape:
                out = self(x, training=True)
                ce = tf_keras.losses.sparse_categorical_crossentropy
                mlm = tf.math.divide_no_nan(tf.reduce_sum(ce(y["mlm"], out["mlm"], from_logits=True) * w["mlm"]),
                                            tf.reduce_sum(w["mlm"]))
                nsp = tf.reduce_mean(ce(y["nsp"], out["nsp"], from_logits=True))
                loss = mlm + nsp
            # pooler_transform gets no gradient (UNREAD): left out rather than warned about at every step
            grads = zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            self.optimizer.apply_gradients([(g, v) for g, v in grads if g is not None])
            return {"loss": loss, "mlm_loss": mlm, "nsp_loss": nsp}
    return Reference


def reference_schedule(peak: float, warmup_steps: int, total_steps: int):
    """tpuctl.runtime.schedule's shape (linear warm-up to peak, linear decay to 0 at total_steps) as a tf-keras
    schedule: runtime builds Keras 3's, which a tf-keras optimizer cannot call."""
    import tensorflow as tf
    import tf_keras

    class WarmupDecay(tf_keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            step = tf.cast(step, tf.float32)
            frac = tf.clip_by_value((step - warmup_steps) / max(1, total_steps - warmup_steps), 0.0, 1.0)
            return tf.where(step < warmup_steps, peak * step / max(1, warmup_steps), peak * (1.0 - frac))
    return WarmupDecay()


def reference_optimizer(lr):
    """train.optimizer's AdamW in tf-keras: the same decay, epsilon, clipping and exclusions (tf-keras matches them
    against the variable's full name: tf_keras/src/optimizers/optimizer.py _use_weight_decay)."""
    import tf_keras
    opt = tf_keras.optimizers.AdamW(lr, weight_decay=0.01, epsilon=1e-6, global_clipnorm=1.0)
    opt.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return opt


def pairs(ours, theirs) -> list[tuple]:
    """(our variable, the reference's variable) for every weight of ours; raises if one has no counterpart, two map
    to one, the shapes differ, or a reference weight other than UNREAD is left over."""
    ref = {_name(v, theirs): v for v in theirs.weights}
    out, used = [], set()
    for v in ours.weights:
        path = v.path.split("/", 1)[1]   # without the model's own name
        names = [re.sub(f"^{a}$", b, path) for a, b in MAPPING if re.fullmatch(a, path)]
        if len(names) != 1 or names[0] not in ref or names[0] in used:
            raise ValueError(f"no single reference weight for {path}: {names}")
        if tuple(v.shape) != tuple(ref[names[0]].shape):
            raise ValueError(f"{path} {tuple(v.shape)} vs {names[0]} {tuple(ref[names[0]].shape)}")
        used.add(names[0])
        out.append((v, ref[names[0]]))
    left = sorted(set(ref) - used - set(UNREAD))
    if left:
        raise ValueError(f"reference weights with no counterpart in ours: {left}")
    return out


def _name(v, theirs) -> str:
    """The reference's name of a weight: without ":0", nor the wrapper's scope (the heads are built inside it)."""
    return v.name.rsplit(":", 1)[0].removeprefix(f"{theirs.name}/")


def copy_weights(ours, theirs) -> None:
    """Give ours the reference's values (both models built)."""
    for mine, ref in pairs(ours, theirs):
        mine.assign(ref.numpy())


def unread_params(theirs) -> int:
    return int(sum(np.prod(v.shape) for v in theirs.weights if _name(v, theirs) in UNREAD))


def forward(model, x: dict) -> dict:
    """{"mlm", "nsp", "sequence_output"} as numpy, dropout off: ours (Keras 3, either backend) or the reference."""
    if hasattr(model, "net"):
        return {k: v.numpy() for k, v in model(x, training=False).items()}
    enc = model.encoder(x, training=False)
    out = model(x, training=False)
    return {"mlm": np.asarray(out["mlm"]), "nsp": np.asarray(out["nsp"]),
            "sequence_output": np.asarray(enc["sequence_output"])}


def differences(ours: dict, theirs: dict, mask) -> dict:
    """Max abs differences: MLM and NSP logits, and the sequence output over real (unpadded) tokens."""
    real = np.asarray(mask).astype(bool)
    return {"mlm": float(np.abs(ours["mlm"] - theirs["mlm"]).max()),
            "nsp": float(np.abs(ours["nsp"] - theirs["nsp"]).max()),
            "sequence_output": float(np.abs(ours["sequence_output"][real] - theirs["sequence_output"][real]).max())}
