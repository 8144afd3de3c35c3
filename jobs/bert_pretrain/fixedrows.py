"""The fixed-width copy of each TFRecord shard that prepare.py writes beside it (part-N.tfrecord ->
part-N.rows.npy): one numpy structured row per example, the TFRecord's fields in the narrowest types that hold
them. The JAX backend's reader (records.py) memory-maps it: a batch is a gather of rows, a resume a seek by row,
with no protobuf to decode (decoding records in Python ran at ~5,000 sequences/s, where tf.data reads ~86,000).
Shards without the copy (TFRecords from another tool, or an older prepare.py) are decoded once into the same rows.
"""
from __future__ import annotations

import os

import fileio
import numpy as np

SUFFIX = ".rows.npy"

# field -> (numpy type, width: "seq", "pred" or 1)
FIELDS = {"input_ids": ("<i4", "seq"), "input_mask": ("i1", "seq"), "segment_ids": ("i1", "seq"),
          "masked_lm_positions": ("<i2", "pred"), "masked_lm_ids": ("<i4", "pred"),
          "masked_lm_weights": ("<f4", "pred"), "next_sentence_labels": ("i1", 1)}


def dtype(max_seq: int, max_pred: int) -> np.dtype:
    if max_seq > 32767:
        raise ValueError("sequences longer than 32767 do not fit int16 positions")
    size = {"seq": max_seq, "pred": max_pred, 1: 1}
    return np.dtype([(k, t, (size[w],)) for k, (t, w) in FIELDS.items()])


def path_of(shard: str) -> str:
    return (shard[:-len(".tfrecord")] if shard.endswith(".tfrecord") else shard) + SUFFIX


def to_rows(ints: dict, floats: dict, max_seq: int, max_pred: int) -> np.ndarray:
    """prepare.encode's arrays -> rows."""
    fields = {**ints, **floats}
    n = len(fields["input_ids"])
    rows = np.zeros(n, dtype(max_seq, max_pred))
    for k in FIELDS:
        rows[k] = np.asarray(fields[k]).reshape(n, -1)
    return rows


def save(path: str, rows: np.ndarray) -> None:
    tmp = f"{path}.tmp{os.getpid()}.npy"
    np.save(tmp, rows, allow_pickle=False)
    os.replace(tmp, path)


def load(shard: str, max_seq: int, max_pred: int) -> np.ndarray:
    """The rows of one TFRecord shard: its .rows.npy memory-mapped (a gs:// one downloaded to a local file first),
    else its records decoded (slow: said once per shard)."""
    want = dtype(max_seq, max_pred)
    side = path_of(shard)
    if fileio.exists(side):
        rows = np.load(fileio.local_copy(side), mmap_mode="r", allow_pickle=False)
        if rows.dtype != want:
            raise ValueError(f"{side} holds {rows.dtype}, not rows of seq {max_seq} and {max_pred} predictions")
        return rows
    print(f"bert: {shard} has no {SUFFIX} beside it (prepare.py writes one): decoding its records", flush=True)
    return decode(shard, max_seq, max_pred)


def decode(shard: str, max_seq: int, max_pred: int) -> np.ndarray:
    import io

    from tfrecord import parse_example, read_records
    src = open(shard, "rb") if not fileio.remote(shard) else io.BytesIO(fileio.read(shard))
    with src:
        parsed = [parse_example(r) for r in read_records(src)]
    rows = np.zeros(len(parsed), dtype(max_seq, max_pred))
    for k in FIELDS:
        if parsed:
            rows[k] = np.stack([np.asarray(p[k]).reshape(rows.dtype[k].shape) for p in parsed])
    return rows
