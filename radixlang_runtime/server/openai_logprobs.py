"""Logprobs in the OpenAI routes' shapes, from the native meta_info entries (logprob_format.py): completions'
`logprobs` (tokens, token_logprobs, top_logprobs, text_offset), chat's `logprobs.content`, and vLLM's
`prompt_logprobs` (both routes). Every value is the model's raw log_softmax (before temperature).

One runtime request may carry more top alternatives than a field asked for (top_logprobs and
prompt_logprobs share it: openai_intake.Choices.build); each shape cuts its rows to its own count (the rows
are in descending order).
"""

from __future__ import annotations

from typing import Optional

# vLLM's floor for a -inf logprob (its clamp_prompt_logprobs): JSON has no infinity
LOGPROB_FLOOR = -9999.0


def _token(e: list, token_ids: bool) -> str:
    """A logprob entry's token as the reply names it: its text, or "token_id:N" (vLLM's
    return_tokens_as_token_ids: every token identifiable, a piece of a multi-byte character included)."""
    return f"token_id:{e[1]}" if token_ids else e[2]


def completion_logprobs(meta: dict, echo: bool, text_offset0: int = 0, token_ids: bool = False,
                        top: Optional[int] = None) -> dict:
    """meta_info entries -> OpenAI completions `logprobs` (tokens, token_logprobs, top_logprobs, text_offset);
    text_offset counts the tokens' text either way. top: the alternatives each row keeps (None: all; 0: the rows
    are None, as when none were computed)."""
    entries = meta.get("output_token_logprobs", [])
    tops = meta.get("output_top_logprobs") or [None] * len(entries)
    if echo and "input_token_logprobs" in meta:
        entries = meta["input_token_logprobs"] + entries
        tops = (meta.get("input_top_logprobs") or [None] * len(meta["input_token_logprobs"])) + tops
    offsets, pos = [], text_offset0
    for e in entries:
        offsets.append(pos)
        pos += len(e[2])
    return {"tokens": [_token(e, token_ids) for e in entries], "token_logprobs": [e[0] for e in entries],
            "top_logprobs": [None if row is None or top == 0 else {_token(e, token_ids): e[0] for e in row[:top]}
                             for row in tops],
            "text_offset": offsets}


def chat_logprobs(meta: dict, top: Optional[int], token_ids: bool = False) -> dict:
    """meta_info's output entries -> chat `logprobs` ({"content": [...]}); top: the alternatives each token
    lists (None or 0: none)."""
    entries = meta.get("output_token_logprobs", [])
    tops = meta.get("output_top_logprobs") or [[] for _ in entries]

    def item(e: list) -> dict:
        token = _token(e, token_ids)
        return {"token": token, "logprob": e[0], "bytes": list(token.encode())}

    return {"content": [{**item(e), "top_logprobs": [item(x) for x in row[:top or 0]]}
                        for e, row in zip(entries, tops)]}


def _logprob(value: float, rank: int, text: str) -> dict:
    return {"logprob": max(value, LOGPROB_FLOOR), "rank": rank, "decoded_token": text}


def prompt_logprobs(meta: dict, top: int) -> list[Optional[dict]]:
    """meta_info's input entries (asked from position 0, with input_token_ranks) -> vLLM's prompt_logprobs:
    one entry per prompt token, None for the first (nothing predicts it), else {"<token id>": {"logprob",
    "rank", "decoded_token"}} holding the prompt token itself (rank: 1 + the vocabulary entries more likely)
    and then its position's `top` most likely tokens (rank 1..top) not already there."""
    entries, ranks = meta["input_token_logprobs"], meta["input_token_ranks"]
    rows = meta.get("input_top_logprobs") or [None] * len(entries)
    out: list[Optional[dict]] = [None]
    for (value, tid, text), rank, row in zip(entries[1:], ranks[1:], rows[1:]):
        d = {str(tid): _logprob(value, rank, text)}
        for r, (v, t, s) in enumerate((row or [])[:top], 1):
            d.setdefault(str(t), _logprob(v, r, s))
        out.append(d)
    return out
