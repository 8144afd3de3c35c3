"""A generated sample corpus (no copied text): Hangul and Latin words drawn from a made-up lexicon with a Zipf
distribution, one sentence per line, a blank line between documents (the BERT convention).

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


def generate(path: str, megabytes: float, seed: int = 0, lexicon: int = 30000) -> int:
    rng = np.random.default_rng(seed)
    words = np.array(_lexicon(rng, lexicon), dtype=object)
    ranks = np.arange(1, lexicon + 1, dtype=np.float64)
    p = 1.0 / ranks ** 1.07
    p /= p.sum()
    target = int(megabytes * 1024 * 1024)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            # Draw a batch of sentences at once: per-sentence sampling is 10x slower.
            lengths = rng.integers(5, 25, size=20000)
            flat = words[rng.choice(lexicon, size=int(lengths.sum()), p=p)].tolist()
            ends = rng.integers(0, 5, size=len(lengths))
            doc_left = int(rng.integers(4, 24))
            out, pos = [], 0
            for n, e in zip(lengths.tolist(), ends.tolist()):
                out.append(" ".join(flat[pos:pos + n]) + _PUNCT[e] + "\n")
                pos += n
                doc_left -= 1
                if doc_left == 0:
                    out.append("\n")
                    doc_left = int(rng.integers(4, 24))
            block = "".join(out)
            data = block.encode("utf-8")
            if written + len(data) > target:  # stop at a document boundary past the target
                cut = data.find(b"\n\n", target - written)
                data = data[:cut + 2] if cut >= 0 else data
            f.write(data.decode("utf-8"))
            written += len(data)
    return written


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--mb", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    generate(a.out, a.mb, a.seed)
