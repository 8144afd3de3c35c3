"""The training data from the TFRecord shards prepare.py writes: tf.data on the TensorFlow backend, a reader of the
job's own (records.py, no TensorFlow) on every other. Both are deterministic for a seed, and a resumed run skips
the batches it already consumed, so it sees what an uninterrupted run would."""
from __future__ import annotations

import fileio

FIELDS = {"input_ids": "seq", "input_mask": "seq", "segment_ids": "seq", "masked_lm_positions": "pred",
          "masked_lm_ids": "pred", "masked_lm_weights": "pred", "next_sentence_labels": 1}


def shards(pattern: str) -> list[str]:
    files = fileio.glob(pattern)
    if not files:
        raise FileNotFoundError(f"no TFRecord shards match {pattern}")
    return files


def dataset(pattern: str, batch: int, max_seq: int, max_pred: int, seed: int = 0, training: bool = True,
            skip: int = 0, backend: str | None = None, host: tuple[int, int] = (0, 1), masks=None):
    """Training: shards in a seeded order, shuffled with a seed, repeated; `batch` examples per host (`host`:
    (index, count)); with `masks` (masking.Masks) masked afresh per batch, else with prepare.py's masks."""
    import keras
    if (backend or keras.backend.backend()) == "tensorflow":
        return tf_dataset(pattern, batch, max_seq, max_pred, seed, training, skip, masks)
    from records import Batches
    return Batches(shards(pattern), batch, max_seq, max_pred, seed=seed, training=training, skip=skip, host=host,
                   masks=masks)


class Began:
    """The TensorFlow reader's position (records.Batches.position's, for runtime.data_position): tf.data hands out
    no record of what it has read (its iterator's state is an opaque checkpoint, and Keras makes the iterator), so
    this is where the pipeline began (the records its ds.skip passed over), plus a batch for each batch consumed.
    A resume that forgot to skip still reports where it began, 0; a pipeline whose order changed would not show."""

    def __init__(self, began: int, batch: int):
        self.began, self.batch = began, batch

    def position(self, consumed: int) -> int:
        return self.began + max(0, consumed) * self.batch


def reader(ds):
    """What knows the reader's position: records.Batches itself, or a tf.data pipeline's Began (tf_dataset)."""
    return getattr(ds, "reader", ds)


def tf_dataset(pattern: str, batch: int, max_seq: int, max_pred: int, seed: int = 0, training: bool = True,
               skip: int = 0, masks=None):
    """tf.data over the TFRecords (one input pipeline: TPUStrategy shards it across a slice's hosts itself).
    Dynamic masks run masking.remask per batch through tf.numpy_function, seeded by the batch's number."""
    import tensorflow as tf
    files = shards(pattern)
    size = {"seq": max_seq, "pred": max_pred, 1: 1}
    spec = {k: tf.io.FixedLenFeature([size[n]], tf.float32 if k == "masked_lm_weights" else tf.int64)
            for k, n in FIELDS.items()}
    ds = tf.data.Dataset.from_tensor_slices(files)
    if training:
        ds = ds.shuffle(len(files), seed=seed).repeat()
    # evaluation reads shard after shard in name order, as records.Batches does
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(8, len(files)) if training else 1,
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if training:
        ds = ds.shuffle(10000, seed=seed)

    from records import split   # the one definition both readers share (records.py holds it: no TensorFlow)

    def remasked(number, ex):
        import numpy as np
        from masking import remask
        names = ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights")

        def fn(b, ids, mask, pos, lm, w):
            out = remask({"input_ids": ids, "input_mask": mask, "masked_lm_positions": pos, "masked_lm_ids": lm,
                          "masked_lm_weights": w}, masks.specials, max_pred, masks.mlm_prob, masks.vocab_size,
                         np.random.default_rng([seed, 0, int(b), 2]))
            return tuple(out[k].astype(np.float32 if k == "masked_lm_weights" else np.int64) for k in names)
        new = tf.numpy_function(fn, [number, ex["input_ids"], ex["input_mask"], *(ex[k] for k in names[1:])],
                                [tf.int64, tf.int64, tf.int64, tf.float32], stateful=False)
        for k, t in zip(names, new):
            ex[k] = tf.ensure_shape(t, ex[k].shape)
        return ex

    def parse(number, records):
        ex = tf.io.parse_example(records, spec)
        if masks is not None:
            ex = remasked(number, ex)
        return split(ex, lambda t: tf.cast(t, tf.int32), lambda t: tf.ones_like(t, tf.float32))
    # Batch first, then parse a whole batch at once: far cheaper than parsing record by record.
    ds = ds.batch(batch, drop_remainder=True)
    began = 0
    if skip:
        ds = ds.skip(skip)   # unparsed: skipping costs reading the records, not parsing them
        began = skip * batch   # set beside the skip itself: a skip dropped here reports 0
    ds = ds.enumerate(start=skip)   # each batch's number seeds its masks
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    ds.reader = Began(began, batch)   # a plain attribute of the pipeline's Python object (lost by a later .take)
    return ds
