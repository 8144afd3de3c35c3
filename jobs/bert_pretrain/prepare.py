"""BERT pretraining data: text -> TFRecord shards with the google-research/bert feature schema.

    python prepare.py --input FILE_OR_GLOB --output DIR [--vocab FILE | --vocab-size N] --max-seq-length 128
        --max-predictions-per-seq 20 --masked-lm-prob 0.15 --dupe-factor 1 --seed S [--workers N]

Input: UTF-8, one sentence per line, a blank line between documents. Without --vocab a WordPiece vocabulary is
trained with HF tokenizers and written to DIR/vocab.txt. By default text is neither lower-cased nor accent-
stripped: NFD accent stripping would split Hangul syllables into jamo. The input is cut into document-aligned
pieces of --chunk-mb, each tokenized, paired (next-sentence), masked and written as one shard by a worker
process, with a random stream seeded by (seed, piece): the output depends on the seed, not on --workers, and
memory is bounded by the piece size. Beside each shard, part-N.rows.npy holds the same examples as fixed-width rows
(fixedrows.py: what the JAX backend's reader maps). DIR may be gs://. A second run with the same inputs, vocabulary and
options finds DIR/prepared.json and does nothing.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from itertools import chain
from multiprocessing import get_context

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixedrows  # noqa: E402
from masking import choose  # noqa: E402
from tfrecord import serialize_batch, write_records  # noqa: E402

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(5)


# -- tokenizer ---------------------------------------------------------------------------------------------------
def build_tokenizer(vocab_path: str, lower_case: bool):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    tok = Tokenizer(models.WordPiece.from_file(vocab_path, unk_token="[UNK]"))
    tok.decoder = decoders.WordPiece()
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=lower_case, lowercase=lower_case)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


# Characters Python's str.split() treats as whitespace but BertNormalizer deletes as control characters: a line
# holding one is tokenized by HF directly, so the word cache below never changes a single id.
_ODD_SPACE = re.compile("[\x0b\x0c\x1c-\x1f\x85]")


def tokenize(tok, lines: list[str]) -> list[list[int]]:
    """Token ids per line, identical to tok.encode_batch(lines): BERT's normalizer and pre-tokenizer act within
    whitespace-separated chunks, so each distinct chunk is tokenized once (a corpus repeats its words ~10x+) and
    lines are assembled from the cache. 1.8x faster than encoding every line."""
    if _ODD_SPACE.search("".join(lines)):
        return [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]
    split = [line.split() for line in lines]
    unique = set()
    for words in split:
        unique.update(words)
    unique = list(unique)
    cache = dict(zip(unique, _encode_words(tok, unique)))
    get = cache.__getitem__
    return [list(chain.from_iterable(map(get, words))) for words in split]


def _encode_words(tok, words: list[str], per_sequence: int = 512) -> list[list[int]]:
    """Ids of each word, encoding many words per sequence (HF's per-sequence cost dominates for single words) and
    assigning tokens back to words by their character offsets."""
    out = []
    batches = [words[i:i + per_sequence] for i in range(0, len(words), per_sequence)]
    for group, enc in zip(batches, tok.encode_batch([" ".join(b) for b in batches], add_special_tokens=False)):
        lengths = np.fromiter((len(w) + 1 for w in group), np.int64, len(group))
        word_starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        token_starts = np.fromiter((o[0] for o in enc.offsets), np.int64, len(enc.offsets))
        owner = np.searchsorted(word_starts, token_starts, side="right") - 1
        ids = enc.ids
        bounds = np.searchsorted(owner, np.arange(len(group) + 1))
        out.extend(ids[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()))
    return out


def train_vocab(files: list[str], size: int, lower_case: bool, out_path: str) -> None:
    """Not reproducible from run to run: HF's trainer breaks count ties in hash-map order, so the same corpus can
    give a slightly different vocabulary each time (huggingface/tokenizers#1794; fix proposed in #2066). What is
    made from it is kept with it (DIR/vocab.txt, and each run's outputs), and a second phase reuses the first's."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=lower_case, lowercase=lower_case)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train(files, trainers.WordPieceTrainer(vocab_size=size, special_tokens=SPECIALS, show_progress=False))
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("\n".join(w for w, _ in vocab) + "\n")


def read_vocab(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        words = [line.rstrip("\n") for line in f if line.rstrip("\n")]
    missing = [s for s in SPECIALS if s not in words]
    if missing:
        raise SystemExit(f"prepare.py: vocabulary {path} lacks {missing}")
    return words


# -- pieces of the input -----------------------------------------------------------------------------------------
def pieces(files: list[str], chunk_bytes: int) -> list[tuple[str, int, int]]:
    """(file, start, end) byte ranges that begin and end on document boundaries (a blank line)."""
    out = []
    for path in files:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            start = 0
            while start < size:
                end = min(size, start + chunk_bytes)
                if end < size:
                    f.seek(end)
                    tail = b""
                    while b"\n\n" not in tail:
                        more = f.read(1 << 16)
                        if not more:
                            break
                        tail += more
                    cut = tail.find(b"\n\n")
                    end = end + cut + 2 if cut >= 0 else size
                out.append((path, start, end))
                start = end
    return out


# -- instances (the google-research/bert create_pretraining_data algorithm) ------------------------------------
def _truncate(a: list, b: list, max_tokens: int, rng: random.Random) -> None:
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def instances(docs: list[list[list[int]]], max_seq: int, short_seq_prob: float, rng: random.Random):
    """Yield (tokens_a, tokens_b, is_random_next) pairs from documents of sentences of token ids."""
    max_tokens = max_seq - 3
    for d, document in enumerate(docs):
        target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
        chunk, length, i = [], 0, 0
        while i < len(document):
            chunk.append(document[i])
            length += len(document[i])
            if i == len(document) - 1 or length >= target:
                if chunk:
                    a_end = 1 if len(chunk) < 2 else rng.randint(1, len(chunk) - 1)
                    a = [t for s in chunk[:a_end] for t in s]
                    b = []
                    random_next = len(chunk) == 1 or rng.random() < 0.5
                    if random_next and len(docs) > 1:
                        for _ in range(10):
                            r = rng.randint(0, len(docs) - 1)
                            if r != d:
                                break
                        other = docs[r]
                        for j in range(rng.randint(0, len(other) - 1), len(other)):
                            b.extend(other[j])
                            if len(b) >= target - len(a):
                                break
                        i -= len(chunk) - a_end   # the unused sentences start the next chunk
                    else:
                        random_next = False
                        b = [t for s in chunk[a_end:] for t in s]
                    _truncate(a, b, max_tokens, rng)
                    if a and b:
                        yield a, b, random_next
                chunk, length = [], 0
            i += 1


def encode(pairs, max_seq: int, max_pred: int, mlm_prob: float, vocab_size: int, rng: random.Random) -> dict:
    """The google-research/bert masking (masking.choose), for a whole batch at once: numpy does in one pass what a
    Python loop did instance by instance (a third of the CPU time)."""
    n = len(pairs)
    gen = np.random.default_rng(rng.getrandbits(64))   # drawn from the piece's stream: still one seed per piece
    flat: list[int] = []
    la = np.empty(n, np.int64)
    for k, (a, b, _) in enumerate(pairs):
        flat.append(CLS)
        flat.extend(a)
        flat.append(SEP)
        flat.extend(b)
        flat.append(SEP)
        la[k] = len(a) + 2
    lengths = np.fromiter((len(a) + len(b) + 3 for a, b, _ in pairs), np.int64, n)
    col = np.arange(max_seq)[np.newaxis, :]
    real = col < lengths[:, np.newaxis]
    ids = np.zeros((n, max_seq), np.int64)
    ids[real] = np.asarray(flat, np.int64)   # row-major: each row gets its own tokens, in order
    seg = (real & (col >= la[:, np.newaxis])).astype(np.int64)
    cand = (col >= 1) & (col < lengths[:, np.newaxis] - 1) & (col != la[:, np.newaxis] - 1)
    pos, lm_ids, valid = choose(ids, lengths, cand, max_pred, mlm_prob, vocab_size, MASK, len(SPECIALS), gen)
    nsp = np.fromiter((int(random_next) for _, _, random_next in pairs), np.int64, n)[:, np.newaxis]
    return {"input_ids": ids, "input_mask": real.astype(np.int64), "segment_ids": seg, "masked_lm_positions": pos,
            "masked_lm_ids": lm_ids, "next_sentence_labels": nsp}, {"masked_lm_weights": valid.astype(np.float32)}


# -- one piece, in a worker process ------------------------------------------------------------------------------
_TOK = {}


def _work(task):
    index, (path, start, end), opts, out_dir = task
    key = (opts["vocab"], opts["lower_case"])
    if key not in _TOK:
        _TOK[key] = build_tokenizer(opts["vocab"], opts["lower_case"])
    tok = _TOK[key]
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read(end - start).decode("utf-8", errors="replace")
    docs_text = [[s for s in d.split("\n") if s.strip()] for d in text.split("\n\n")]
    docs_text = [d for d in docs_text if d]
    it = iter(tokenize(tok, [s for d in docs_text for s in d]))
    docs = [[next(it) for _ in d] for d in docs_text]
    del text
    rng = random.Random(opts["seed"] * 1_000_003 + index)
    out = os.path.join(out_dir, f"part-{index:05d}.tfrecord")
    count = masked = real = 0
    rows = []
    with open(out, "wb") as f:
        for dupe in range(opts["dupe_factor"]):
            if dupe:
                rng.shuffle(docs)   # each duplicate pairs and masks the same text differently
            pairs = list(instances(docs, opts["max_seq"], opts["short_seq_prob"], rng))
            for b in range(0, len(pairs), 2048):
                ints, floats = encode(pairs[b:b + 2048], opts["max_seq"], opts["max_pred"], opts["mlm_prob"],
                                      opts["vocab_size"], rng)
                write_records(f, serialize_batch(ints, floats))
                rows.append(fixedrows.to_rows(ints, floats, opts["max_seq"], opts["max_pred"]))
                count += len(ints["input_ids"])
                masked += int(floats["masked_lm_weights"].sum())
                real += int(ints["input_mask"].sum())
    fixedrows.save(fixedrows.path_of(out), np.concatenate(rows) if rows else
                   np.zeros(0, fixedrows.dtype(opts["max_seq"], opts["max_pred"])))
    return os.path.basename(out), count, masked, real


def _init_worker():
    os.environ["RAYON_NUM_THREADS"] = "1"   # one process per core; no thread oversubscription


# -- the whole job -----------------------------------------------------------------------------------------------
def _md5(path: str) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def _expand(patterns: list[str]) -> list[str]:
    files = []
    for p in patterns:
        hits = sorted(glob.glob(p)) if any(c in p for c in "*?[") else [p]
        for h in hits:
            if not os.path.isfile(h):
                raise SystemExit(f"prepare.py: input {h} does not exist")
            files.append(h)
    if not files:
        raise SystemExit(f"prepare.py: no input matches {patterns}")
    return files


class _Out:
    """The output directory, local or gs:// (staged locally, uploaded at the end)."""

    def __init__(self, uri: str):
        self.uri = uri.rstrip("/")
        self.remote = uri.startswith("gs://")
        self.local = tempfile.mkdtemp(prefix="prepare-") if self.remote else self.uri
        os.makedirs(self.local, exist_ok=True)

    def _blob(self, name):
        from google.cloud import storage
        bucket, _, prefix = self.uri[5:].partition("/")
        return storage.Client().bucket(bucket).blob(f"{prefix}/{name}" if prefix else name)

    def read(self, name: str) -> str | None:
        if not self.remote:
            p = os.path.join(self.local, name)
            return open(p, encoding="utf-8").read() if os.path.exists(p) else None
        b = self._blob(name)
        return b.download_as_text() if b.exists() else None

    def publish(self, names: list[str]) -> None:
        if self.remote:
            for n in names:
                self._blob(n).upload_from_filename(os.path.join(self.local, n))
            shutil.rmtree(self.local, ignore_errors=True)


def _wait(out: _Out, key: str, seconds: float, poll: float) -> dict:
    """The summary another process publishes last (prepared.json, after every shard: its presence is the marker),
    once it carries `key`; a line every minute while waiting, and an error past `seconds`."""
    t0 = said = time.monotonic()
    print(f"prepare: waiting for the first host to prepare {out.uri}", flush=True)
    while True:
        done = out.read("prepared.json")
        if done and json.loads(done).get("key") == key:
            print(f"prepare: the first host prepared {out.uri} ({time.monotonic() - t0:.0f}s)", flush=True)
            return json.loads(done)
        if time.monotonic() - t0 >= seconds:
            raise SystemExit(f"prepare.py: no prepared.json with these inputs' key in {out.uri} after {seconds:.0f}s "
                             "(did the first host fail? its log says)")
        if time.monotonic() - said >= 60:
            print(f"prepare: still waiting for the first host ({time.monotonic() - t0:.0f}s)", flush=True)
            said = time.monotonic()
        time.sleep(poll)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", required=True, nargs="+", help="file(s) or glob(s)")
    ap.add_argument("--output", required=True, help="directory or gs://bucket/path")
    ap.add_argument("--vocab", help="an existing vocab.txt (else one is trained)")
    ap.add_argument("--vocab-size", type=int, default=30000)
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--max-predictions-per-seq", type=int, default=20)
    ap.add_argument("--masked-lm-prob", type=float, default=0.15)
    ap.add_argument("--short-seq-prob", type=float, default=0.1)
    ap.add_argument("--dupe-factor", type=int, default=1)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--chunk-mb", type=float, default=2.0, help="input per shard; bounds memory per worker")
    ap.add_argument("--lower-case", action="store_true", help="lower-case and strip accents (not for Korean)")
    ap.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                    help="another process prepares (the first host of a run across hosts): wait up to SECONDS for "
                         "its DIR/prepared.json with these inputs' key, then use it")
    ap.add_argument("--poll", type=float, default=5.0, help="with --wait: seconds between looks")
    a = ap.parse_args(argv)
    t0 = time.time()
    files = _expand(a.input)
    out = _Out(a.output)
    opts = {"max_seq": a.max_seq_length, "max_pred": a.max_predictions_per_seq, "mlm_prob": a.masked_lm_prob,
            "short_seq_prob": a.short_seq_prob, "dupe_factor": a.dupe_factor, "seed": a.seed,
            "lower_case": a.lower_case, "chunk_mb": a.chunk_mb,
            "rows": 1}   # each shard has its fixedrows copy (an older cache without them is prepared again)
    vocab_src = a.vocab
    h = hashlib.sha256(json.dumps(opts, sort_keys=True).encode())
    for f in files:
        h.update(f"{os.path.basename(f)}:{os.path.getsize(f)}:{_md5(f)}".encode())
    h.update(open(vocab_src, "rb").read() if vocab_src else f"train:{a.vocab_size}".encode())
    key = h.hexdigest()
    done = out.read("prepared.json")
    if done and json.loads(done).get("key") == key:
        print(f"prepare: cached in {a.output} (same inputs, vocabulary and options)", flush=True)
        return json.loads(done)
    if a.wait is not None:
        return _wait(out, key, a.wait, a.poll)
    vocab_path = os.path.join(out.local, "vocab.txt")
    if vocab_src:
        if os.path.abspath(vocab_src) != os.path.abspath(vocab_path):
            shutil.copyfile(vocab_src, vocab_path)
    else:
        train_vocab(files, a.vocab_size, a.lower_case, vocab_path)
        print(f"prepare: trained a {a.vocab_size}-word WordPiece vocabulary in {time.time() - t0:.1f}s", flush=True)
    opts.update(vocab=vocab_path, vocab_size=len(read_vocab(vocab_path)))
    tasks = [(i, p, opts, out.local) for i, p in enumerate(pieces(files, int(a.chunk_mb * 1024 * 1024)))]
    results = []
    if a.workers <= 1 or len(tasks) == 1:
        results = [_work(t) for t in tasks]
    else:
        # fork where there is one: workers start without re-importing numpy and tokenizers
        ctx = get_context("fork" if sys.platform == "linux" else "spawn")
        with ctx.Pool(min(a.workers, len(tasks)), initializer=_init_worker) as pool:
            results = pool.map(_work, tasks, chunksize=1)
    shards = [r[0] for r in results]
    summary = {"key": key, "shards": shards, "examples": sum(r[1] for r in results),
               "masked_rate": sum(r[2] for r in results) / max(1, sum(r[3] for r in results)),
               "vocab_size": opts["vocab_size"], "max_seq_length": a.max_seq_length,
               "max_predictions_per_seq": a.max_predictions_per_seq, "seconds": round(time.time() - t0, 2)}
    with open(os.path.join(out.local, "prepared.json"), "w") as f:
        json.dump(summary, f, indent=2)
    out.publish(shards + [os.path.basename(fixedrows.path_of(s)) for s in shards] + ["vocab.txt", "prepared.json"])
    mb = sum(os.path.getsize(f) for f in files) / 1e6
    print(f"prepare: {summary['examples']} examples in {len(shards)} shards from {mb:.1f} MB in "
          f"{summary['seconds']}s ({mb / max(1e-9, summary['seconds']):.2f} MB/s)", flush=True)
    return summary


if __name__ == "__main__":
    main()
