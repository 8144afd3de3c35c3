"""The training batches without TensorFlow (the JAX backend's input pipeline), gathered from each shard's
fixed-width rows (fixedrows.py, memory-mapped), so a batch costs a few numpy gathers, not a protobuf decode per
example (bench/bench_reader.py measures it against tf.data on the same files).

The order is a pure function of (seed, host, batch number), which is what makes a resume a seek rather than a
re-read: pass p over this host's shards visits them in a seeded order, in windows of `cycle` shards whose records
are shuffled together (a full shuffle of 8 shards' records, where a 10,000-record buffer mixed less); batch b holds
records b*batch .. (b+1)*batch-1 of the endless sequence of passes. Evaluation reads each shard once, in name
order, record by record, as data.tf_dataset does.

Across hosts (keras.distribution.DataParallel(auto_shard_dataset=False): each process feeds its own part of the
global batch) host i of n reads shards i::n, or, with fewer shards than hosts, records i::n of every shard, so no
host reads another's examples and none is left without any (a host with no shard cannot feed its share).

The reader's position (for `tpuctl drill`'s data check, runtime.data_position): position(consumed) is the record
index, in that endless sequence, of the first record the reader hands out after the consumer has trained on
`consumed` of its batches: where it began (skip * batch) before any, else the record after the last of the batch it
handed out as the consumed-th. Keyed by the batches handed out, not by what has been read: the prefetch thread and
Keras's own iterator read ahead of the step that trains, so "records read so far" would be ahead of the step by an
amount that differs between runs, while the consumed-th batch handed out is the one step `start + consumed` trained
on (Keras consumes its data in order). A resumed run's reader then reports at its checkpoint's step what an
uninterrupted run's reported there, and one that forgot to skip reports where it really began: 0.

Masks: by default made afresh for each batch (masking.remask, seeded by (seed, host, batch)), so each pass over the
data masks an example differently and a resumed run masks as the uninterrupted one; masks=None keeps prepare.py's.
"""
from __future__ import annotations

import itertools
import queue
import threading
from collections import deque

import fixedrows
import numpy as np
from masking import Masks, remask


def split(ex: dict, to_int, ones) -> tuple:
    """A parsed batch -> (x, y, sample weights), as the model and losses.objective take them."""
    x = {k: to_int(ex[k]) for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")}
    y = {"mlm": to_int(ex["masked_lm_ids"]), "nsp": to_int(ex["next_sentence_labels"])}
    w = {"mlm": ex["masked_lm_weights"], "nsp": ones(ex["next_sentence_labels"])}
    return x, y, w


def assign(files: list[str], host: int, hosts: int) -> tuple[list[str], int, int]:
    """(this host's shards, record offset, record stride): shards i::n where every host gets one, else every shard
    with records i::n."""
    files = sorted(files)
    if hosts <= 1:
        return files, 0, 1
    if len(files) >= hosts:
        return files[host::hosts], 0, 1
    return files, host, hosts


class Batches:
    """An iterable of (x, y, sample weights) batches of numpy arrays, `batch` examples each (per host)."""

    def __init__(self, files: list[str], batch: int, max_seq: int, max_pred: int, seed: int = 0,
                 training: bool = True, skip: int = 0, host: tuple[int, int] = (0, 1), masks: Masks | None = None,
                 cycle: int = 8, prefetch: int = 4):
        self.host, self.hosts = host
        self.files, start, stride = assign(files, *host)
        self.rows = [fixedrows.load(f, max_seq, max_pred)[start::stride] for f in self.files]
        self.counts = np.array([len(r) for r in self.rows], np.int64)
        if not self.counts.sum():
            raise ValueError(f"host {self.host} of {self.hosts} has no examples in {len(self.files)} shard(s)")
        self.batch, self.max_pred, self.seed, self.training, self.skip = batch, max_pred, seed, training, skip
        self.masks, self.cycle, self.prefetch = masks, max(1, min(cycle, len(self.files))), prefetch
        self._pass: tuple[int, np.ndarray, np.ndarray] | None = None
        self.began = skip * batch   # the first record this reader reads, in its endless sequence of passes
        # (ordinal, first record) of each batch handed out and not yet passed by position(): a few entries at a
        # time (the consumer's read-ahead) when position() is asked each step; bounded where it is never asked
        self._handed: deque[tuple[int, int]] = deque(maxlen=4096)

    def order(self, p: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard, row) of each record of pass p, in reading order."""
        n = len(self.rows)
        if not self.training:
            shards = np.arange(n)
        else:
            shards = np.random.default_rng([self.seed, self.host, p]).permutation(n)
        shard_of = np.repeat(shards, self.counts[shards])
        starts = np.cumsum(self.counts[shards]) - self.counts[shards]
        row_of = np.arange(len(shard_of)) - np.repeat(starts, self.counts[shards])
        if self.training:
            rng = np.random.default_rng([self.seed, self.host, p, 1])
            bounds = np.r_[0, np.cumsum(self.counts[shards])][::self.cycle].tolist() + [len(shard_of)]
            for a, b in zip(bounds[:-1], bounds[1:]):
                if b > a:
                    take = a + rng.permutation(b - a)
                    shard_of[a:b], row_of[a:b] = shard_of[take], row_of[take]
        return shard_of, row_of

    def _records(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard, row) of records first .. first+count-1 of the endless sequence of passes."""
        per_pass = int(self.counts.sum())
        shard_parts, row_parts = [], []
        while count:
            p, at = divmod(first, per_pass)
            if self._pass is None or self._pass[0] != p:
                self._pass = (p, *self.order(p))
            n = min(count, per_pass - at)
            shard_parts.append(self._pass[1][at:at + n])
            row_parts.append(self._pass[2][at:at + n])
            first, count = first + n, count - n
        return np.concatenate(shard_parts), np.concatenate(row_parts)

    def rows_of(self, b: int) -> np.ndarray:
        """The fixed-width rows of batch b."""
        shard_of, row_of = self._records(b * self.batch, self.batch)
        out = np.empty(self.batch, self.rows[0].dtype)
        for s in np.unique(shard_of).tolist():
            m = shard_of == s
            out[m] = self.rows[s][row_of[m]]
        return out

    def make(self, b: int) -> tuple:
        """Batch b, parsed and (with masks) masked: a pure function of (seed, host, b)."""
        rows = self.rows_of(b)
        ex = {k: rows[k] for k in fixedrows.FIELDS}
        if self.masks is not None:
            m = self.masks
            ex = remask(ex, m.specials, self.max_pred, m.mlm_prob, m.vocab_size,
                        np.random.default_rng([self.seed, self.host, b, 2]))
        return split(ex, lambda a: a.astype(np.int32), lambda a: np.ones(a.shape, np.float32))

    def __len__(self) -> int:
        """Batches in one pass (evaluation reads one)."""
        return int(self.counts.sum()) // self.batch

    def position(self, consumed: int) -> int | None:
        """The record index the reader hands out next once `consumed` of its batches were trained on: where it began
        for 0, else the record after the last of the consumed-th batch it handed out (None: not handed out, or
        already forgotten). Asked in increasing order (after each step): the batches before are dropped."""
        if consumed <= 0:
            return self.began
        while self._handed and self._handed[0][0] < consumed - 1:
            self._handed.popleft()
        if not self._handed or self._handed[0][0] != consumed - 1:
            return None
        return self._handed[0][1] + self.batch

    def numbers(self):
        """The batch numbers this iterable yields: from `skip` on, endless when training."""
        b = self.skip
        while self.training or b < len(self):
            yield b
            b += 1

    def __iter__(self):
        """Batches made ahead by a thread (a bounded queue: it stays `prefetch` batches ahead)."""
        q: queue.Queue = queue.Queue(self.prefetch)
        stop = threading.Event()

        def produce():
            try:
                for b in self.numbers():
                    if stop.is_set():
                        return
                    q.put((b, self.make(b)))
                q.put(None)
            except BaseException as e:   # handed to the consumer: a bad shard fails the run, not just the thread
                q.put(e)
        threading.Thread(target=produce, daemon=True, name="records").start()
        self._handed.clear()
        try:
            for n in itertools.count():
                item = q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                b, made = item
                self._handed.append((n, b * self.batch))   # handed out as the n-th: position(n + 1) reads it
                yield made
        finally:
            stop.set()
