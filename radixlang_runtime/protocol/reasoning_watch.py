"""The reasoning block's watch, the intake's side (torch-free): the markers as token ids, and one request's plan
(ReasoningWatch) for the two things the scheduler does at the block's edges.

- A thinking-token budget (vLLM's `thinking_token_budget`, Anthropic's `thinking.budget_tokens`): at most that
  many output tokens inside the block, then its end marker is forced.
- A grammar held until the block ends (structured outputs with reasoning, as SGLang and vLLM do it): a chat
  request's response_format / structured_outputs / regex constrains the answer, not the reasoning. A request
  with a budget holds its grammar too (the forced marker must not meet a grammar).

The server's --reasoning-parser names the markers (`<think>` / `</think>`, `[THINK]` / `[/THINK]`, ...);
ThinkingMarkers holds them as the tokenizer encodes them, once, at start. Where the output begins (prompt_begins,
from the prompt's ids; the chat route's reasoning split begins from the same decision, openai_reasoning.py) is
read from the prompt's tail only: a marker counts when at most `reach` tokens follow it (GENERATION_TAIL: the
generation prompt's own markup after it, as templates write `<think>\n` or `</think>\n\n`; the chat route adds
a continued assistant message's tokens). Earlier markers belong to the history (a tool loop's past reasoning,
a system prompt that describes the format) and decide nothing.
  inside    the tail's last marker is a start marker (a template or an assistant prefill opened the block), or
            the tail holds none and the parser's output starts inside (deepseek-r1);
  may_open  the tail holds none, the parser's output does not start inside (qwen3): the model may open
            the block with its first tokens (a grammar then allows the start marker as the first token, which
            takes a one-token marker: with a longer one the grammar applies from the first token);
  outside   the tail's last marker is an end marker (a template's thinking switched off): nothing is watched.
Matching is on token ids (one special token each in the reasoning models' tokenizers). gpt-oss's harmony
channels have no such pair: a budget is refused there by name, and grammars apply from the first token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.reasoning_machine import INSIDE, MAY_OPEN, OUTSIDE

__all__ = ["BUDGET_FIELD", "GENERATION_TAIL", "INSIDE", "MAY_OPEN", "OUTSIDE", "ChatWatch", "ReasoningWatch",
           "ThinkingMarkers", "plan_watch", "prompt_begins", "request_watch"]
BUDGET_FIELD = "thinking_token_budget"
GENERATION_TAIL = 8  # tokens that may follow a marker the generation prompt placed (its newlines, a space)


@dataclass(frozen=True)
class ThinkingMarkers:
    start: tuple[int, ...]  # the start marker's token ids
    end: tuple[int, ...]
    starts_inside: bool  # the parser's output begins inside the block when the prompt holds no marker
    special: bool = False  # a marker is a special token: the chat split needs skip_special_tokens false to see it

    @classmethod
    def of_parser(cls, parser_name: Optional[str], tokenizer: Any) -> Optional["ThinkingMarkers"]:
        """The markers of --reasoning-parser as `tokenizer` encodes them; None without a parser, or for one
        without a start / end marker pair (gpt-oss)."""
        if parser_name is None:
            return None
        from radixlang_runtime.reasoning_parser import HarmonyParser, get_reasoning_parser

        parser = get_reasoning_parser(parser_name)
        if issubclass(parser, HarmonyParser):
            return None

        def ids(text: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(text, add_special_tokens=False))

        start, end = ids(parser.start), ids(parser.end)
        special = tokenizer.decode([*start, *end], skip_special_tokens=True) != \
            tokenizer.decode([*start, *end], skip_special_tokens=False)
        return cls(start, end, parser.starts_inside, special)

    def to_wire(self) -> tuple:
        return (list(self.start), list(self.end), self.starts_inside, self.special)

    @classmethod
    def from_wire(cls, w: Any) -> Optional["ThinkingMarkers"]:
        return cls(tuple(w[0]), tuple(w[1]), bool(w[2]), len(w) > 3 and bool(w[3])) if w else None


@dataclass(frozen=True)
class ReasoningWatch:
    start: tuple[int, ...]
    end: tuple[int, ...]
    begins: str  # INSIDE | MAY_OPEN | OUTSIDE: where the output begins
    budget: Optional[int] = None  # output tokens inside the block before `end` is forced (None: no budget)
    hold_grammar: bool = False  # the request's grammar waits for the block's end

    def to_wire(self) -> list:
        return [list(self.start), list(self.end), self.begins, self.budget, self.hold_grammar]

    @classmethod
    def from_wire(cls, w: list) -> "ReasoningWatch":
        return cls(tuple(w[0]), tuple(w[1]), str(w[2]), None if w[3] is None else int(w[3]), bool(w[4]))


def _last_at(ids: list[int], marker: tuple[int, ...]) -> int:
    """Where the last occurrence of marker in ids starts (-1: none)."""
    n = len(marker)
    if not n:
        return -1
    for i in range(len(ids) - n, -1, -1):
        if ids[i] == marker[0] and tuple(ids[i:i + n]) == marker:
            return i
    return -1


@dataclass(frozen=True)
class ChatWatch:
    """What the chat route tells the watch of its request (None elsewhere: a native request)."""

    hold_grammar: bool  # the request's own grammar constrains the answer after the reasoning
    begins: str  # where its output begins, decided once with its continued message (prompt_begins)


def prompt_begins(prompt_ids: list[int], markers: ThinkingMarkers, reach: int = GENERATION_TAIL) -> str:
    """Where the output after this prompt begins: INSIDE | MAY_OPEN | OUTSIDE, from the markers among the last
    `reach` tokens (and the marker ending there)."""
    tail = prompt_ids[max(0, len(prompt_ids) - reach - max(len(markers.start), len(markers.end))):]
    s, e = _last_at(tail, markers.start), _last_at(tail, markers.end)
    if s >= 0 or e >= 0:
        return INSIDE if s > e else OUTSIDE
    return INSIDE if markers.starts_inside else MAY_OPEN


def plan_watch(prompt_ids: list[int], markers: ThinkingMarkers, budget: Optional[int] = None,
               hold_grammar: bool = False, begins: Optional[str] = None) -> ReasoningWatch:
    """The watch of a request with this prompt (begins: decided by the caller; None: prompt_begins)."""
    begins = begins or prompt_begins(prompt_ids, markers)
    if begins == MAY_OPEN and hold_grammar and len(markers.start) != 1:
        begins = OUTSIDE  # a grammar cannot let a partial marker through: it applies from the first token
    return ReasoningWatch(markers.start, markers.end, begins, budget, hold_grammar)


def request_watch(prompt_ids: list[int], budget: Optional[int], constrained: bool, chat: Optional[ChatWatch],
                  limits: Any) -> Optional[ReasoningWatch]:
    """The watch of a request on a server with these RuntimeLimits (reasoning_parser, thinking_markers,
    speculative), None when nothing is watched. chat: what the chat route decided (its own grammar constrains
    the answer; where its output begins). FieldError naming thinking_token_budget where a budget cannot be
    honoured."""
    markers = ThinkingMarkers.from_wire(limits.thinking_markers)
    usable = markers is not None and bool(markers.start) and bool(markers.end)
    if budget is not None:
        if markers is None:
            why = (f"--reasoning-parser {limits.reasoning_parser} has no start / end marker pair"
                   if limits.reasoning_parser else "the server runs without --reasoning-parser (it names the markers)")
            raise FieldError(BUDGET_FIELD, f"{BUDGET_FIELD} is not supported: {why}")
        if not usable:
            raise FieldError(BUDGET_FIELD, f"{BUDGET_FIELD} is not supported: the tokenizer encodes a reasoning "
                                           f"marker as no tokens")
        if limits.speculative:
            raise FieldError(BUDGET_FIELD, f"{BUDGET_FIELD} is not supported with speculative decoding")
    # a grammar waits for the block's end on a chat request, and always beside a budget (the forced marker)
    held_by_chat = chat is not None and chat.hold_grammar
    hold = constrained and (held_by_chat or budget is not None) and usable and not limits.speculative
    if budget is None and not hold:
        return None
    return plan_watch(prompt_ids, markers, budget, hold, chat.begins if chat is not None else None)
