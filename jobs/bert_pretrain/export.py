"""Export a pretrained encoder for whoever builds on it (fine-tuning, feature extraction):

    python export.py --checkpoint OUTPUT/checkpoints --output EXPORT

The model's size comes from OUTPUT/bert_config.json, which train.py writes beside its checkpoints (or from
--preset and --vocab-size), and OUTPUT/vocab.txt is copied along, so EXPORT is all a fine-tuning user needs.

writes
    encoder.keras     the BertEncoder as a Keras 3 file: keras.saving.load_model(path) after `import model`, on any
                      backend
    saved_model/      on the TensorFlow backend: a SavedModel (Keras 3's ExportArchive) whose `serve` signature
                      takes int32 input_ids, input_mask and segment_ids [batch, seq] and returns sequence_output
                      and pooled_output
    bert_config.json  the BertConfig
    hf/               with --hf: the Hugging Face BERT format (config.json + tf_model.h5) that `transformers`'
                      TFBertModel.from_pretrained loads with equal outputs (needs TensorFlow, transformers 4.57.x,
                      the last line that ships TensorFlow models, and tf-keras, which those models are written in)
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

INPUTS = ("input_ids", "input_mask", "segment_ids")


def export(encoder, out: str) -> dict:
    """Write the three forms of `encoder` (a built BertEncoder) under `out`; returns their paths."""
    import fileio
    import keras
    fileio.makedirs(out)
    paths = {"keras": f"{out}/encoder.keras"}
    local = tempfile.mkdtemp(prefix="export-")
    encoder.save(f"{local}/encoder.keras")
    fileio.copy(f"{local}/encoder.keras", paths["keras"])
    if keras.backend.backend() == "tensorflow":
        # Keras 3's ExportArchive (what model.export uses: keras.io "Model export for inference"), with a function
        # of named arguments: a dict signature would be flattened to args_0, args_0_1, ...; TensorFlow writes gs://
        import tensorflow as tf
        paths["saved_model"] = f"{out}/saved_model"

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name=k) for k in INPUTS])
        def serve(input_ids, input_mask, segment_ids):
            return encoder({"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids},
                           training=False)
        archive = keras.export.ExportArchive()
        archive.track(encoder)
        archive.add_endpoint("serve", serve)
        archive.write_out(paths["saved_model"], verbose=False)
    paths["config"] = encoder.config.write(out)
    return paths


def hf_config(c) -> dict:
    """Our BertConfig in Hugging Face's terms; GELU is the tanh approximation, which HF calls gelu_new."""
    return {"vocab_size": c.vocab_size, "hidden_size": c.hidden, "num_hidden_layers": c.layers,
            "num_attention_heads": c.heads, "intermediate_size": c.intermediate, "hidden_act": "gelu_new",
            "max_position_embeddings": c.max_positions, "type_vocab_size": c.type_vocab, "layer_norm_eps": 1e-12,
            "initializer_range": c.initializer_range, "hidden_dropout_prob": c.dropout,
            "attention_probs_dropout_prob": c.dropout}


def hf_weights(encoder) -> dict:
    """HF TFBertModel variable name (after `bert/`) -> value, from our encoder: Keras MultiHeadAttention keeps
    per-head kernels ([hidden, heads, head_size]), HF keeps them flat ([hidden, hidden])."""
    h = encoder.config.hidden
    flat = {"word_embeddings/weight": encoder.word_embeddings.embeddings,
            "position_embeddings/embeddings": encoder.position_embeddings.embeddings,
            "token_type_embeddings/embeddings": encoder.type_embeddings.embeddings,
            "LayerNorm/gamma": encoder.embeddings_norm.gamma, "LayerNorm/beta": encoder.embeddings_norm.beta}
    out = {f"embeddings/{k}": np.asarray(v.numpy()) for k, v in flat.items()}
    for i, b in enumerate(encoder.blocks):
        at, pre = b.attention, f"encoder/layer_._{i}/"
        for name, dense in (("query", at._query_dense), ("key", at._key_dense), ("value", at._value_dense)):
            out[f"{pre}attention/self/{name}/kernel"] = dense.kernel.numpy().reshape(h, h)
            out[f"{pre}attention/self/{name}/bias"] = dense.bias.numpy().reshape(h)
        out[f"{pre}attention/output/dense/kernel"] = at._output_dense.kernel.numpy().reshape(h, h)
        out[f"{pre}attention/output/dense/bias"] = at._output_dense.bias.numpy()
        for where, layer in (("attention/output/LayerNorm", b.attention_norm), ("output/LayerNorm", b.output_norm)):
            out[f"{pre}{where}/gamma"], out[f"{pre}{where}/beta"] = layer.gamma.numpy(), layer.beta.numpy()
        for where, layer in (("intermediate/dense", b.intermediate), ("output/dense", b.output_dense)):
            out[f"{pre}{where}/kernel"], out[f"{pre}{where}/bias"] = layer.kernel.numpy(), layer.bias.numpy()
    out["pooler/dense/kernel"], out["pooler/dense/bias"] = encoder.pooler.kernel.numpy(), encoder.pooler.bias.numpy()
    return out


def export_hf(encoder, out: str) -> str:
    """Build transformers' TFBertModel from our config, set every weight from ours (all of them, by name), and
    save_pretrained: HF writes its own config.json and tf_model.h5, so their loader reads what their saver wrote."""
    from transformers import BertConfig as HfConfig, TFBertModel
    model = TFBertModel(HfConfig(**hf_config(encoder.config)))
    model(np.ones([1, 2], np.int32))
    ours = hf_weights(encoder)
    for v in model.weights:
        key = v.name.split("/bert/", 1)[1].rsplit(":", 1)[0]
        v.assign(ours.pop(key))
    if ours:
        raise ValueError(f"weights HF's model has no place for: {sorted(ours)}")
    model.save_pretrained(out)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="a training checkpoint, or the directory of checkpoints")
    ap.add_argument("--vocab-size", type=int, help="default: from the run's bert_config.json")
    ap.add_argument("--preset", help="default: from the run's bert_config.json")
    ap.add_argument("--output", required=True)
    ap.add_argument("--hf", action="store_true", help="also write the Hugging Face BERT format under OUTPUT/hf")
    a = ap.parse_args(argv)
    import checkpoints
    import fileio
    from model import BertConfig, BertPretrainer, example_inputs, symbolic
    src = checkpoints.find(a.checkpoint)
    if src is None:
        raise SystemExit(f"export.py: no checkpoint at {a.checkpoint} (a ckpt-N.weights.h5, or a directory of them)")
    run_dir = os.path.dirname(os.path.dirname(src))   # OUTPUT/checkpoints/ckpt-N -> OUTPUT
    if a.preset or a.vocab_size:
        if not (a.preset and a.vocab_size):
            raise SystemExit("export.py: give both --preset and --vocab-size, or neither (read from the run)")
        config = BertConfig.preset(a.preset, a.vocab_size)
    else:
        config = BertConfig.read(run_dir)
        if config is None:
            raise SystemExit(f"export.py: no {run_dir}/bert_config.json (written by train.py); give --preset and "
                             f"--vocab-size")
    model = BertPretrainer(config)
    model(symbolic(example_inputs(8, 2)))   # variables exist before the checkpoint is read into them
    checkpoints.restore(src, model)
    paths = export(model.encoder, a.output)
    if a.hf:
        paths["hf"] = export_hf(model.encoder, f"{a.output}/hf")
    if fileio.exists(f"{run_dir}/vocab.txt"):
        for where in [a.output] + ([paths["hf"]] if a.hf else []):
            fileio.copy(f"{run_dir}/vocab.txt", f"{where}/vocab.txt")
        paths["vocab"] = f"{a.output}/vocab.txt"
    print(f"export: encoder of {src} -> {a.output}", flush=True)
    return paths


if __name__ == "__main__":
    main()
