"""A generated sample corpus (no copied text): Hangul and Latin words drawn from a made-up lexicon with a Zipf
distribution, one sentence per line, a blank line between documents (the BERT convention).

Each document has one of 16 topics, and four words in five come from that topic's own 60 words: sentences of one
document belong together, so next-sentence prediction has something to learn (a random "next" sentence comes
from another document, usually of another topic). Drawn independently, every pair would look alike. With 64
topics the words were spread so evenly that the quick start's 30 steps lowered the loss by only 0.9 nats; 16 give
1.7.

    python corpus.py OUT.txt --mb 2 --seed 0
"""
from __future__ import annotations

import argparse

import numpy as np

_LATIN = "abcdefghijklmnopqrstuvwxyz"
_PUNCT = [".", ".", ".", "?", "!"]


def _lexicon(rng, n: int) -> list[str]:
    words = []
    for i in range(n):
        length = int(rng.integers(1, 5))
        if i % 4 == 0:   # a quarter Latin words, the rest Hangul (syllables U+AC00..U+D7A3)
            words.append("".join(_LATIN[c] for c in rng.integers(0, 26, size=length + 2)))
        else:
            words.append("".join(chr(0xAC00 + int(c)) for c in rng.integers(0, 11172 // 8, size=length) * 8))
    return words


def _zipf(n: int) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** 1.07
    return p / p.sum()


class Language:
    """A made-up language: a Zipf lexicon of Hangul and Latin words, and `topics` topics of `topic_words` each."""

    def __init__(self, seed: int = 0, lexicon: int = 30000, topics: int = 16, topic_words: int = 60):
        rng = np.random.default_rng(seed)
        self.words = np.array(_lexicon(rng, lexicon), dtype=object)
        self.p = _zipf(lexicon)
        self.table = rng.integers(0, lexicon, size=(topics, topic_words))   # each topic's own words
        self.p_topic = _zipf(topic_words)

    def sentences(self, rng, topic_of_sentence: np.ndarray, topical: float) -> list[str]:
        """One sentence (5-24 words, then punctuation) per entry of `topic_of_sentence`; each word is drawn from
        that topic's words with probability `topical`, else from the whole lexicon."""
        lengths = rng.integers(5, 25, size=len(topic_of_sentence))
        total = int(lengths.sum())
        ids = rng.choice(len(self.words), size=total, p=self.p)
        own = self.table[np.repeat(topic_of_sentence, lengths),
                         rng.choice(self.table.shape[1], size=total, p=self.p_topic)]
        flat = self.words[np.where(rng.random(total) < topical, own, ids)].tolist()
        ends = rng.integers(0, 5, size=len(lengths))
        out, pos = [], 0
        for n, e in zip(lengths.tolist(), ends.tolist()):
            out.append(" ".join(flat[pos:pos + n]) + _PUNCT[e])
            pos += n
        return out


def generate(path: str, megabytes: float, seed: int = 0, lexicon: int = 30000, topics: int = 16,
             topic_words: int = 60, topical: float = 0.8, draw: int = 0) -> int:
    """`seed` makes the language (lexicon and topics), `draw` the documents: held-out text of the same language
    is `draw=1`."""
    lang = Language(seed, lexicon, topics, topic_words)
    rng = np.random.default_rng([seed, draw])
    target = int(megabytes * 1024 * 1024)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            # Draw a block of documents at once (4-23 sentences each, one topic each): per-sentence sampling is
            # 10x slower.
            sizes = rng.integers(4, 24, size=1000)
            doc_of = np.repeat(np.arange(len(sizes)), sizes)
            lines = lang.sentences(rng, rng.integers(0, topics, size=len(sizes))[doc_of], topical)
            last = np.r_[doc_of[1:] != doc_of[:-1], True]   # a document ends after this sentence
            block = "".join(line + ("\n\n" if end else "\n") for line, end in zip(lines, last.tolist()))
            data = block.encode("utf-8")
            if written + len(data) > target:  # stop at a document boundary past the target
                cut = data.find(b"\n\n", target - written)
                data = data[:cut + 2] if cut >= 0 else data
            f.write(data.decode("utf-8"))
            written += len(data)
    return written


def labelled(n: int, classes: int = 16, seed: int = 0, draw: int = 2, topical: float = 0.3) -> tuple[list[str], list[int]]:
    """`n` sentences of the language `seed` makes, each from one of its first `classes` topics, with that topic as
    the label: a sentence classification task for finetune.py, with fewer topic words than the corpus has (a
    model must know which words go together, which pretraining teaches)."""
    lang = Language(seed)
    rng = np.random.default_rng([seed, draw])
    labels = rng.integers(0, classes, size=n)
    return lang.sentences(rng, labels, topical), labels.tolist()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--mb", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    generate(a.out, a.mb, a.seed)
