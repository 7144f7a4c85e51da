"""Logprob entries as the native protocol returns them (torch-free; Engine and server share it).

An entry is the triple [logprob | None, token_id, token_text | None] (text only with
return_text_in_logprobs); a top-logprob row is a list of such triples. Input entries cover tokens
logprob_start_len + 1 .. L - 1; with logprob_start_len == 0 a [None, token 0, ...] entry leads (and a
None top row), so entry i then belongs to token i. Asked for (the OpenAI routes' prompt_logprobs),
input_token_ranks runs alongside input_token_logprobs: each token's rank in the vocabulary (1: the
model's top choice), None where its entry's logprob is.
"""

from __future__ import annotations

from typing import Callable, Optional

Decode = Optional[Callable[[int], str]]
MAX_TOP_LOGPROBS = 100


def normalize_logprob_args(n_prompt: int, return_logprob: bool, logprob_start_len: Optional[int],
                           top_logprobs_num: Optional[int]) -> tuple[int, int]:
    """Validate; returns (start, top_num). An omitted (None or -1) start means 0."""
    start = 0 if logprob_start_len in (None, -1) else logprob_start_len
    top = top_logprobs_num or 0
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise ValueError(f"logprob_start_len must be a non-negative integer (or -1), got {logprob_start_len!r}")
    if return_logprob and start >= n_prompt:
        raise ValueError(f"logprob_start_len ({start}) must be below the prompt length ({n_prompt})")
    if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs_num must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top_logprobs_num!r}")
    return start, top


def entries(vals: list, ids: list[int], decode: Decode) -> list[list]:
    return [[v, t, decode(t) if decode else None] for v, t in zip(vals, ids)]


def top_rows(rows: list, decode: Decode) -> list:
    return [None if row is None else [[v, t, decode(t) if decode else None] for v, t in row] for row in rows]


def input_meta(input_ids: list[int], start: int, vals: list[float], tops: list, top_num: int,
               decode: Decode, ranks: Optional[list[int]] = None) -> dict[str, list]:
    """ranks: the tokens' ranks, aligned with vals (None: no input_token_ranks)."""
    toks = entries(vals, input_ids[start + 1 : start + 1 + len(vals)], decode)
    top = top_rows(tops, decode) if top_num else []
    lead: list = []
    if start == 0:
        toks = [[None, input_ids[0], decode(input_ids[0]) if decode else None]] + toks
        top = [None] + top if top_num else []
        lead = [None]
    out = {"input_token_logprobs": toks}
    if top_num:
        out["input_top_logprobs"] = top
    if ranks is not None:
        out["input_token_ranks"] = lead + list(ranks)
    return out


def output_meta(vals: list[float], ids: list[int], tops: list, top_num: int, decode: Decode) -> dict[str, list]:
    out = {"output_token_logprobs": entries(vals, ids, decode)}
    if top_num:
        out["output_top_logprobs"] = top_rows(tops, decode)
    return out
