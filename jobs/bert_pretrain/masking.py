"""BERT's masked-LM choice (google-research/bert create_pretraining_data.py create_masked_lm_predictions), for a
whole batch at once in numpy: prepare.py's static masks and the reader's dynamic ones (records.py) are the same
function. Per sequence, round(masked_lm_prob x its real tokens) (at least 1, at most max_pred) positions chosen
uniformly among the real tokens but [CLS] and [SEP], listed in order; 80% of them become [MASK], 10% a random word,
10% stay. Masking at read time (RoBERTa; KerasHub's MaskedLMMaskGenerator) gives each pass over the data new masks.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Specials(NamedTuple):
    """The ids masking needs: [CLS], [SEP], [MASK], and the first id a random replacement may take."""
    cls: int
    sep: int
    mask: int
    low: int


class Masks(NamedTuple):
    """Dynamic masking's settings: the ids it needs, the masked fraction and the vocabulary size."""
    specials: Specials
    mlm_prob: float
    vocab_size: int


def specials_of(vocab: list[str]) -> Specials | None:
    """From a vocab.txt's words; None when it lacks [CLS], [SEP] or [MASK]. Random words are drawn past the
    specials when they lead the vocabulary (prepare.py's), else from the whole of it (google-research/bert)."""
    try:
        cls, sep, mask = (vocab.index(w) for w in ("[CLS]", "[SEP]", "[MASK]"))
    except ValueError:
        return None
    lead = 0
    while lead < len(vocab) and vocab[lead].startswith("[") and vocab[lead].endswith("]"):
        lead += 1
    return Specials(cls, sep, mask, lead)


def choose(ids: np.ndarray, lengths: np.ndarray, cand: np.ndarray, max_pred: int, mlm_prob: float,
           vocab_size: int, mask_id: int, low: int, gen: np.random.Generator):
    """Masks `ids` (N x seq, changed in place) at positions drawn among `cand` (N x seq bool); `lengths` are the
    real tokens per row, [CLS] and [SEP]s included (the reference's count). Returns (positions, original ids,
    valid), each N x max_pred, unused slots 0. Random keys sorted per row pick the uniform subset."""
    n, max_seq = ids.shape
    num = np.minimum(np.minimum(max_pred, cand.sum(1)), np.maximum(1, np.round(lengths * mlm_prob).astype(np.int64)))
    keys = np.where(cand, gen.random((n, max_seq)), 2.0)
    valid = np.arange(max_pred)[np.newaxis, :] < num[:, np.newaxis]
    pos = np.sort(np.where(valid, np.argsort(keys, axis=1, kind="stable")[:, :max_pred], max_seq), axis=1)
    pos[~valid] = 0
    rows = np.broadcast_to(np.arange(n)[:, np.newaxis], pos.shape)
    lm_ids = np.where(valid, ids[rows, pos], 0)
    r = gen.random((n, max_pred))
    new = np.where(r < 0.8, mask_id, np.where(r >= 0.9, gen.integers(low, vocab_size, (n, max_pred)), lm_ids))
    ids[rows[valid], pos[valid]] = new[valid]
    return pos, lm_ids, valid


def remask(ex: dict, sp: Specials, max_pred: int, mlm_prob: float, vocab_size: int,
           gen: np.random.Generator) -> dict:
    """A batch of prepared examples (the TFRecord fields as arrays) with new masks: the original tokens are put
    back from masked_lm_positions/ids, then masked afresh. The fields are replaced, not changed in place."""
    ids = np.array(ex["input_ids"], np.int64)
    valid = ex["masked_lm_weights"] > 0
    rows = np.broadcast_to(np.arange(len(ids))[:, np.newaxis], valid.shape)
    ids[rows[valid], ex["masked_lm_positions"][valid]] = ex["masked_lm_ids"][valid]
    real = ex["input_mask"] > 0
    cand = real & (ids != sp.cls) & (ids != sp.sep)
    pos, lm_ids, valid = choose(ids, real.sum(1), cand, max_pred, mlm_prob, vocab_size, sp.mask, sp.low, gen)
    return {**ex, "input_ids": ids, "masked_lm_positions": pos, "masked_lm_ids": lm_ids,
            "masked_lm_weights": valid.astype(np.float32)}
