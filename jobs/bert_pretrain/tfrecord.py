"""tf.train.Example TFRecords written without importing TensorFlow (importing it costs ~5 s per process).

Each record: uint64 length, masked crc32c of the length, the serialized Example, masked crc32c of the data.
The Example protobuf is assembled by hand; its fixed shapes let the varints of a whole batch be built with numpy.
Tests parse the output back with TensorFlow, so any drift from the real format fails them.
"""
from __future__ import annotations

import struct

import google_crc32c
import numpy as np


def _masked_crc(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def packed_varints(rows: np.ndarray) -> list[bytes]:
    """Packed varint encoding of each row of a non-negative int matrix (values < 2**28), vectorised."""
    v = rows.astype(np.int64)
    if v.size and (v.min() < 0 or v.max() >= 1 << 28):
        raise ValueError("values must be in [0, 2**28)")
    parts = [(v >> (7 * i)) & 0x7F for i in range(4)]
    present = [np.ones_like(v, dtype=bool)] + [v >= (1 << (7 * i)) for i in range(1, 4)]
    for i in range(3):
        parts[i] = parts[i] | (present[i + 1].astype(np.int64) << 7)
    stacked = np.stack(parts, axis=-1).astype(np.uint8)          # N x L x 4
    mask = np.stack(present, axis=-1)                            # N x L x 4
    flat = stacked[mask]
    lengths = mask.reshape(len(v), -1).sum(axis=1)
    ends = np.cumsum(lengths)
    data = flat.tobytes()
    starts = ends - lengths
    return [data[s:e] for s, e in zip(starts.tolist(), ends.tolist())]


_V = [_varint(i) for i in range(1 << 14)]   # lengths here stay below 16 KiB: a table beats a loop


def _len(n: int) -> bytes:
    return _V[n] if n < 16384 else _varint(n)


_HEADS: dict = {}


def _feature_entry(key: bytes, kind_tag: int, payload: bytes) -> bytes:
    """Features.feature map entry {key, Feature{kind_tag: List{value (packed) = payload}}}. Everything before the
    payload depends only on the key, the kind and the payload's length: built once per length, then reused."""
    n = len(payload)
    head = _HEADS.get((key, kind_tag, n))
    if head is None:
        lst = 1 + len(_len(n)) + n                                      # List{1: payload}
        feat = 1 + len(_len(lst)) + lst                                 # Feature{kind_tag: List}
        body = b"\x0a" + _len(len(key)) + key + b"\x12" + _len(feat) + bytes([kind_tag]) + _len(lst) \
            + b"\x0a" + _len(n)                                         # MapEntry{1: key, 2: Feature}
        head = _HEADS[(key, kind_tag, n)] = b"\x0a" + _len(len(body) + n) + body
    return head + payload


def serialize_batch(int_features: dict, float_features: dict) -> list[bytes]:
    """Examples for N rows: int_features name -> (N, L) ints; float_features name -> (N, L) floats."""
    n = len(next(iter(int_features.values())))
    cols = []
    for name, arr in int_features.items():
        key = name.encode()
        cols.append([_feature_entry(key, 0x1A, p) for p in packed_varints(np.asarray(arr).reshape(n, -1))])
    for name, arr in float_features.items():
        key = name.encode()
        rows = np.ascontiguousarray(np.asarray(arr, dtype="<f4").reshape(n, -1))
        width = rows.shape[1] * 4
        flat = rows.tobytes()
        cols.append([_feature_entry(key, 0x12, flat[i * width:(i + 1) * width]) for i in range(n)])
    out = []
    for parts in zip(*cols):
        features = b"".join(parts)
        out.append(b"\x0a" + _len(len(features)) + features)   # Example.features
    return out


def write_records(f, records: list[bytes]) -> None:
    for r in records:
        header = struct.pack("<Q", len(r))
        f.write(header + _masked_crc(header) + r + _masked_crc(r))
