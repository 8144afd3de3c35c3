"""BERT pretraining (masked LM + next sentence) in Keras 3; runs unchanged on a TPU, GPUs or a CPU, on the TensorFlow
or the JAX backend (Keras's own KERAS_BACKEND, which tpuctl sets).

    python train.py --data 'DIR/part-*.tfrecord' --vocab-size 30000 --preset tiny --steps 1000

One line every --log-every steps: step, loss (the optimised total: masked-LM loss over the real masked tokens plus
the next-sentence loss), each term and accuracy, examples/s; the same values go to TensorBoard
(OUTPUT/tensorboard, x axis = step) and to OUTPUT/metrics.json for `tpuctl jobs`. A checkpoint every
--checkpoint-minutes (at a log line), or at every multiple of --checkpoint-every, and always at the end, in
OUTPUT/checkpoints (--output, default $TPUCTL_OUTPUT_DIR; the format is checkpoints.py's, read by either backend);
a restarted run resumes from the latest (or from --resume-from) and seeks past the batches it already consumed.
A step is a batch consumed, whether or not mixed_float16's loss scale skipped its update.
Masks are made afresh per batch as the data is read (--static-masks: prepare.py's). Across hosts (JAX), each host
reads its own part of the data and feeds its share of each global batch; the first host alone writes files. Keras
runs callbacks only between executions of --steps-per-execution steps, so both intervals are rounded up to a
multiple of it (with a warning); a run never trains past --steps.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

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
    ap.add_argument("--checkpoint-every", type=int, default=None,
                    help="checkpoint every N steps; default: by time (--checkpoint-minutes)")
    ap.add_argument("--checkpoint-minutes", type=float, default=10.0,
                    help="without --checkpoint-every: a checkpoint at the first log line this long after the last "
                         "(BERT-base's 1.3 GB takes seconds to write: every 100 steps cost a tenth of the run)")
    ap.add_argument("--static-masks", action="store_true",
                    help="train on the masks prepare.py wrote (exact reproduction); by default each batch is "
                         "masked afresh as it is read, so each pass over the data masks an example differently")
    ap.add_argument("--masked-lm-prob", type=float, default=0.15, help="the fraction of tokens dynamic masks mask")
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
                    help="reproducible to the bit on one machine and backend: deterministic ops (TensorFlow's "
                         "op determinism; JAX's CPU and TPU programs are deterministic as compiled), dropout seeds "
                         "checkpointed, so a resumed run repeats an uninterrupted one exactly")
    return ap.parse_args(argv)


def optimizer(lr):
    """BERT's AdamW: weight decay 0.01 on every weight but biases and layer norms (what the reference's
    AdamWeightDecay excludes), gradients clipped to norm 1. Keras 3 matches these names against each variable's own
    name (keras/src/optimizers/base_optimizer.py _use_weight_decay), which for a layer norm is gamma or beta."""
    import keras
    opt = keras.optimizers.AdamW(lr, weight_decay=0.01, epsilon=1e-6, global_clipnorm=1.0)
    opt.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return opt


def describe(out: str, config, data: str) -> None:
    """OUTPUT/bert_config.json and the data's vocab.txt (prepare.py writes it beside the shards) next to the
    checkpoints: a downloaded run is enough to export and fine-tune from, with no flags to remember."""
    import fileio
    fileio.makedirs(out)
    config.write(out)
    vocab = f"{os.path.dirname(data)}/vocab.txt"
    if fileio.exists(vocab):
        fileio.copy(vocab, f"{out}/vocab.txt")


def _multiple(n: int, of: int, flag: str) -> int:
    """n rounded up to a multiple of `of` (Keras calls back only between executions), said when it changes."""
    rounded = -(-n // of) * of
    if rounded != n:
        print(f"bert: {flag} {n} rounded up to {rounded}, a multiple of --steps-per-execution {of}", flush=True)
    return rounded


def masks_for(a, backend: str):
    """Dynamic masks (masking.Masks), or None for prepare.py's own: asked (--static-masks), or where the special
    tokens' ids are unknown (no vocab.txt beside the data, as prepare.py writes it), or on a TPU Node, whose input
    pipeline runs on the TPU's host, out of reach of the numpy function that masks."""
    import fileio
    import masking
    from tpuctl import runtime
    if a.static_masks:
        return None
    vocab = f"{os.path.dirname(a.data)}/vocab.txt"
    sp = masking.specials_of(fileio.read(vocab).decode("utf-8").splitlines()) if fileio.exists(vocab) else None
    if sp is None:
        print(f"bert: no vocab.txt with [CLS], [SEP] and [MASK] beside --data ({vocab}): training on the data's own "
              "masks", flush=True)
        return None
    target = runtime.tpu_target() if backend == "tensorflow" else None
    if target and target[1]:
        print("bert: a TPU Node runs the input pipeline on its own host: training on the data's own masks", flush=True)
        return None
    return masking.Masks(sp, a.masked_lm_prob, a.vocab_size)


def restore(a, model, opt, ckpt_dir: str) -> int:
    """The latest checkpoint of this run (or --resume-from's), else --init-from's weights for a new phase. Returns
    the step to go on from: the batches consumed, as the checkpoint's name says (checkpoints.step_of)."""
    import checkpoints
    from tpuctl import runtime
    src = checkpoints.latest(ckpt_dir) or (checkpoints.find(a.resume_from) if a.resume_from else None)
    if src:
        checkpoints.restore(src, model, opt)
        print(f"bert: resumed from step {checkpoints.step_of(src)} ({src})", flush=True)
        return checkpoints.step_of(src)
    if a.init_from or a.init_from_run:
        given = a.init_from or f"{runtime.output_of(a.init_from_run)}/checkpoints"
        init = checkpoints.find(given)
        if init is None:
            raise SystemExit(f"train.py: no checkpoint in {given}")
        checkpoints.restore(init, model)   # the weights only: the optimizer and its step start afresh
        print(f"bert: initialised from {init}", flush=True)
    return 0


def main(argv=None, strategy=None) -> dict:
    a = parse(argv)
    import keras
    from tpuctl import runtime
    # "mean_with_sample_weight" (losses.py) exists from Keras 3.7; runtime.jax_replicas asks 3.11 across hosts
    runtime.require_keras("3.7", "jobs/bert_pretrain (the masked-LM loss's mean_with_sample_weight reduction)")

    import losses
    from callbacks import Board, Lazy, Position, Progress, Saver
    from data import dataset, reader
    from model import BertConfig, BertPretrainer, example_inputs, symbolic
    backend = keras.backend.backend()
    if a.deterministic and backend == "tensorflow":
        import tensorflow as tf
        tf.config.experimental.enable_op_determinism()
    # SIGTERM: a checkpoint at the next step's end, then exit (callbacks.Saver); at once while nothing is unsaved
    # (before the first step of this start, its compile included, and after the final checkpoint: evaluation)
    unsaved: dict = {"saver": None}
    runtime.listen_for_stop(lambda: unsaved["saver"] is None or unsaved["saver"].nothing_unsaved())
    strategy = strategy or runtime.strategy()
    kind = runtime.kind(strategy)
    print(f"backend: {backend}, {strategy.num_replicas_in_sync} {kind} replica(s)", flush=True)
    policy = runtime.mixed_precision(kind)
    batch = runtime.global_batch(a.batch_size, strategy)
    # across hosts (JAX) each process reads its own part of the data and feeds its share of each global batch
    host = (getattr(strategy, "process_index", 0), getattr(strategy, "process_count", 1))
    chief = host[0] == 0   # the one process that writes checkpoints, TensorBoard and the run's files
    if batch % host[1]:
        raise SystemExit(f"train.py: the global batch {batch} does not divide among {host[1]} hosts")
    spe = a.steps_per_execution or (100 if kind == "tpu" else 1)
    log_every = _multiple(a.log_every or max(10, spe), spe, "--log-every")
    ckpt_every = _multiple(a.checkpoint_every, spe, "--checkpoint-every") if a.checkpoint_every else None
    out = a.output or runtime.output_dir()
    warmup = a.warmup_steps if a.warmup_steps is not None else max(1, min(a.steps // 10, 10000))
    base_lr, at_batch = LEARNING_RATES[a.preset]
    base_lr = a.learning_rate or base_lr
    peak = runtime.scaled_lr(base_lr, batch, at_batch, rule="sqrt")
    print(f"bert: {a.preset} on {kind} x{strategy.num_replicas_in_sync} replicas, global batch {batch}, "
          f"{policy}, seq {a.seq_length}, {a.steps} steps, peak learning rate {peak:.2e}", flush=True)
    config = BertConfig.preset(a.preset, a.vocab_size)
    if host[1] > 1:
        print(f"bert: host {host[0]} of {host[1]} feeds {batch // host[1]} of each batch", flush=True)
    if chief:
        describe(out, config, a.data)
    # Seeded here, after the chief's own writes: every unseeded initializer and dropout draws its seed from Python's
    # random (runtime.seed), which a write to gs:// draws from too (google-resumable-media's multipart boundary,
    # _upload.py get_boundary: random.randrange), so across hosts the processes would build different weights and
    # JAX refuses them (device_put: "is not the same on each process"). On JAX without importing TensorFlow.
    runtime.seed(a.seed)
    with strategy.scope():
        model = BertPretrainer(config)
        lr = runtime.schedule(base_lr, batch, at_batch, warmup, a.steps, rule="sqrt")
        opt = optimizer(lr)
        # XLA: always on JAX (its only mode), on TensorFlow on a TPU or with --jit
        model.compile(optimizer=opt, steps_per_execution=spe,
                      jit_compile=True if backend != "tensorflow" else bool(a.jit or kind == "tpu"))
        # build the variables before restoring, from a made-up sequence's shapes (model.symbolic: nothing is
        # computed, and so no dropout draws from its seed generator, which exists from the layer's start)
        example = example_inputs(a.seq_length, a.max_predictions_per_seq)
        model(symbolic(example), training=True)
        losses.build(model, example, *losses.example_targets(a.max_predictions_per_seq))
        # the step is the batches consumed, counted on the host (callbacks.py); the optimizer's own count falls
        # behind it by every step mixed_float16's loss scale skips
        start = restore(a, model, model.optimizer, f"{out}/checkpoints")
    if start >= a.steps:
        print(f"bert: already at step {start} >= {a.steps}; nothing to do", flush=True)
        return {"step": start}
    # The batches a resumed run already trained on are skipped, so it sees what an uninterrupted run would.
    masks = masks_for(a, backend)
    ds = dataset(a.data, batch // host[1], a.seq_length, a.max_predictions_per_seq, seed=a.seed, skip=start,
                 host=host, masks=masks)
    history: dict = {}
    metrics = runtime.metrics_callback(every=log_every, path=f"{out}/metrics.json", start=start, end=a.steps)
    # where the reader begins, as the reader itself says (data.reader, records.Batches.position), for a drill to
    # check against an uninterrupted run's position at this step; then after each step (Position, in memory). After
    # the metrics callback, which says where phase.json goes.
    runtime.data_position(start, reader(ds).position(0))
    board = Board(f"{out}/tensorboard/train" if chief else None, backend)
    progress = Progress(start, a.steps, log_every, batch, lr, board, history, chief)
    saver = Saver(f"{out}/checkpoints", start, a.steps, ckpt_every, log_every, metrics, history,
                  minutes=a.checkpoint_minutes, chief=chief)
    unsaved["saver"] = saver
    # Exactly the steps left: Keras 3 runs whole executions of --steps-per-execution steps while steps_per_epoch
    # lasts (keras/src/trainers/epoch_iterator.py), so a data source that ends at the last step is what stops a
    # partial last execution there (tf.data's get_next_as_optional on TensorFlow, a short buffer on JAX).
    left = a.steps - start
    data = ds.take(left) if backend == "tensorflow" else (b for b in itertools.islice(iter(ds), left))
    model.fit(data, steps_per_epoch=left, epochs=1, verbose=0,
              shuffle=False,   # the pipeline shuffles, seeded
              callbacks=Lazy([progress, metrics, Position(start, a.steps, reader(ds)), saver], model, left))
    if history.get("continue"):
        raise SystemExit(runtime.CONTINUE_CODE)
    if history.get("stopped"):
        raise SystemExit(runtime.STOPPED_CODE)   # restarted from its checkpoint (submit --max-restarts)
    if a.eval_data:
        runtime.phase("eval", saver.step)   # the final checkpoint is written: a stop here loses nothing
        held = dataset(a.eval_data, batch // host[1], a.seq_length, a.max_predictions_per_seq, training=False,
                       host=host)
        history["eval"] = {k: float(v) for k, v in model.evaluate(
            held if backend == "tensorflow" else iter(held), steps=a.eval_steps, verbose=0,
            return_dict=True).items()}
        print("eval  " + "  ".join(f"{k} {v:.4f}" for k, v in history["eval"].items()), flush=True)
    runtime.sync(model)
    # "updates": the optimizer's own count, short of "step" by the steps a float16 loss scale skipped
    return {"step": saver.step, "updates": int(model.optimizer.iterations.numpy()), **history}


if __name__ == "__main__":
    main()
