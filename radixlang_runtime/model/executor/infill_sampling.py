"""llama.cpp's infill sampler as a stage of the server's sampler (SamplingParams.infill).

It runs on a row after top-k / top-p / min-p, over the candidates they kept (tokens with probability above
zero; top_k >= 1 bounds them), and before the draw. What it does, as llama.cpp's llama_sampler_infill_apply:

1. The candidates' probabilities are renormalised to sum to one.
2. End of generation against text: with E the end tokens' summed probability, T the text tokens' and n the
   number of candidates, EOG_FACTOR * E * n > T keeps only the end tokens (the middle is done) and stops here.
3. Tokens whose piece is a prefix of another candidate's piece are merged: walking the candidates from the most
   likely, each pair (a, b) where a's piece (non-empty) starts b's gives the less likely one's probability to
   the more likely one (on a tie, to a), which leaves the candidates.
4. A text token under TEXT_FLOOR of the mass is dropped; end tokens stay. No text token left: the row takes the
   end token (llama.cpp's EOT) and nothing else.
5. Renormalised over what is left, a text token under 1 / (texts left + 1) is dropped; end tokens stay.

The draw then runs over the tokens left with their probabilities from before the stage (llama.cpp's `dist`
takes the softmax of the kept tokens' logits again, so the merged sums only decide what stays).

Pieces are the bytes a token writes (constrained/vocab.py's table; special tokens write none); an end token's
piece counts as empty, so end tokens never merge. The end tokens are the server's EOS ids and the request's
stop_token_ids; the end token of step 4 is the server's first EOS id. The table is built once, on the first
row that asks for the stage; a runner without a tokenizer merges nothing.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

import torch

logger = logging.getLogger(__name__)

EOG_FACTOR = 3.0  # step 2: end tokens win when EOG_FACTOR * E * n > T
TEXT_FLOOR = 0.2  # step 4: a text token under this share of the mass is dropped


def infill_filter(ids: Sequence[int], probs: Sequence[float], piece: Callable[[int], bytes],
                  is_end: Callable[[int], bool]) -> Optional[list[int]]:
    """The candidates `ids` (most likely first) with their probabilities -> the ids that stay, in the same
    order; None: no text token stays, the row must end. piece(id): the bytes the token writes."""
    n = len(ids)
    total = sum(probs)
    p = [x / total for x in probs]
    end = [is_end(t) for t in ids]
    p_end = sum(x for x, e in zip(p, end) if e)
    p_text = sum(x for x, e in zip(p, end) if not e)
    if EOG_FACTOR * p_end * n > p_text:
        return [t for t, e in zip(ids, end) if e]
    alive = [True] * n
    for a, later in enumerate(_prefix_pairs([b"" if e else piece(t) for t, e in zip(ids, end)])):
        for b in later:
            if not alive[a]:
                break
            if not alive[b]:
                continue
            dst, src = (b, a) if p[b] > p[a] else (a, b)
            p[dst] += p[src]
            p[src] = 0.0
            alive[src] = False
    kept = [i for i in range(n) if end[i] or (alive[i] and p[i] >= TEXT_FLOOR)]
    texts = sum(1 for i in kept if not end[i])
    if texts == 0:
        return None
    mass = sum(p[i] for i in kept)
    floor = 1.0 / (texts + 1)
    return [ids[i] for i in kept if end[i] or p[i] / mass >= floor]


def _prefix_pairs(pieces: Sequence[bytes]) -> list[list[int]]:
    """For each candidate a, the candidates b != a (ascending) whose piece starts with a's non-empty piece."""
    where: dict[bytes, list[int]] = {}
    for i, s in enumerate(pieces):
        if s:
            where.setdefault(s, []).append(i)
    out: list[list[int]] = [[] for _ in pieces]
    for b, s in enumerate(pieces):
        for cut in range(1, len(s) + 1):
            for a in where.get(s[:cut], ()):
                if a != b:
                    out[a].append(b)
    for lst in out:
        lst.sort()
    return out


class InfillStage:
    """The stage over a batch's rows. build_pieces: -> one piece (bytes, or None for none) per token id, called
    once, on the first row that asks for the stage (None: no table, nothing merges)."""

    def __init__(self, build_pieces: Optional[Callable[[], Sequence[Optional[bytes]]]] = None):
        self._build = build_pieces
        self._pieces: Optional[Sequence[Optional[bytes]]] = None

    def pieces(self) -> Sequence[Optional[bytes]]:
        if self._pieces is None:
            table: Sequence[Optional[bytes]] = ()
            if self._build is not None:
                try:
                    table = self._build()
                except (TypeError, ValueError) as e:  # a tokenizer the table cannot be read from
                    logger.warning("infill sampling merges no tokens: no piece table (%s)", e)
            self._pieces = table
        return self._pieces

    def apply(self, probs: torch.Tensor, order: torch.Tensor, rows: list[int], top_k: list[int],
              end_ids: list[set[int]], end_token: int) -> dict[int, int]:
        """probs [b, V] sorted descending, the other stages' drops already 0; order [b, V] their token ids.
        For each of `rows` (top_k[j] >= 1 its candidates' bound) the dropped candidates are set to 0 in place;
        -> {row: end_token} for the rows that must end."""
        k = max(top_k[j] for j in rows)
        idx = torch.tensor(rows, device=probs.device)
        p_rows = probs[idx, :k].tolist()
        id_rows = order[idx, :k].tolist()
        table = self.pieces()
        keep = torch.zeros(len(rows), k, dtype=probs.dtype)
        ends: dict[int, int] = {}
        for r, j in enumerate(rows):
            cand = [(t, x) for t, x in zip(id_rows[r][:top_k[j]], p_rows[r][:top_k[j]]) if x > 0.0]
            if not cand:  # every candidate masked: the row stays as it is
                keep[r] = 1.0
                continue
            kept = infill_filter([t for t, _ in cand], [x for _, x in cand],
                                 lambda t: (table[t] or b"") if t < len(table) else b"", end_ids[j].__contains__)
            if kept is None:
                ends[j] = end_token
                keep[r, 0] = 1.0  # anything non-zero: the draw is overridden
                continue
            stay = set(kept)
            for c, t in enumerate(id_rows[r][:top_k[j]]):
                if t in stay:
                    keep[r, c] = 1.0
        probs[idx, :k] = probs[idx, :k] * keep.to(probs.device)
        return ends
