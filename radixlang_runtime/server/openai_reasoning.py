"""Reasoning in /v1/chat/completions replies: --reasoning-parser + the request's `separate_reasoning` /
`stream_reasoning` (SGLang's fields, both default true) (no torch).

With a parser and separate_reasoning, each choice's output runs through a ReasoningStream: the reasoning
goes to `message.reasoning_content` / `delta.reasoning_content`, the rest is the content, and only the
content is then parsed for tool calls (a call written inside the reasoning stays reasoning text) and cut at
the request's `stop` strings: those are taken out of the runtime's sampling params (where they would fire
inside the reasoning) and applied here; a hit aborts the runtime request (finish_reason "stop").
stream_reasoning false: the reasoning is held and sent in one delta once it ends.
usage.completion_tokens_details.reasoning_tokens: the output tokens up to and including the end of the
reasoning (reasoning_tokens: prefix decodes, binary search).
Where the split begins (the plan's `begins`: inside, may_open or outside the block) is decided once per request
from the rendered prompt's token ids, as the scheduler's reasoning watch decides it (reasoning_watch.prompt_begins:
a template that opened the block, or closed it, or neither: the parser's default); gpt-oss's harmony has no
marker pair and begins as its format says. A request that continues its final assistant message
(continue_final_message) also has that text as the plan's `prefix`: each parser reads it before the output,
so the output's split follows from where the prefill left off; the prefix itself is not sent again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from radixlang_runtime.protocol.limits import need_bool
from radixlang_runtime.reasoning_machine import THINK
from radixlang_runtime.reasoning_parser import INSIDE, OUTSIDE, ReasoningParser, Split, get_reasoning_parser


@dataclass
class ReasoningPlan:
    parser: type[ReasoningParser]
    stops: list[str] = field(default_factory=list)  # applied to the content (taken from the runtime's params)
    stream_reasoning: bool = True
    prefix: str = ""  # the continued assistant text, read by each parser before the output
    begins: Optional[str] = None  # INSIDE | MAY_OPEN | OUTSIDE, from the prompt (None: the parser's default)

    def fresh(self) -> ReasoningParser:
        """A parser that has read the prefix (its split discarded: the client sent that text); `thought` then
        says whether the output begins inside the reasoning."""
        p = self.parser(self.begins)
        if self.prefix:
            p.feed(self.prefix)
            p.thought = p.state == THINK
        return p

    def stream(self) -> "ReasoningStream":
        return ReasoningStream(self.fresh(), self.stops)

    def regex_prefix(self) -> str:
        """Before a forced tool call: the reasoning block the format allows where the output begins (none
        outside the block; inside it, no first character of the end marker)."""
        if self.parser.forced_prefix is not None:  # a format of its own (gpt-oss: the analysis message)
            return rf"(?:{self.parser.forced_prefix})?"
        p = self.parser(self.begins)
        if p.begins == OUTSIDE:
            return ""
        start, end = re.escape(p.start), re.escape(p.end)
        block = rf"[^{re.escape(p.end[0])}]*{end}\n{{0,2}}"
        return rf"(?:{start})?{block}" if p.begins == INSIDE else rf"(?:{start}{block})?"


def reasoning_plan(parser_name: Optional[str], body: dict) -> Optional[ReasoningPlan]:
    """None: no split (no --reasoning-parser, or separate_reasoning false)."""
    separate = body.get("separate_reasoning")
    separate = True if separate is None else need_bool(separate, "separate_reasoning")
    streamed = body.get("stream_reasoning")
    streamed = True if streamed is None else need_bool(streamed, "stream_reasoning")
    if parser_name is None or not separate:
        return None
    return ReasoningPlan(get_reasoning_parser(parser_name), stream_reasoning=streamed)


class ReasoningStream:
    """One choice: text deltas in -> Split deltas out, the content cut at the first stop string."""

    def __init__(self, parser: ReasoningParser, stops: list[str]):
        self.parser, self.stops = parser, [s for s in stops if s]
        self._hold = max((len(s) for s in self.stops), default=1) - 1  # a stop may straddle deltas
        self._content = ""  # content not sent yet (may hold the start of a stop)
        self.stopped = False

    def feed(self, delta: str, final: bool) -> Split:
        if self.stopped:
            return Split()
        out = self.parser.feed(delta)
        if final:
            out += self.parser.finish()
        self._content += out.content
        out.content = self._cut(final)
        return out

    def _cut(self, final: bool) -> str:
        hits = [i for i in (self._content.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            text, self._content = self._content[:min(hits)], ""
            return text
        keep = 0 if final else min(self._hold, len(self._content))
        text, self._content = self._content[:len(self._content) - keep], self._content[len(self._content) - keep:]
        return text


def split_whole(plan: ReasoningPlan, text: str) -> tuple[Split, bool]:
    """A finished output -> (its split, whether a stop string cut the content)."""
    rs = plan.stream()
    out = rs.feed(text, final=True)
    return out, rs.stopped


def reasoning_tokens(plan: ReasoningPlan, output_ids: list[int], decode: Callable[[list[int]], str]) -> int:
    """How many output tokens it takes to leave the reasoning (all of them while still inside; 0 without
    reasoning). Leaving is monotone in the prefix length: a binary search over prefix decodes."""
    whole = plan.fresh()
    whole.feed(decode(output_ids))
    if not whole.thought:
        return 0
    if whole.in_reasoning:
        return len(output_ids)
    lo, hi = 1, len(output_ids)
    while lo < hi:
        mid = (lo + hi) // 2
        p = plan.fresh()
        p.feed(decode(output_ids[:mid]))
        if p.in_reasoning:
            lo = mid + 1
        else:
            hi = mid
    return lo

