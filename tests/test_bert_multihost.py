"""jobs/bert_pretrain across hosts on the JAX backend, as a multi-host TPU slice runs it: two JAX processes on this
CPU (jax.distributed over localhost, gloo collectives: JAX_CPU_COLLECTIVES_IMPLEMENTATION, a jax config flag read
from the environment, jax/_src/config.py) through train.main, one CPU device each; and the reader's and the masks'
promises that make it right (disjoint hosts, seekable order, masks that change)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import FAST_XLA_FLAGS

JOB = Path(__file__).parent.parent / "jobs" / "bert_pretrain"
sys.path.insert(0, str(JOB))

import masking  # noqa: E402
import prepare  # noqa: E402

SEQ, PRED = 64, 10
STEPS = 4   # a checkpoint every 2: a resume is two steps on each side of the one it starts from

# train.main with what each process reads and writes recorded beside it: the fixed-width rows of each batch (before
# masks), and every file it writes (the job's own fileio, and runtime's metrics.json)
DRIVER = """
import json, os, sys, hashlib
sys.path.insert(0, sys.argv[1])
log = open(sys.argv[2], "a")
import fileio, records
from tpuctl.runtime import metrics_file
def note(kind, value):
    log.write(json.dumps([kind, value]) + "\\n"); log.flush()
rows_of = records.Batches.rows_of
def traced(self, b):
    rows = rows_of(self, b)
    note("batch", [b, [hashlib.sha1(r.tobytes()).hexdigest()[:16] for r in rows]])
    return rows
records.Batches.rows_of = traced
for name in ("write", "copy", "remove", "makedirs"):
    real = getattr(fileio, name)
    def wrapped(*a, _real=real, _name=name):
        note("write", [_name, str(a[-1] if _name == "copy" else a[0])])
        return _real(*a)
    setattr(fileio, name, wrapped)
real_text = metrics_file.write_text
def text(target, *a, **k):
    note("write", ["text", target])
    return real_text(target, *a, **k)
metrics_file.write_text = text
import train
result = train.main(sys.argv[3:])
note("result", {"step": result["step"], "loss": result.get("loss", [])})
"""


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """test_bert.py's corpus and preparation (--vocab-size 3000, SEQ, PRED, --seed 7, --chunk-mb 0.25), made once for
    the run."""
    from test_bert import prepared_corpus
    return prepared_corpus(tmp_path_factory)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(prep, summary, out: Path, logs: Path, steps: int, tag: str, **extra: str) -> list[subprocess.Popen]:
    port = _port()
    args = ["--data", f"{prep}/part-*.tfrecord", "--vocab-size", str(summary["vocab_size"]), "--seq-length", str(SEQ),
            "--max-predictions-per-seq", str(PRED), "--batch-size", "4", "--steps", str(steps), "--log-every", "2",
            "--checkpoint-every", "2", "--deterministic", "--learning-rate", "1e-2", "--warmup-steps", "1",
            "--output", str(out)]
    procs = []
    for i in range(2):
        env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="",
                   TF_CPP_MIN_LOG_LEVEL="2", TPUCTL_NUM_WORKERS="2", TPUCTL_WORKER=str(i),
                   JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo", **extra)
        env["XLA_FLAGS"] = FAST_XLA_FLAGS   # one CPU device per process (no device count), as one host per process
        env.pop("TF_USE_LEGACY_KERAS", None)   # set, it makes runtime pick tf-keras: TensorFlow, one process each
        env.pop("TPUCTL_OUTPUT_DIR", None)
        procs.append(subprocess.Popen([sys.executable, "-c", DRIVER, str(JOB), str(logs / f"{tag}-{i}.jsonl"), *args],
                                      stdout=open(logs / f"{tag}-{i}.out", "w"), stderr=subprocess.STDOUT, env=env))
    return procs


def _wait(procs, logs: Path, tag: str) -> None:
    for i, p in enumerate(procs):
        try:
            rc = p.wait(timeout=900)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            rc = "timeout"
        assert rc == 0, f"process {i}: {rc}\n" + (logs / f"{tag}-{i}.out").read_text()[-3000:]


def _notes(logs: Path, name: str) -> dict:
    out: dict = {"batch": {}, "write": [], "result": None}
    path = logs / f"{name}.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        kind, value = json.loads(line)
        if kind == "batch":
            out["batch"][value[0]] = value[1]
        elif kind == "write":
            out["write"].append(value)
        elif kind == "result":
            out["result"] = value
    return out


def _weights(path: Path) -> list[np.ndarray]:
    import h5py
    found: list = []
    with h5py.File(path) as f:
        f.visititems(lambda name, d: found.append((name, np.asarray(d))) if isinstance(d, h5py.Dataset) else None)
    return [v for _, v in sorted(found, key=lambda kv: kv[0])]


@pytest.mark.slow(80)
def test_two_jax_hosts_train_on_disjoint_data_one_writes_and_a_resume_repeats_the_run_to_the_bit(prepared, tmp_path):
    prep, summary = prepared
    logs = tmp_path / "logs"
    logs.mkdir()
    # uninterrupted, STEPS steps
    ref = tmp_path / "ref"
    _wait(_start(prep, summary, ref, logs, STEPS, "ref"), logs, "ref")
    assert "backend: jax, 2 cpu replica(s)" in (logs / "ref-0.out").read_text()
    hosts = [_notes(logs, f"ref-{i}") for i in range(2)]
    assert all(h["result"]["step"] == STEPS for h in hosts)
    losses = hosts[0]["result"]["loss"]
    assert len(losses) == STEPS // 2 and losses[-1] < losses[0], losses
    # each host read its own examples: no row of one host's batches is in the other's
    # (batches past the last step were made ahead of need, and never trained on)
    seen = [{r for b, rows in h["batch"].items() if b < STEPS for r in rows} for h in hosts]
    assert len(seen[0]) == len(seen[1]) == STEPS * 4 and not seen[0] & seen[1]
    # only the first host wrote anything (the second's checkpoints stayed in its temporary files)
    assert hosts[1]["write"] == [], hosts[1]["write"]
    assert any(f"ckpt-{STEPS}.weights.h5" in w[1] for w in hosts[0]["write"])
    assert sorted(p.name for p in (ref / "checkpoints").iterdir() if p.name.endswith(".h5")) == \
        [f"ckpt-{s}.weights.h5" for s in range(2, STEPS + 1, 2)]

    # the same run started again from its step-2 checkpoint (what a slice preempted after it finds: its files as the
    # uninterrupted run wrote them, ckpt-2 the latest). A real kill of such a run's two JAX processes (one host's job
    # SIGKILLed, the chief held after ckpt-2 and killed) and their resume from ckpt-2 with the first start's rows is
    # test_bert_on_sim_hosts's; this one adds that the resumed weights are the uninterrupted run's to the bit
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for saved in (ref / "checkpoints").glob("ckpt-2.*"):   # its weights and state
        shutil.copy(saved, run / "checkpoints")
    _wait(_start(prep, summary, run, logs, STEPS, "resumed"), logs, "resumed")
    for i in range(2):
        out = (logs / f"resumed-{i}.out").read_text()
        assert "resumed from step 2" in out, out[-2000:]
        resumed = _notes(logs, f"resumed-{i}")
        # each host went on from the batch after the checkpoint, with the rows the uninterrupted run read there
        assert min(resumed["batch"]) == 2
        for b, rows in resumed["batch"].items():
            if b < STEPS:
                assert rows == hosts[i]["batch"][b], b
    assert _notes(logs, "resumed-1")["write"] == []
    # and reached the uninterrupted run's weights, bit for bit
    for mine, theirs in zip(_weights(run / "checkpoints" / f"ckpt-{STEPS}.weights.h5"),
                            _weights(ref / "checkpoints" / f"ckpt-{STEPS}.weights.h5")):
        assert np.array_equal(mine, theirs)


def _rows(prep):
    import data
    import records
    return records, data.shards(f"{prep}/part-*.tfrecord")


def test_hosts_read_disjoint_shards_or_records_and_together_read_everything(prepared):
    prep, summary = prepared
    records, files = _rows(prep)
    assert len(files) == 3
    for hosts in (2, 3, 5):   # fewer shards than hosts at 5: records are strided instead
        parts = [records.Batches(files, 4, SEQ, PRED, training=False, host=(i, hosts)) for i in range(hosts)]
        ids = [{hashlib.sha1(r.tobytes()).hexdigest() for rows in p.rows for r in rows} for p in parts]
        assert sum(len(s) for s in ids) == summary["examples"] == len(set().union(*ids)), hosts
        assert all(ids), hosts   # no host without data (maxtext#3807's failure: a host with no shard)


def test_a_resume_seeks_to_the_batch_it_left_without_reading_what_came_before(prepared, monkeypatch):
    prep, _ = prepared
    records, files = _rows(prep)
    first = records.Batches(files, 16, SEQ, PRED, seed=3)
    made = [first.make(b) for b in range(8)]
    seeks = []
    real = records.Batches.order
    monkeypatch.setattr(records.Batches, "order", lambda self, p: seeks.append(p) or real(self, p))
    deep = 10 ** 7   # thousands of passes in
    it = iter(records.Batches(files, 16, SEQ, PRED, seed=3, skip=deep))
    next(it)
    assert len(set(seeks)) <= 2   # the pass it lands in (and the next, where a batch spans two), none before
    again = iter(records.Batches(files, 16, SEQ, PRED, seed=3, skip=5))
    for b in range(5, 8):
        x, y, w = next(again)
        assert (x["input_ids"] == made[b][0]["input_ids"]).all() and (y["mlm"] == made[b][1]["mlm"]).all()


def _consume(reader, steps: int, ahead: int = 3) -> tuple[list[int | None], list[np.ndarray]]:
    """What train.py's Position callback sees: the reader's position after each of `steps` batches trained on, with
    the consumer `ahead` batches ahead of the step (Keras's iterator, beside the reader's own prefetch thread);
    and the input ids of each batch trained on."""
    it = iter(reader)
    pulled = [next(it) for _ in range(ahead)]
    positions, trained = [reader.position(0)], []
    for c in range(1, steps + 1):
        pulled.append(next(it))
        trained.append(pulled.pop(0)[0]["input_ids"])
        positions.append(reader.position(c))
    return positions, trained


def test_the_readers_position_is_its_own_and_a_resume_without_its_skip_reports_where_it_really_began(prepared):
    """records.Batches.position (the BERT job's data position for `tpuctl drill`, runtime.data_position): the
    record index after the batches trained on, counted from what the reader handed out, not from the step; a reader
    resumed at step 3 (skip=3) reports at each step what the uninterrupted one did, and the rows it hands out next
    are the rows at that position; one made without the skip (the bug) reports 0 where the other reports 12."""
    prep, _ = prepared
    records, files = _rows(prep)
    whole, trained = _consume(records.Batches(files, 4, SEQ, PRED, seed=3), 8)
    assert whole == [4 * c for c in range(9)]   # batch 4: the record after the c-th batch handed out
    resumed_reader = records.Batches(files, 4, SEQ, PRED, seed=3, skip=3)
    resumed, again = _consume(resumed_reader, 5)
    assert resumed == whole[3:]
    assert all((a == b).all() for a, b in zip(again, trained[3:]))   # the same rows, from those positions on
    forgot, _ = _consume(records.Batches(files, 4, SEQ, PRED, seed=3), 5)   # at step 3 with skip=0
    assert forgot[0] == 0 != whole[3] and forgot != whole[3:]
    # a position never handed out (or asked out of order, already dropped) is None: the callback then reports none
    assert resumed_reader.position(99) is None and resumed_reader.position(2) is None


def test_masks_change_between_reads_of_an_example_and_repeat_for_the_same_seed_and_step(prepared):
    prep, summary = prepared
    records, files = _rows(prep)
    vocab = prepare.read_vocab(f"{prep}/vocab.txt")
    masks = masking.Masks(masking.specials_of(vocab), 0.15, summary["vocab_size"])
    r = records.Batches(files, 16, SEQ, PRED, seed=3, masks=masks)
    per_pass = int(r.counts.sum())
    # the record at stream position k comes back at k + per_pass (next pass); find it there
    b = 2
    shard, row = r._records(b * 16, 16)
    x, y, w = r.make(b)
    nxt = r.order(1)
    at = np.nonzero((nxt[0] == shard[0]) & (nxt[1] == row[0]))[0][0] + per_pass
    bb, k = divmod(int(at), 16)
    x2, y2, w2 = r.make(bb)
    def unmasked(x, y, w, i):
        return _restore(x["input_ids"][i], x["masked_lm_positions"][i], y["mlm"][i], w["mlm"][i])
    assert (unmasked(x, y, w, 0) == unmasked(x2, y2, w2, k)).all()   # the same example ...
    assert not (x["masked_lm_positions"][0] == x2["masked_lm_positions"][k]).all()   # ... masked differently
    # the same seed and batch: the same masks, in a new reader and after a resume
    again = records.Batches(files, 16, SEQ, PRED, seed=3, masks=masks, skip=b)
    x3, y3, w3 = next(iter(again))
    for k_ in x:
        assert (x3[k_] == x[k_]).all()
    assert (y3["mlm"] == y["mlm"]).all() and (w3["mlm"] == w["mlm"]).all()
    # the masks keep BERT's shape: round(15%) of the real tokens, none of them [CLS] or [SEP], most [MASK]
    sp = masks.specials
    real = x["input_mask"].sum(1)
    n = w["mlm"].sum(1)
    assert (n == np.minimum(PRED, np.maximum(1, np.round(real * 0.15)))).all()
    orig = np.stack([unmasked(x, y, w, i) for i in range(16)])
    picked = np.take_along_axis(orig, x["masked_lm_positions"], 1)[w["mlm"] > 0]
    assert not np.isin(picked, [sp.cls, sp.sep]).any()
    assert (x["input_ids"] == sp.mask).sum() > 0.6 * n.sum()


def _restore(ids, pos, lm, w):
    ids = ids.copy()
    ids[pos[w > 0]] = lm[w > 0]
    return ids


def test_the_first_host_prepares_and_the_others_wait_for_its_marker(prepared, tmp_path, capsys):
    prep, summary = prepared
    text = prep.parent / "c.txt"
    args = ["--input", str(text), "--vocab-size", "3000", "--max-seq-length", str(SEQ), "--max-predictions-per-seq",
            str(PRED), "--seed", "7", "--chunk-mb", "0.25"]
    # the marker with these inputs' key: used, nothing prepared again
    assert prepare.main([*args, "--output", str(prep), "--wait", "5", "--poll", "0.05"])["key"] == summary["key"]
    # none (the first host still at work, or failed): an error past the wait, with nothing written
    empty = tmp_path / "empty"
    with pytest.raises(SystemExit, match="no prepared.json with these inputs' key"):
        prepare.main([*args, "--output", str(empty), "--wait", "0.3", "--poll", "0.05"])
    assert not list(empty.iterdir())
    # a marker of other inputs (an older corpus) is not this one's
    (empty / "prepared.json").write_text(json.dumps({**summary, "key": "other"}))
    with pytest.raises(SystemExit):
        prepare.main([*args, "--output", str(empty), "--wait", "0.2", "--poll", "0.05"])


def test_keras_floors_are_said_in_one_line_before_anything_runs():
    from tpuctl import runtime
    assert runtime.version_tuple("3.11.0") >= runtime.version_tuple("3.11") > runtime.version_tuple("3.8.1")
    assert runtime.version_tuple("3.12.0.dev2025") == (3, 12, 0)
    runtime.require_keras("3.7", "x", found="3.15.1")
    with pytest.raises(SystemExit) as e:
        runtime.require_keras("3.11", "a JAX run across hosts", found="3.8.0")
    assert str(e.value) == ("error: a JAX run across hosts needs keras>=3.11; this environment has keras 3.8.0\n"
                            "hint: pip install -U 'keras>=3.11' (or list it in the job's requirements.txt)")


def test_gpus_with_bfloat16_train_in_it_and_older_ones_in_float16():
    import keras
    from tpuctl import runtime
    try:
        assert runtime.mixed_precision("gpu", bfloat16_gpu=True) == "mixed_bfloat16"
        assert runtime.mixed_precision("gpu", bfloat16_gpu=False) == "mixed_float16"
        assert runtime.mixed_precision("tpu") == "mixed_bfloat16"
        assert runtime.mixed_precision("cpu") == "float32"
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_tfrecord_checksums_without_google_crc32c_are_the_same():
    import google_crc32c
    import tfrecord
    assert tfrecord.crc32c_python(b"123456789") == 0xE3069283   # CRC-32C's check value (RFC 3720 B.4)
    for data in (b"", b"\x00" * 37, os.urandom(3000)):
        assert tfrecord.crc32c_python(data) == google_crc32c.value(data)


def test_checkpoints_by_time_fall_on_log_lines():
    import callbacks

    class Log:
        def checkpointing(self):
            raise AssertionError
    saver = callbacks.Saver("unused", 0, 100, None, 10, Log(), {}, minutes=0.0)
    assert saver._due(20) and not saver._due(25)
    saver = callbacks.Saver("unused", 0, 100, None, 10, Log(), {}, minutes=10.0)
    assert not saver._due(20)   # ten minutes have not passed
    assert callbacks.Saver("unused", 0, 100, 7, 10, Log(), {})._due(14)   # --checkpoint-every: steps, not time
