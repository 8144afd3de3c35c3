"""jobs/bert_pretrain on the CPU: preparation parsed back with TensorFlow, Korean tokenization, training under
MirroredStrategy on two logical CPUs, kill-and-resume, and tpuctl.runtime."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

JOB = Path(__file__).parent.parent / "jobs" / "bert_pretrain"
sys.path.insert(0, str(JOB))

import corpus  # noqa: E402
import prepare  # noqa: E402

PREP_ARGS = ["--vocab-size", "3000", "--max-seq-length", "64", "--max-predictions-per-seq", "10",
             "--masked-lm-prob", "0.15", "--seed", "7", "--chunk-mb", "0.25"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    corpus.generate(str(path), 0.6, seed=1)
    return path


@pytest.fixture(scope="module")
def prepared(text, tmp_path_factory):
    out = tmp_path_factory.mktemp("prep")
    summary = prepare.main(["--input", str(text), "--output", str(out), "--workers", "2", *PREP_ARGS])
    return out, summary


def _parse(out, seq=64, pred=10):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    spec = {k: tf.io.FixedLenFeature([seq], tf.int64) for k in ("input_ids", "input_mask", "segment_ids")}
    spec.update({k: tf.io.FixedLenFeature([pred], tf.int64) for k in ("masked_lm_positions", "masked_lm_ids")})
    spec["masked_lm_weights"] = tf.io.FixedLenFeature([pred], tf.float32)
    spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
    files = sorted(str(p) for p in Path(out).glob("part-*.tfrecord"))
    rows = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(files)]
    return {k: np.stack([r[k].numpy() for r in rows]) for k in spec}


def test_prepared_examples_follow_the_bert_schema(prepared):
    out, summary = prepared
    ex = _parse(out)
    n = len(ex["input_ids"])
    assert n == summary["examples"] > 100
    vocab = prepare.read_vocab(str(out / "vocab.txt"))
    assert ex["input_ids"].max() < len(vocab) and ex["input_ids"].min() >= 0
    assert (ex["input_ids"][:, 0] == prepare.CLS).all()
    lengths = ex["input_mask"].sum(1)
    for i in range(n):
        L = lengths[i]
        assert (ex["input_mask"][i, :L] == 1).all() and (ex["input_mask"][i, L:] == 0).all()
        assert ex["input_ids"][i, L - 1] == prepare.SEP
        k = int(ex["masked_lm_weights"][i].sum())
        pos = ex["masked_lm_positions"][i, :k]
        assert k >= 1 and (pos > 0).all() and (pos < L - 1).all()        # inside the real tokens, never CLS
        assert not np.isin(ex["input_ids"][i, pos], [prepare.CLS, prepare.SEP, prepare.PAD]).any()
        assert (ex["masked_lm_ids"][i, :k] >= len(prepare.SPECIALS)).all()  # a real word was hidden
        segs = ex["segment_ids"][i, :L]
        assert segs[0] == 0 and segs[-1] == 1 and (np.diff(segs) >= 0).all()
    rate = ex["masked_lm_weights"].sum() / lengths.sum()
    assert 0.12 < rate < 0.17, rate
    masked = ex["input_ids"][np.arange(n)[:, None], ex["masked_lm_positions"]][ex["masked_lm_weights"] > 0]
    assert 0.7 < (masked == prepare.MASK).mean() < 0.9      # 80% [MASK], the rest kept or random
    assert 0.3 < ex["next_sentence_labels"].mean() < 0.7


def test_preparation_is_deterministic_and_independent_of_workers(text, prepared, tmp_path):
    out, _ = prepared
    again = tmp_path / "again"
    prepare.main(["--input", str(text), "--output", str(again), "--workers", "1", "--vocab",
                  str(out / "vocab.txt"), *PREP_ARGS])
    for shard in sorted(out.glob("part-*.tfrecord")):
        assert (again / shard.name).read_bytes() == shard.read_bytes()


def test_second_run_is_cached(text, prepared, capsys):
    out, summary = prepared
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = prepare.main(["--input", str(text), "--output", str(out), "--workers", "2", *PREP_ARGS])
    assert "cached" in capsys.readouterr().out
    assert again["key"] == summary["key"]
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def _hangul(w):
    return any(0xAC00 <= ord(c) <= 0xD7A3 for c in w)


def _jamo(w):
    return any(0x1100 <= ord(c) <= 0x11FF or 0x3130 <= ord(c) <= 0x318F for c in w)


def test_korean_round_trips_and_is_not_split_into_jamo(text, prepared):
    out, _ = prepared
    vocab = prepare.read_vocab(str(out / "vocab.txt"))
    assert not [w for w in vocab if _jamo(w)]
    assert sum(_hangul(w) for w in vocab) > 100
    tok = prepare.build_tokenizer(str(out / "vocab.txt"), lower_case=False)
    lines = [l for l in text.read_text(encoding="utf-8").splitlines() if l][:200]
    for line in lines:
        enc = tok.encode(line, add_special_tokens=False)
        assert "[UNK]" not in enc.tokens
        assert "".join(tok.decode(enc.ids).split()) == "".join(line.split())
    # Why lower-casing is off by default: its NFD accent stripping turns syllables into jamo.
    cased = prepare.build_tokenizer(str(out / "vocab.txt"), lower_case=True)
    assert _jamo(cased.normalizer.normalize_str("한국어"))


TWO_CPUS = """
import os, sys, json
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
sys.path.insert(0, sys.argv[1])
import train
from tpuctl import runtime
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
assert runtime.global_batch(8, strategy) == 16
result = train.main(sys.argv[2:], strategy=strategy)
print("RESULT", json.dumps(result))
"""


def _train_env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")


def test_tiny_model_learns_under_mirrored_strategy_on_two_cpus(prepared, tmp_path):
    out, summary = prepared
    args = ["--data", f"{out}/part-*.tfrecord", "--vocab-size", str(summary["vocab_size"]), "--preset", "tiny",
            "--seq-length", "64", "--max-predictions-per-seq", "10", "--batch-size", "8", "--steps", "60",
            "--log-every", "10", "--checkpoint-every", "1000", "--learning-rate", "1e-2", "--output",
            str(tmp_path / "out")]
    r = subprocess.run([sys.executable, "-c", TWO_CPUS, str(JOB), *args], capture_output=True, text=True,
                       env=_train_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "x2 replicas, global batch 16" in r.stdout
    result = json.loads(r.stdout.split("RESULT ", 1)[1])
    assert result["step"] == 60
    losses = result["loss"]
    assert len(losses) == 6
    assert np.mean(losses[-2:]) < losses[0] - 0.5, losses
    assert list((tmp_path / "out" / "tensorboard").rglob("*tfevents*"))


def test_kill_and_resume_continues_from_the_saved_step(prepared, tmp_path):
    out, summary = prepared
    args = [sys.executable, str(JOB / "train.py"), "--data", f"{out}/part-*.tfrecord", "--vocab-size",
            str(summary["vocab_size"]), "--seq-length", "64", "--max-predictions-per-seq", "10", "--batch-size", "4",
            "--log-every", "5", "--checkpoint-every", "5", "--output", str(tmp_path / "out")]
    p = subprocess.Popen(args + ["--steps", "100000"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         env=_train_env(), text=True)
    saved = tmp_path / "out" / "checkpoints" / "checkpoint"
    deadline = time.time() + 300
    while time.time() < deadline and not (saved.exists() and "ckpt-10" in saved.read_text()):
        time.sleep(0.2)
    p.send_signal(signal.SIGKILL)   # as a preemption would
    p.wait()
    assert saved.exists(), "no checkpoint within 5 minutes"
    step = int(saved.read_text().split('"')[1].rsplit("-", 1)[1])
    r = subprocess.run(args + ["--steps", str(step + 5)], capture_output=True, text=True, env=_train_env(),
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from step {step}" in r.stdout
    assert f"step {step + 5:6d}" in r.stdout
    assert f"step {5:6d} " not in r.stdout  # did not start over


def test_runtime_helpers(monkeypatch):
    from tpuctl import runtime
    assert runtime.scaled_lr(1e-4, 1024, 256) == pytest.approx(4e-4)
    sched = runtime.schedule(1e-4, 512, 256, warmup_steps=10, total_steps=110)
    assert float(sched(0)) == 0.0
    assert float(sched(5)) == pytest.approx(1e-4)
    assert float(sched(10)) == pytest.approx(2e-4)
    assert float(sched(60)) == pytest.approx(1e-4)
    assert float(sched(110)) == pytest.approx(0.0, abs=1e-9)
    monkeypatch.setenv("TPUCTL_OUTPUT_DIR", "gs://b/runs/1/output")
    assert runtime.output_dir() == "gs://b/runs/1/output"
    import tensorflow as tf
    assert runtime.kind(tf.distribute.get_strategy()) == "cpu"


def test_cached_tokenization_gives_hf_ids_exactly(prepared, text):
    out, _ = prepared
    tok = prepare.build_tokenizer(str(out / "vocab.txt"), lower_case=False)
    lines = [l for l in text.read_text(encoding="utf-8").splitlines() if l][:3000]
    odd = ["abc\x0bdef 한국", "x\x85y", "(괄호) 안녕!!", "naïve café", "tab\there", "\u3000wide space", "a\x00b"]
    for batch in (lines, lines[:50] + odd):
        assert prepare.tokenize(tok, batch) == [e.ids for e in tok.encode_batch(batch, add_special_tokens=False)]


def test_prepare_writes_to_gcs_and_caches_there(cloud, text, capsys):
    from google.cloud import storage
    client = storage.Client(project="test-proj")
    client.create_bucket("prep-bucket")
    args = ["--input", str(text), "--output", "gs://prep-bucket/prepared/x", "--workers", "2", *PREP_ARGS]
    summary = prepare.main(args)
    names = {b.name for b in client.list_blobs("prep-bucket")}
    assert {"prepared/x/prepared.json", "prepared/x/vocab.txt"} <= names
    assert {f"prepared/x/{s}" for s in summary["shards"]} <= names
    capsys.readouterr()
    assert prepare.main(args)["key"] == summary["key"]
    assert "cached" in capsys.readouterr().out
