"""tf.train.Example TFRecords written without importing TensorFlow (importing it costs ~5 s per process).

Each record: uint64 length, masked crc32c of the length, the serialized Example, masked crc32c of the data.
The Example protobuf is assembled by hand; its fixed shapes let the varints of a whole batch be built with numpy.
Tests parse the output back with TensorFlow, so any drift from the real format fails them.
"""
from __future__ import annotations

import struct

import numpy as np


def _table() -> list[int]:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78: RFC 3720 B.4, what TFRecords checksum)."""
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        out.append(c)
    return out


_CRC = _table()


def crc32c_python(data: bytes) -> int:
    """Pure Python, ~1 MB/s: only where google-crc32c (in requirements.txt) is absent, e.g. a notebook that loaded
    the job without its dependencies. Reading prepared data through fixedrows.py checks no CRC at all."""
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


try:
    from google_crc32c import value as crc32c
except ImportError:
    crc32c = crc32c_python


def _masked_crc(data: bytes) -> bytes:
    crc = crc32c(data)
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


# -- reading, without TensorFlow ---------------------------------------------------------------------------------
# The framing (TensorFlow's "TFRecords format details", tensorflow/core/lib/io/record_writer.cc): uint64 length
# (little-endian), uint32 masked crc32c of those 8 bytes, the data, uint32 masked crc32c of the data. An Example
# (tensorflow/core/example/example.proto, feature.proto) is Features{1: map<string, Feature>}; a Feature is one of
# bytes_list (1), float_list (2: packed little-endian float32), int64_list (3: packed varints); TensorFlow writes
# repeated numbers packed (proto3's default) but a parser must accept them unpacked too (protobuf encoding guide,
# "Packed Repeated Fields").

def read_records(f, verify: bool = True):
    """Each record's bytes from an open binary file of TFRecords; a bad checksum or a cut record is an error."""
    while True:
        header = f.read(12)
        if not header:
            return
        if len(header) < 12:
            raise ValueError("truncated TFRecord header")
        n = struct.unpack("<Q", header[:8])[0]
        if verify and _masked_crc(header[:8]) != header[8:12]:
            raise ValueError("TFRecord length checksum mismatch")
        body = f.read(n + 4)
        if len(body) < n + 4:
            raise ValueError("truncated TFRecord")
        if verify and _masked_crc(body[:n]) != body[n:]:
            raise ValueError("TFRecord data checksum mismatch")
        yield body[:n]


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of each field of one message: value is an int (varint), bytes
    (length-delimited) or the 4/8 raw bytes of a fixed field."""
    i, end = 0, len(buf)
    while i < end:
        key, i = _read_varint(buf, i)
        wire = key & 7
        if wire == 0:
            v, i = _read_varint(buf, i)
        elif wire == 2:
            n, i = _read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield key >> 3, wire, v


def unpack_varints(data: bytes) -> np.ndarray:
    """A packed run of varints as int64, vectorised: each value ends at the first byte below 0x80. Values past 63
    bits (negative int64s are 10 bytes) are not used by this job's data."""
    b = np.frombuffer(data, np.uint8)
    if not b.size:
        return np.zeros(0, np.int64)
    ends = b < 0x80
    starts = np.r_[0, np.nonzero(ends)[0][:-1] + 1]
    group = np.cumsum(np.r_[0, ends[:-1]])                    # which value each byte belongs to
    pos = np.arange(b.size) - starts[group]                   # its place within the value
    parts = (b & 0x7F).astype(np.int64) << (7 * pos).astype(np.int64)
    return np.add.reduceat(parts, starts)


def _list(feature: bytes) -> np.ndarray | list:
    for kind, _, lst in _fields(feature):
        ints, floats, raw = [], [], []
        for _, wire, v in _fields(lst):
            if kind == 3:
                ints.append(unpack_varints(v) if wire == 2 else np.array([v], np.int64))
            elif kind == 2:
                floats.append(np.frombuffer(v, "<f4") if wire in (2, 5) else np.zeros(0, "<f4"))
            else:
                raw.append(bytes(v))
        if kind == 3:
            return np.concatenate(ints) if ints else np.zeros(0, np.int64)
        if kind == 2:
            return np.concatenate(floats).astype(np.float32) if floats else np.zeros(0, np.float32)
        return raw
    return np.zeros(0, np.float32)   # a Feature with no list set: empty


def parse_example(record: bytes) -> dict:
    """A serialized tf.train.Example -> {name: int64 array | float32 array | list of bytes}."""
    out = {}
    for num, _, features in _fields(record):
        if num != 1:
            continue
        for _, _, entry in _fields(features):
            name, value = None, b""
            for f, _, v in _fields(entry):
                if f == 1:
                    name = bytes(v).decode()
                elif f == 2:
                    value = v
            if name is not None:
                out[name] = _list(value)
    return out
