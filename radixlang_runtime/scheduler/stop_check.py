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

import os.path
from typing import Callable, Optional

from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.protocol.stop_regex import MAX_NEWEST_CHARS, StopRegex, first_stop

# stop_regex looks at the text of this many newest output tokens, and at most this many characters of
# it (bounds each step's RE2 search): a longer match is not seen.
STOP_REGEX_WINDOW = 256
STOP_REGEX_WINDOW_CHARS = 4096

Detokenize = Callable[[list[int]], str]


def _window(out: list[int], window: int, detokenize: Detokenize) -> tuple[str, str]:
    """The text of the last `window` output tokens without and with the newest one."""
    return (detokenize(out[-window:-1]) if len(out) > 1 else ""), detokenize(out[-window:])


def _newest_text(out: list[int], window: int, detokenize: Detokenize) -> tuple[str, Optional[int]]:
    """The text of the last `window` output tokens and where the newest token's text starts in it
    (None when the text without the newest token is not a prefix, e.g. a multi-byte character)."""
    head, tail = _window(out, window, detokenize)
    return tail, (len(head) if tail.startswith(head) else None)


def _stop_string(out: list[int], stops: list[str], detokenize: Detokenize) -> Optional[tuple[str, int]]:
    tail, newest_from = _newest_text(out, max(len(s) for s in stops) + 2, detokenize)
    for s in stops:
        at = tail.rfind(s) if newest_from is None else tail.find(s, max(0, newest_from - len(s) + 1))
        if at >= 0:
            return s, len(tail) - at
    return None


def _regex_window(out: list[int], detokenize: Detokenize) -> tuple[str, int]:
    """The window text for stop_regex and where the newest token's text starts in it; when the text
    without the newest token is not a prefix (a multi-byte character completed), from where they differ."""
    head, tail = _window(out, STOP_REGEX_WINDOW, detokenize)
    newest_from = len(head) if tail.startswith(head) else len(os.path.commonprefix([head, tail]))
    newest_from = max(newest_from, len(tail) - MAX_NEWEST_CHARS)
    cut = max(0, len(tail) - STOP_REGEX_WINDOW_CHARS)
    return tail[cut:], max(0, newest_from - cut)


def _stop_regex(out: list[int], patterns: list[StopRegex], detokenize: Detokenize) -> Optional[tuple[str, int]]:
    """The stop of the earliest start over all patterns (ties: the first pattern) that ends in the newest
    token's text (stop_regex.first_stop: non-empty, RE2, linear time)."""
    tail, newest_from = _regex_window(out, detokenize)
    best: Optional[tuple[int, str]] = None
    for pattern in patterns:
        hit = first_stop(pattern, tail, newest_from)
        if hit is not None and (best is None or hit[0] < best[0]):
            best = hit
    return None if best is None else (best[1], len(tail) - best[0])


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
