"""llama.cpp's /infill limits that the route applies to one request's stream of text, and its timings.

The runtime streams the middle's text; the route folds it here and, when a limit is reached, ends the request
(TokenizerManager.end_early: the scheduler aborts it, its memory freed, and /metrics counts it as a finished
request with finish reason "length", not as an abort) and stops reading, answering stop_type "limit" as
llama.cpp does:

- n_indent: each line the model starts after a newline (the first line continues the cursor's and is never
  checked) must be indented by at least n_indent spaces or tabs once it holds another character; a line
  indented less ends the answer, cut at its first character past the indentation (llama.cpp's cut: the newline
  and the indentation stay). A blank line is never cut.
- t_max_predict_ms: once the text holds a newline, the answer ends when more than this has passed since the
  first token arrived.
- t_max_prompt_ms: when the prompt's time (prompt_ms below) is above this at the first token, the answer ends
  with empty content (the check is at the first token: a prefill is never interrupted).

While streaming, only the decided text goes out: with n_indent set, a started line's indentation is held back
until the line shows whether it is cut, so the streamed text is always the non-streamed answer's.

Timings, llama.cpp's `timings` object from what the route sees (route-side wall clock, milliseconds):
prompt_ms is from the request's prefill start to its first token (prefill and the first token's sampling), as
llama.cpp's, which starts its clock when a slot begins the prompt: the time from handing the request to the
runtime to its first token, less the scheduler's queue time (meta_info queue_time: arrival at the scheduler to
the first admission to a prefill batch), so the waiting queue is not in it; the hops between the processes and a
request's wait for the scheduler's current step to end before it is read (at most one step) still are.
prompt_n is the prompt tokens not read from the prefix cache; predicted_ms is from the first token to the last,
predicted_n the tokens generated. The per-token and per-second rates divide those (0 where a count or a time is
0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

_INDENT = " \t"


def indent_cut(text: str, n_indent: int) -> Optional[int]:
    """Where llama.cpp's n_indent cuts `text` (None: nowhere): the first line after a newline whose first
    character past its leading spaces and tabs is neither a newline nor the text's end, and whose
    indentation is below n_indent, is cut at that character."""
    if n_indent <= 0:
        return None
    start = text.find("\n") + 1
    while start > 0:
        pos = start
        while pos < len(text) and text[pos] in _INDENT:
            pos += 1
        if pos < len(text) and text[pos] != "\n" and pos - start < n_indent:
            return pos
        start = text.find("\n", start) + 1
    return None


def undecided_from(text: str, n_indent: int) -> int:
    """How much of `text` is decided under n_indent: all of it, but for a last line (after a newline) that
    holds only indentation so far, which may still be cut."""
    if n_indent <= 0:
        return len(text)
    nl = text.rfind("\n")
    if nl >= 0 and all(c in _INDENT for c in text[nl + 1:]):
        return nl + 1
    return len(text)


def _rate(n: int, ms: float) -> tuple[float, float]:
    """(milliseconds per token, tokens per second); 0 where n or ms is 0."""
    if n <= 0 or ms <= 0:
        return 0.0, 0.0
    return ms / n, 1e3 * n / ms


@dataclass
class InfillStops:
    """One request's text and clock under llama.cpp's limits (None or 0: the limit is off)."""

    n_indent: int = 0
    t_max_predict_ms: Optional[float] = None
    t_max_prompt_ms: Optional[float] = None
    started: float = 0.0  # when the request went to the runtime (perf_counter seconds)
    text: str = ""
    first_at: Optional[float] = None
    last_at: Optional[float] = None
    prompt_s: float = 0.0  # the prompt's time: first_at - started less the queue time (seconds)
    stopped: bool = False  # a limit here ended the answer
    sent: int = field(default=0)  # how much of the text has been streamed

    def feed(self, delta: str, new_tokens: int, now: float, trim: int = 0, queue_time: float = 0.0) -> bool:
        """Take the runtime's next text (trim: the last characters so far a stop string cut, results.py;
        queue_time: its meta_info queue_time, seconds); True when a limit ends the answer here (the text cut as
        llama.cpp)."""
        if new_tokens and self.first_at is None:
            self.first_at = now
            self.prompt_s = max(now - self.started - queue_time, 0.0)
            if self.t_max_prompt_ms and self.prompt_s * 1e3 > self.t_max_prompt_ms:
                self.stopped = True
                return True
        if new_tokens:
            self.last_at = now
        if trim:
            self.text = self.text[:max(len(self.text) - trim, 0)]
            self.sent = min(self.sent, len(self.text))  # streamed characters stay sent
        self.text += delta
        cut = indent_cut(self.text, self.n_indent)
        if cut is not None:
            self.text = self.text[:cut]
            self.stopped = True
        elif (self.t_max_predict_ms and self.first_at is not None and "\n" in self.text
              and (now - self.first_at) * 1e3 > self.t_max_predict_ms):
            self.stopped = True
        return self.stopped

    def ready(self, final: bool) -> str:
        """The decided text not streamed yet (all that is left when final)."""
        end = len(self.text) if final or self.stopped else undecided_from(self.text, self.n_indent)
        out, self.sent = self.text[self.sent:end], max(self.sent, end)
        return out

    def timings(self, prompt_tokens: int, cached_tokens: int, predicted: int) -> dict:
        prompt_ms = self.prompt_s * 1e3
        predicted_ms = 0.0 if self.first_at is None else ((self.last_at or self.first_at) - self.first_at) * 1e3
        prompt_n = max(prompt_tokens - cached_tokens, 0)
        p_tok, p_sec = _rate(prompt_n, prompt_ms)
        g_tok, g_sec = _rate(predicted, predicted_ms)
        return {"prompt_n": prompt_n, "prompt_ms": prompt_ms, "prompt_per_token_ms": p_tok,
                "prompt_per_second": p_sec, "predicted_n": predicted, "predicted_ms": predicted_ms,
                "predicted_per_token_ms": g_tok, "predicted_per_second": g_sec}
