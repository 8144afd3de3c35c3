"""tf.data over TFRecord shards with static shapes: parallel interleave, shuffle, drop_remainder batches, prefetch."""
from __future__ import annotations

import tensorflow as tf


def features(max_seq: int, max_pred: int) -> dict:
    f = {k: tf.io.FixedLenFeature([max_seq], tf.int64) for k in ("input_ids", "input_mask", "segment_ids")}
    f.update({k: tf.io.FixedLenFeature([max_pred], tf.int64) for k in ("masked_lm_positions", "masked_lm_ids")})
    f["masked_lm_weights"] = tf.io.FixedLenFeature([max_pred], tf.float32)
    f["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
    return f


def dataset(pattern: str, batch: int, max_seq: int, max_pred: int, seed: int = 0, training: bool = True,
            skip: int = 0):
    """Training: shards in a seeded order, read in a fixed interleave (deterministic, so a resumed run that skips
    the `skip` batches it consumed continues the same sequence), shuffled with a seed, repeated."""
    files = tf.io.gfile.glob(pattern)
    if not files:
        raise FileNotFoundError(f"no TFRecord shards match {pattern}")
    spec = features(max_seq, max_pred)
    ds = tf.data.Dataset.from_tensor_slices(sorted(files))
    if training:
        ds = ds.shuffle(len(files), seed=seed).repeat()
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(8, len(files)),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if training:
        ds = ds.shuffle(10000, seed=seed)

    def parse(records):
        ex = tf.io.parse_example(records, spec)
        ex = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in ex.items()}
        x = {k: ex[k] for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")}
        y = {"mlm": ex["masked_lm_ids"], "nsp": ex["next_sentence_labels"]}
        w = {"mlm": ex["masked_lm_weights"], "nsp": tf.ones_like(ex["next_sentence_labels"], tf.float32)}
        return x, y, w
    # Batch first, then parse a whole batch at once: far cheaper than parsing record by record.
    ds = ds.batch(batch, drop_remainder=True)
    if skip:
        ds = ds.skip(skip)   # unparsed: skipping costs reading the records, not parsing them
    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
