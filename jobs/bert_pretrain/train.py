"""BERT pretraining (masked LM + next sentence) with tf-keras; runs unchanged on a TPU, GPUs or a CPU.

    python train.py --data 'DIR/part-*.tfrecord' --vocab-size 30000 --preset tiny --steps 1000

Checkpoints go to --output (default $TPUCTL_OUTPUT_DIR) every --checkpoint-every steps; a restarted run resumes
from the latest one there (or from --resume-from). One line per --log-every steps: step, loss, masked-LM accuracy,
examples/s. TensorBoard scalars go to OUTPUT/tensorboard.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="TFRecord glob (local or gs://)")
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--preset", default="tiny", choices=["tiny", "mini", "base", "large"])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32, help="per replica")
    ap.add_argument("--learning-rate", type=float, default=None,
                    help="peak at a global batch of 256, scaled linearly (default by preset: tiny 2e-3, mini 1e-3, "
                         "base/large 1e-4 as in the BERT paper)")
    ap.add_argument("--warmup-steps", type=int, default=None, help="default: 10%% of --steps")
    ap.add_argument("--seq-length", type=int, default=128)
    ap.add_argument("--max-predictions-per-seq", type=int, default=20)
    ap.add_argument("--steps-per-execution", type=int, default=None, help="default: 100 on TPU, 1 elsewhere")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--output", default=None)
    ap.add_argument("--resume-from", default=None, help="a checkpoint directory to start from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jit", action="store_true", help="XLA-compile the step (always on TPU)")
    return ap.parse_args(argv)


def main(argv=None, strategy=None) -> dict:
    a = parse(argv)
    import tensorflow as tf

    from data import dataset
    from model import Bert
    from tpuctl import runtime
    tf.keras.utils.set_random_seed(a.seed)
    strategy = strategy or runtime.strategy()
    kind = runtime.kind(strategy)
    policy = runtime.mixed_precision(kind)
    batch = runtime.global_batch(a.batch_size, strategy)
    spe = a.steps_per_execution or (100 if kind == "tpu" else 1)
    interval = max(1, a.log_every)
    if spe > interval:
        spe = interval
    out = a.output or runtime.output_dir()
    ckpt_dir = f"{out}/checkpoints"
    warmup = a.warmup_steps if a.warmup_steps is not None else max(1, a.steps // 10)
    print(f"bert: {a.preset} on {kind} x{strategy.num_replicas_in_sync} replicas, global batch {batch}, "
          f"{policy}, seq {a.seq_length}, {a.steps} steps", flush=True)
    ds = dataset(a.data, batch, a.seq_length, a.max_predictions_per_seq, seed=a.seed)
    with strategy.scope():
        model = Bert(a.vocab_size, a.preset, max_seq=a.seq_length)
        base_lr = a.learning_rate or {"tiny": 2e-3, "mini": 1e-3}.get(a.preset, 1e-4)
        lr = runtime.schedule(base_lr, batch, 256, warmup, a.steps)
        opt = tf.keras.optimizers.AdamW(lr, weight_decay=0.01, epsilon=1e-6, global_clipnorm=1.0)
        opt.exclude_from_weight_decay(var_names=["bias", "LayerNorm", "layer_normalization"])
        model.compile(optimizer=opt,
                      loss={"mlm": tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                            "nsp": tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                      weighted_metrics={"mlm": [tf.keras.metrics.SparseCategoricalAccuracy(name="acc")]},
                      steps_per_execution=spe, jit_compile=a.jit or kind == "tpu")
        model(next(iter(ds))[0])   # build the variables before restoring
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    manager = tf.train.CheckpointManager(ckpt, ckpt_dir, max_to_keep=3)
    src = manager.latest_checkpoint or (tf.train.latest_checkpoint(a.resume_from) if a.resume_from else None)
    if src:
        ckpt.restore(src).expect_partial()
        print(f"bert: resumed from step {int(opt.iterations.numpy())} ({src})", flush=True)
    start = int(opt.iterations.numpy())
    if start >= a.steps:
        print(f"bert: already at step {start} >= {a.steps}; nothing to do", flush=True)
        return {"step": start}
    history = {}

    class Report(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            step = int(opt.iterations.numpy())
            rate = interval * batch / (time.perf_counter() - self.t)
            logs = logs or {}
            history.setdefault("loss", []).append(float(logs.get("loss", 0)))
            print(f"step {step:6d}  loss {logs.get('loss', 0):.4f}  mlm_acc {logs.get('mlm_acc', 0):.4f}  "
                  f"nsp_loss {logs.get('nsp_loss', 0):.4f}  examples/s {rate:7.1f}", flush=True)
            history["examples_per_s"] = rate
            logs["examples_per_s"] = rate   # recorded by the metrics callback that follows
            if step % a.checkpoint_every == 0 or step >= a.steps:
                manager.save(checkpoint_number=step)

    epochs = -(-a.steps // interval)
    model.fit(ds, steps_per_epoch=interval, epochs=epochs, initial_epoch=start // interval, verbose=0,
              callbacks=[Report(), runtime.metrics_callback(path=f"{out}/metrics.json"),
                         tf.keras.callbacks.TensorBoard(f"{out}/tensorboard", update_freq="epoch")])
    return {"step": int(opt.iterations.numpy()), **history}


if __name__ == "__main__":
    main()
