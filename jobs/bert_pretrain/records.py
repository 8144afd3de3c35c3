"""The training batches read without TensorFlow (the JAX backend's input pipeline): TFRecord shards parsed by
tfrecord.py's reader, in the same shape of pipeline as data.tf_dataset: shards in a seeded order per pass,
interleaved record by record over up to 8 open shards, a seeded 10,000-record shuffle buffer, batches of whole
records (the remainder dropped), the first `skip` batches of a resumed run read but not parsed, and a thread
that parses the next batches while the step runs. The same seed gives the same batches on every run.
"""
from __future__ import annotations

import io
import queue
import threading

import fileio
import numpy as np
from data import FIELDS, split
from tfrecord import parse_example, read_records

BUFFER = 10000


def _open(path: str):
    return open(path, "rb") if not fileio.remote(path) else io.BytesIO(fileio.read(path))


class Batches:
    """An iterable of (x, y, sample weights) batches of numpy arrays (iterate it once)."""

    def __init__(self, files: list[str], batch: int, max_seq: int, max_pred: int, seed: int = 0,
                 training: bool = True, skip: int = 0, cycle: int = 8, buffer: int = BUFFER, prefetch: int = 4):
        self.files, self.batch, self.seed, self.training, self.skip = sorted(files), batch, seed, training, skip
        self.cycle, self.buffer, self.prefetch = min(cycle, len(files)), buffer, prefetch
        self.size = {"seq": max_seq, "pred": max_pred, 1: 1}

    def _files(self):
        """Shard paths, pass after pass: each pass in its own seeded order when training, once in name order
        otherwise."""
        p = 0
        while True:
            yield from (np.random.default_rng([self.seed, p]).permutation(self.files).tolist() if self.training
                        else self.files)
            if not self.training:
                return
            p += 1

    def records(self):
        """Records interleaved one at a time over `cycle` open shards; a finished shard's slot goes to the next."""
        paths = self._files()
        open_ = [read_records(_open(p)) for p in (next(paths, None) for _ in range(self.cycle)) if p]
        while open_:
            i = 0
            while i < len(open_):
                r = next(open_[i], None)
                if r is None:
                    p = next(paths, None)
                    if p is None:
                        del open_[i]
                        continue
                    open_[i] = read_records(_open(p))
                    continue
                yield r
                i += 1

    def shuffled(self):
        src = self.records()
        if not self.training:
            yield from src
            return
        rng = np.random.default_rng(self.seed)
        buf = [r for _, r in zip(range(self.buffer), src)]
        for r in src:
            i = int(rng.integers(len(buf)))
            yield buf[i]
            buf[i] = r
        while buf:   # only a finite source gets here
            yield buf.pop(int(rng.integers(len(buf))))

    def raw_batches(self):
        it = self.shuffled()
        while True:
            rows = [r for _, r in zip(range(self.batch), it)]
            if len(rows) < self.batch:
                return
            yield rows

    def parse(self, rows: list[bytes]) -> tuple:
        parsed = [parse_example(r) for r in rows]
        ex = {}
        for k, n in FIELDS.items():
            dtype = np.float32 if k == "masked_lm_weights" else np.int64
            ex[k] = np.stack([np.asarray(p[k], dtype).reshape(self.size[n]) for p in parsed])
        return split(ex, lambda a: a.astype(np.int32), lambda a: np.ones(a.shape, np.float32))

    def __iter__(self):
        """Parsed batches, made ahead by a thread (a bounded queue: it stays `prefetch` batches ahead)."""
        q: queue.Queue = queue.Queue(self.prefetch)
        stop = threading.Event()

        def produce():
            try:
                raw = self.raw_batches()
                for _ in range(self.skip):
                    if next(raw, None) is None:
                        break
                for rows in raw:
                    if stop.is_set():
                        return
                    q.put(self.parse(rows))
                q.put(None)
            except BaseException as e:   # handed to the consumer: a bad shard fails the run, not just the thread
                q.put(e)
        threading.Thread(target=produce, daemon=True, name="records").start()
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
