"""A thinking-token budget (vLLM's `thinking_token_budget`, Anthropic's `thinking.budget_tokens`), the intake's
side (torch-free): the reasoning markers as token ids, and one request's plan.

The server's --reasoning-parser names the markers (`<think>` / `</think>`); ThinkingMarkers holds them as the
tokenizer encodes them, once, at start. A request's ThinkingBudget says how many tokens it may generate inside
the reasoning block, the markers, and whether its output begins inside the block: the prompt's last start
marker comes after its last end marker (a template or an assistant prefill opened it), or the prompt holds
neither and the parser's output starts inside (deepseek-r1). The scheduler's tracker
(scheduler/thinking_budget.py) counts and forces the end marker when the budget is spent.

Matching is on token ids: the markers are found where the model emits the same ids the tokenizer gives for
the marker text (one special token each in the reasoning models' tokenizers). gpt-oss's harmony channels have
no such pair: a budget is refused there by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from radixlang_runtime.protocol.limits import FieldError

BUDGET_FIELD = "thinking_token_budget"


@dataclass(frozen=True)
class ThinkingMarkers:
    start: tuple[int, ...]  # the start marker's token ids
    end: tuple[int, ...]
    starts_inside: bool  # the parser's output begins inside the block when the prompt holds no marker

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

        return cls(ids(parser.start), ids(parser.end), parser.starts_inside)

    def to_wire(self) -> tuple:
        return (list(self.start), list(self.end), self.starts_inside)

    @classmethod
    def from_wire(cls, w: Any) -> Optional["ThinkingMarkers"]:
        return cls(tuple(w[0]), tuple(w[1]), bool(w[2])) if w else None


@dataclass(frozen=True)
class ThinkingBudget:
    """One request's budget: at most `budget` output tokens inside the reasoning block, then `end` is forced."""

    budget: int
    start: tuple[int, ...]
    end: tuple[int, ...]
    inside: bool  # the output begins inside the block

    def to_wire(self) -> list:
        return [self.budget, list(self.start), list(self.end), self.inside]

    @classmethod
    def from_wire(cls, w: list) -> "ThinkingBudget":
        return cls(int(w[0]), tuple(w[1]), tuple(w[2]), bool(w[3]))


def _last_at(ids: list[int], marker: tuple[int, ...]) -> int:
    """Where the last occurrence of marker in ids starts (-1: none)."""
    n = len(marker)
    if not n:
        return -1
    for i in range(len(ids) - n, -1, -1):
        if ids[i] == marker[0] and tuple(ids[i:i + n]) == marker:
            return i
    return -1


def plan_budget(prompt_ids: list[int], budget: int, markers: ThinkingMarkers) -> ThinkingBudget:
    """The plan of a request with this prompt."""
    s, e = _last_at(prompt_ids, markers.start), _last_at(prompt_ids, markers.end)
    inside = s > e if (s >= 0 or e >= 0) else markers.starts_inside
    return ThinkingBudget(budget, markers.start, markers.end, inside)


def request_budget(prompt_ids: list[int], budget: int, constrained: bool, limits: Any) -> ThinkingBudget:
    """The plan of a request asking for a budget on a server with these RuntimeLimits (reasoning_parser,
    thinking_markers, speculative); FieldError naming thinking_token_budget where it cannot be honoured."""
    markers = ThinkingMarkers.from_wire(limits.thinking_markers)
    if markers is None:
        why = (f"--reasoning-parser {limits.reasoning_parser} has no start / end marker pair"
               if limits.reasoning_parser else "the server runs without --reasoning-parser (it names the markers)")
        raise FieldError(BUDGET_FIELD, f"{BUDGET_FIELD} is not supported: {why}")
    if not markers.start or not markers.end:
        raise FieldError(BUDGET_FIELD, f"{BUDGET_FIELD} is not supported: the tokenizer encodes a reasoning "
                                       f"marker as no tokens")
    if constrained:
        raise FieldError(BUDGET_FIELD, f"{BUDGET_FIELD} cannot be combined with a grammar (regex / json_schema / "
                                       f"ebnf / structural_tag / response_format)")
    if limits.speculative:
        raise FieldError(BUDGET_FIELD, f"{BUDGET_FIELD} is not supported with speculative decoding")
    return plan_budget(prompt_ids, budget, markers)
