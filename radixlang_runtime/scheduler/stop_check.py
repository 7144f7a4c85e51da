"""When a request's newest output token finishes it (torch-free). Called after every appended token
(sampled or accepted from a jump-forward draft), in this order:

1. from min_new_tokens on: a stop token id or an end token (unless ignore_eos) -> stop, matched = id;
   a stop string, then a stop_regex, whose occurrence ends in the newest token's text -> stop,
   matched = the string / the matched text, req.stop_from_end = where it starts, counted from the end;
2. max_new_tokens reached -> length; the context full -> length.
Only occurrences that end in the newest token count: earlier ones were checked at their own step,
or lie inside the min_new_tokens part (and must not end the request later).
"""

from __future__ import annotations

import re
from typing import Callable, Optional

from radixlang_runtime.scheduler.request import Req

# stop_regex looks at the text of this many newest output tokens: a longer match is not seen.
STOP_REGEX_WINDOW = 256

Detokenize = Callable[[list[int]], str]


def _newest_text(out: list[int], window: int, detokenize: Detokenize) -> tuple[str, Optional[int]]:
    """The text of the last `window` output tokens and where the newest token's text starts in it
    (None when the text without the newest token is not a prefix, e.g. a multi-byte character)."""
    tail = detokenize(out[-window:])
    head = detokenize(out[-window:-1]) if len(out) > 1 else ""
    return tail, (len(head) if tail.startswith(head) else None)


def _stop_string(out: list[int], stops: list[str], detokenize: Detokenize) -> Optional[tuple[str, int]]:
    tail, newest_from = _newest_text(out, max(len(s) for s in stops) + 2, detokenize)
    for s in stops:
        at = tail.rfind(s) if newest_from is None else tail.find(s, max(0, newest_from - len(s) + 1))
        if at >= 0:
            return s, len(tail) - at
    return None


def _stop_regex(out: list[int], patterns: list["re.Pattern[str]"], detokenize: Detokenize) -> Optional[tuple[str, int]]:
    """The first non-empty match (earliest start over all patterns) ending in the newest token's text;
    zero-width matches never stop."""
    tail, newest_from = _newest_text(out, STOP_REGEX_WINDOW, detokenize)
    newest_from = newest_from or 0
    best = None
    for pattern in patterns:
        for m in pattern.finditer(tail):
            if m.end() > newest_from and m.end() > m.start():
                if best is None or m.start() < best.start():
                    best = m
                break
    return None if best is None else (best.group(0), len(tail) - best.start())


def check_finished(req: Req, eos_token_ids: tuple[int, ...], context_len: int, detokenize: Detokenize) -> None:
    sp = req.sampling
    out = req.output_ids
    last = out[-1]
    if len(out) >= sp.min_new_tokens:
        if last in sp.stop_token_ids or (not sp.ignore_eos and last in eos_token_ids):
            req.finish({"type": "stop", "matched": last})
            return
        hit = _stop_string(out, sp.stop_strs, detokenize) if sp.stop else None
        if hit is None and sp.stop_regex:
            hit = _stop_regex(out, sp.stop_patterns, detokenize)
        if hit is not None:
            req.stop_from_end = hit[1]
            req.finish({"type": "stop", "matched": hit[0]})
            return
    if len(out) >= sp.max_new_tokens:
        req.finish({"type": "length", "length": sp.max_new_tokens})
    elif req.seq_len >= context_len:
        req.finish({"type": "length", "length": len(out)})
