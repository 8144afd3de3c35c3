"""The job's entry point (tpuctl.toml runs it): prepare the data (skipped when cached), then train.

    python run.py [--corpus FILE_OR_GLOB] [--vocab-size N] [train.py flags, e.g. --preset tiny --steps 30]

With --init-from-run RUN (a second phase), the data is prepared with that run's vocabulary.

The corpus is --corpus, else the *.txt files synced to $TPUCTL_DATA_DIR (tpuctl submit --data my_corpus.txt),
else a small generated Hangul/Latin sample, so the job runs offline. Prepared shards live in
$TPUCTL_STORE/prepared/bert_pretrain-SEQ/ (the cluster's bucket on a TPU), shared by later runs. Across hosts
(TPUCTL_NUM_WORKERS > 1) the first host prepares; the others wait (up to TPUCTL_PREPARE_WAIT_SECONDS, 7200) for its
prepared.json.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def earlier_vocab(run_id: str) -> str:
    """The vocabulary an earlier run trained with (train.py copies it into its outputs), as a local file: a phase 2
    must tokenize with phase 1's vocabulary, not train a new one."""
    import fileio
    from tpuctl import runtime
    src = f"{runtime.output_of(run_id)}/vocab.txt"
    if not fileio.exists(src):
        raise SystemExit(f"run.py: {src} does not exist: is {run_id} a bert_pretrain run on this cluster?")
    local = os.path.join(tempfile.mkdtemp(prefix="vocab-"), "vocab.txt")
    fileio.copy(src, local)
    return local


def main(argv=None):
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--corpus", default=None)
    ap.add_argument("--vocab-size", type=int, default=None)
    ap.add_argument("--sample-mb", type=float, default=2.0)
    ap.add_argument("--seq-length", type=int, default=128)
    ap.add_argument("--max-predictions-per-seq", type=int, default=20)
    ap.add_argument("--init-from-run", default=None)
    a, train_args = ap.parse_known_args(argv)
    if a.init_from_run:
        train_args += ["--init-from-run", a.init_from_run]
    data_dir = os.environ.get("TPUCTL_DATA_DIR", "")
    if a.corpus:
        corpus = [a.corpus]
    elif data_dir and not data_dir.startswith("gs://") and glob.glob(os.path.join(data_dir, "*.txt")):
        corpus = [os.path.join(data_dir, "*.txt")]
    elif data_dir.startswith("gs://"):
        import fileio  # the cloud path: the store's client (or TensorFlow's gfile) reads gs://
        remote = fileio.glob(f"{data_dir}/*.txt")
        local = tempfile.mkdtemp(prefix="corpus-")
        for r in remote:
            fileio.copy(r, os.path.join(local, os.path.basename(r)))
        corpus = [os.path.join(local, "*.txt")] if remote else []
    else:
        corpus = []
    if not corpus:
        import corpus as generator
        # named by the generator's own source: a sample left by an older generator is never reused
        with open(generator.__file__, "rb") as f:
            version = hashlib.sha256(f.read()).hexdigest()[:12]
        path = os.path.join(tempfile.gettempdir(), f"bert-sample-{a.sample_mb}mb-{version}.txt")
        if not os.path.exists(path):
            partial = f"{path}.{os.getpid()}.partial"   # two runs at once never read a half-written sample
            generator.generate(partial, a.sample_mb, seed=0)
            os.replace(partial, path)
        print(f"run: no corpus given; using a generated {a.sample_mb} MB Hangul/Latin sample", flush=True)
        corpus = [path]
        vocab_size = a.vocab_size or 8000
    else:
        vocab_size = a.vocab_size or 30000
    store = os.environ.get("TPUCTL_STORE") or os.path.join(HERE, ".tpuctl-cache")
    prepared = f"{store.rstrip('/')}/prepared/bert_pretrain-{a.seq_length}"
    vocab = ["--vocab-size", str(vocab_size)]
    if a.init_from_run:
        vocab = ["--vocab", earlier_vocab(a.init_from_run)]
        prepared += f"-{a.init_from_run}"   # data in that run's vocabulary, beside the others
    # Across hosts the first prepares and the others wait for its marker in the store (as tpuctl's rounds wait)
    wait = []
    if int(os.environ.get("TPUCTL_NUM_WORKERS") or 1) > 1 and os.environ.get("TPUCTL_WORKER", "0") not in ("", "0"):
        wait = ["--wait", os.environ.get("TPUCTL_PREPARE_WAIT_SECONDS", "7200"),
                "--poll", os.environ.get("TPUCTL_PREPARE_POLL_SECONDS", "5")]
    import prepare
    summary = prepare.main(["--input", *corpus, "--output", prepared, *vocab,
                            "--max-seq-length", str(a.seq_length),
                            "--max-predictions-per-seq", str(a.max_predictions_per_seq), *wait])
    import train
    train.main(["--data", f"{prepared}/part-*.tfrecord", "--vocab-size", str(summary["vocab_size"]),
                "--seq-length", str(a.seq_length), "--max-predictions-per-seq", str(a.max_predictions_per_seq),
                *train_args])


if __name__ == "__main__":
    main()
