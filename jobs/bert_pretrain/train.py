"""BERT pretraining (masked LM + next sentence) with tf-keras; runs unchanged on a TPU, GPUs or a CPU.

    python train.py --data 'DIR/part-*.tfrecord' --vocab-size 30000 --preset tiny --steps 1000

One line every --log-every steps: step, loss (the optimised total: masked-LM loss over the real masked tokens plus
the next-sentence loss), each term and accuracy, examples/s; the same values go to TensorBoard
(OUTPUT/tensorboard, x axis = step) and to OUTPUT/metrics.json for `tpuctl jobs`. A checkpoint at every multiple
of --checkpoint-every and at the last step, in OUTPUT/checkpoints (--output, default $TPUCTL_OUTPUT_DIR); a
restarted run resumes from the latest (or from --resume-from) and skips the batches it already consumed. Keras
runs callbacks only between executions of --steps-per-execution steps, so both intervals are rounded up to a
multiple of it (with a warning); a run never trains past --steps.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# preset -> (peak learning rate, the global batch it is defined at). tiny and mini at the batch they run with by
# default, where 2e-3 / 1e-3 learn within tens of steps; base and large as in the BERT paper (1e-4 at 256).
LEARNING_RATES = {"tiny": (2e-3, 32), "mini": (1e-3, 32), "base": (1e-4, 256), "large": (1e-4, 256)}


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="TFRecord glob (local or gs://)")
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--preset", default="tiny", choices=["tiny", "mini", "base", "large"])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32, help="per replica")
    ap.add_argument("--learning-rate", type=float, default=None,
                    help="peak learning rate at the preset's reference global batch (tiny/mini 32, base/large 256), "
                         "scaled by the square root of the batch ratio (Adam); default by preset: tiny 2e-3, "
                         "mini 1e-3, base/large 1e-4")
    ap.add_argument("--warmup-steps", type=int, default=None, help="default: min(10%% of --steps, 10000)")
    ap.add_argument("--seq-length", type=int, default=128)
    ap.add_argument("--max-predictions-per-seq", type=int, default=20)
    ap.add_argument("--steps-per-execution", type=int, default=None, help="default: 100 on TPU, 1 elsewhere")
    ap.add_argument("--log-every", type=int, default=None, help="default: 10, or --steps-per-execution if larger")
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--output", default=None)
    ap.add_argument("--resume-from", default=None, help="a checkpoint directory to start from")
    ap.add_argument("--init-from", default=None,
                    help="start a new phase from these weights (a checkpoint or its directory), e.g. phase 2 at seq "
                         "512 from phase 1 at 128; the optimizer and step start afresh")
    ap.add_argument("--init-from-run", default=None, metavar="RUN_ID",
                    help="--init-from the checkpoints of an earlier tpuctl run on this cluster (see `tpuctl jobs`)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-data", default=None, help="TFRecord glob of held-out data, evaluated after training")
    ap.add_argument("--eval-steps", type=int, default=20, help="batches of --eval-data to evaluate")
    ap.add_argument("--jit", action="store_true", help="XLA-compile the step (always on TPU)")
    ap.add_argument("--deterministic", action="store_true",
                    help="reproducible to the bit on one machine: deterministic ops, and dropout drawn from "
                         "random generators whose state is checkpointed, so a resumed run repeats an "
                         "uninterrupted one exactly")
    return ap.parse_args(argv)


def optimizer(lr):
    """BERT's AdamW: weight decay 0.01 on every weight but biases and layer norms (the names the reference's
    AdamWeightDecay excludes, with this model's `*_layer_norm` among them), gradients clipped to norm 1."""
    import tensorflow as tf
    opt = tf.keras.optimizers.AdamW(lr, weight_decay=0.01, epsilon=1e-6, global_clipnorm=1.0)
    opt.exclude_from_weight_decay(var_names=["bias", "LayerNorm", "layer_norm", "layer_normalization"])
    return opt


def describe(out: str, config, data: str) -> None:
    """OUTPUT/bert_config.json and the data's vocab.txt (prepare.py writes it beside the shards) next to the
    checkpoints: a downloaded run is enough to export and fine-tune from, with no flags to remember."""
    import tensorflow as tf
    tf.io.gfile.makedirs(out)
    config.write(out)
    vocab = f"{os.path.dirname(data)}/vocab.txt"
    if tf.io.gfile.exists(vocab):
        tf.io.gfile.copy(vocab, f"{out}/vocab.txt", overwrite=True)


def _multiple(n: int, of: int, flag: str) -> int:
    """n rounded up to a multiple of `of` (Keras calls back only between executions), said when it changes."""
    rounded = -(-n // of) * of
    if rounded != n:
        print(f"bert: {flag} {n} rounded up to {rounded}, a multiple of --steps-per-execution {of}", flush=True)
    return rounded


def main(argv=None, strategy=None) -> dict:
    a = parse(argv)
    import tensorflow as tf

    from data import dataset
    from model import BertConfig, BertPretrainer, example_inputs
    from tpuctl import runtime
    tf.keras.utils.set_random_seed(a.seed)
    if a.deterministic:
        tf.config.experimental.enable_op_determinism()
        tf.keras.backend.experimental.enable_tf_random_generator()   # each dropout layer's tf.random.Generator
    strategy = strategy or runtime.strategy()
    kind = runtime.kind(strategy)
    policy = runtime.mixed_precision(kind)
    batch = runtime.global_batch(a.batch_size, strategy)
    spe = a.steps_per_execution or (100 if kind == "tpu" else 1)
    log_every = _multiple(a.log_every or max(10, spe), spe, "--log-every")
    ckpt_every = _multiple(a.checkpoint_every, spe, "--checkpoint-every")
    out = a.output or runtime.output_dir()
    ckpt_dir = f"{out}/checkpoints"
    warmup = a.warmup_steps if a.warmup_steps is not None else max(1, min(a.steps // 10, 10000))
    base_lr, at_batch = LEARNING_RATES[a.preset]
    base_lr = a.learning_rate or base_lr
    peak = runtime.scaled_lr(base_lr, batch, at_batch, rule="sqrt")
    print(f"bert: {a.preset} on {kind} x{strategy.num_replicas_in_sync} replicas, global batch {batch}, "
          f"{policy}, seq {a.seq_length}, {a.steps} steps, peak learning rate {peak:.2e}", flush=True)
    config = BertConfig.preset(a.preset, a.vocab_size)
    describe(out, config, a.data)
    with strategy.scope():
        model = BertPretrainer(config)
        lr = runtime.schedule(base_lr, batch, at_batch, warmup, a.steps, rule="sqrt")
        opt = optimizer(lr)
        model.compile(optimizer=opt, steps_per_execution=spe, jit_compile=a.jit or kind == "tpu",
                      weighted_metrics=[])   # the weights are the train step's own (losses.py)
    with strategy.scope():
        # build the variables before restoring, from a made-up sequence: a batch of the data would fill the
        # 10,000-record shuffle buffer once more just for this (in training mode when deterministic: the dropout
        # generators are made at their first draw, and must exist to be checkpointed)
        model(example_inputs(a.seq_length, a.max_predictions_per_seq), training=a.deterministic)
    # Each dropout layer's generator (tf-keras keeps it in `_random_generator._generator`): checkpointed with the
    # weights, so a resumed run draws the masks the uninterrupted run drew.
    rngs = [g for g in (getattr(getattr(m, "_random_generator", None), "_generator", None) for m in model.submodules)
            if g is not None] if a.deterministic else []
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt, dropout_rng=rngs)
    manager = tf.train.CheckpointManager(ckpt, ckpt_dir, max_to_keep=3)
    src = manager.latest_checkpoint or (tf.train.latest_checkpoint(a.resume_from) if a.resume_from else None)
    if src:
        ckpt.restore(src).expect_partial()
        print(f"bert: resumed from step {int(opt.iterations.numpy())} ({src})", flush=True)
    elif a.init_from or a.init_from_run:
        given = a.init_from or f"{runtime.output_of(a.init_from_run)}/checkpoints"
        init = tf.train.latest_checkpoint(given) or given
        # the encoder and heads only: the model's own optimizer (and its step) would come along with `model`
        weights = tf.train.Checkpoint(encoder=model.encoder, masked_lm=model.masked_lm,
                                      next_sentence=model.next_sentence)
        status = tf.train.Checkpoint(model=weights).restore(init)
        status.assert_existing_objects_matched()   # every weight found there, or a loud error
        status.expect_partial()                    # what is not taken (the optimizer) is meant to be left
        print(f"bert: initialised from {init}", flush=True)
    start = int(opt.iterations.numpy())
    if start >= a.steps:
        print(f"bert: already at step {start} >= {a.steps}; nothing to do", flush=True)
        return {"step": start}
    # The batches a resumed run already trained on are skipped, so it sees what an uninterrupted run would.
    ds = dataset(a.data, batch, a.seq_length, a.max_predictions_per_seq, seed=a.seed, skip=start)
    history: dict = {}
    board = tf.summary.create_file_writer(f"{out}/tensorboard/train")

    class Progress(tf.keras.callbacks.Callback):
        """Log and TensorBoard on the optimizer's step, whatever the epoch."""

        def on_train_begin(self, logs=None):
            self.t, self.at = time.perf_counter(), start

        def on_train_batch_end(self, _, logs=None):
            step = int(opt.iterations.numpy())
            logs = logs if logs is not None else {}
            last = step >= a.steps
            if step % log_every == 0 or last:
                rate = (step - self.at) * batch / (time.perf_counter() - self.t)
                self.t, self.at = time.perf_counter(), step
                logs["examples_per_s"] = rate   # recorded by the metrics callback that follows
                values = {k: float(v) for k, v in logs.items()}
                history.setdefault("loss", []).append(values["loss"])
                history["examples_per_s"] = rate
                print(f"step {step:6d}  loss {values['loss']:.4f}  mlm_loss {values['mlm_loss']:.4f}  "
                      f"mlm_acc {values['mlm_acc']:.4f}  nsp_loss {values['nsp_loss']:.4f}  "
                      f"nsp_acc {values['nsp_acc']:.4f}  examples/s {rate:7.1f}", flush=True)
                with board.as_default():
                    for k, v in values.items():
                        tf.summary.scalar(k, v, step=step)
                    tf.summary.scalar("learning_rate", float(lr(step)), step=step)
                board.flush()
                self.model.reset_metrics()   # each line averages its own interval

    metrics = runtime.metrics_callback(every=log_every, path=f"{out}/metrics.json")

    class Saver(tf.keras.callbacks.Callback):
        """Checkpoints once the metrics callback has recorded the step: a kill between the two leaves metrics.json
        ahead of the checkpoint, never behind it, so goodput counts the steps a resume re-does. Each save is timed
        as checkpoint time (metrics.checkpointing), not as training."""

        def on_train_batch_end(self, _, logs=None):
            step = int(opt.iterations.numpy())
            last = step >= a.steps
            # A notebook service's session is ending (Kaggle's): stop at a log line, so the next session's lines
            # average the same steps as an uninterrupted run's, with a checkpoint there.
            ending = not last and step % log_every == 0 and runtime.session_ending()
            if step % ckpt_every == 0 or last or ending:
                with metrics.checkpointing():
                    manager.save(checkpoint_number=step)
            if ending:
                print(f"bert: the session ends: checkpoint at step {step}, the next session goes on", flush=True)
                self.model.stop_training = True
                history["continue"] = True

    model.fit(ds, steps_per_epoch=a.steps - start, epochs=1, verbose=0, callbacks=[Progress(), metrics, Saver()])
    if history.get("continue"):
        raise SystemExit(runtime.CONTINUE_CODE)
    if a.eval_data:
        held = dataset(a.eval_data, batch, a.seq_length, a.max_predictions_per_seq, training=False)
        history["eval"] = {k: float(v) for k, v in model.evaluate(held, steps=a.eval_steps, verbose=0,
                                                                   return_dict=True).items()}
        print("eval  " + "  ".join(f"{k} {v:.4f}" for k, v in history["eval"].items()), flush=True)
    return {"step": int(opt.iterations.numpy()), **history}


if __name__ == "__main__":
    main()
