"""The reasoning split's streaming machine (no torch): one per output, a start / end marker pair.

feed(delta) -> Split(reasoning delta, content delta), finish() at the end; parse(text) is the same machine over
the whole text, so a stream in any chunking adds up to the non-streamed split. Where the output begins is one of
  inside    the prompt opened the block: the output is reasoning up to the end marker (a start marker the
            model writes itself at the very start is skipped); no end marker at all: all reasoning;
  may_open  the output is reasoning only when it opens with the start marker (after whitespace), else content;
  outside   the prompt closed the block: the whole output is content, verbatim.
A parser class names its markers and its default (starts_inside: inside, else may_open); a request's prompt may
decide otherwise (protocol/reasoning_watch.prompt_begins, the same decision the scheduler's watch makes).
Invariants: reasoning is the text between the markers, without the whitespace next to them; content is what
follows the end marker without its leading whitespace (an output without reasoning: its text verbatim). A
format with a tool start (tool_start) also leaves the reasoning where the model opens its tool calls before
the end marker: the content then begins with that marker, verbatim. A partial marker (or the whitespace
before one) at the end of the text so far is held back until decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

_WS = " \t\n\r"
START, THINK, AFTER, CONTENT = "start", "think", "after", "content"  # machine states
INSIDE, MAY_OPEN, OUTSIDE = "inside", "may_open", "outside"  # where an output begins


@dataclass
class Split:
    reasoning: str = ""
    content: str = ""

    def __iadd__(self, other: "Split") -> "Split":
        self.reasoning += other.reasoning
        self.content += other.content
        return self


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest proper prefix of marker that text ends with."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class ReasoningParser:
    """Subclasses set name, start, end, starts_inside (and tool_start, keeps_special_tokens where they apply)."""

    name: ClassVar[str] = ""
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    starts_inside: ClassVar[bool] = False  # the template opens the block: the output begins in reasoning
    tool_start: ClassVar[Optional[str]] = None  # the tool calls' opening marker, which also ends the reasoning
    keeps_special_tokens: ClassVar[bool] = False  # the markers are special tokens the detokenizer must keep
    # before a forced tool call (openai_reasoning.ReasoningPlan.regex_prefix): the optional reasoning block, as
    # a regex; None: the start / end marker block
    forced_prefix: ClassVar[Optional[str]] = None

    def __init__(self, begins: Optional[str] = None) -> None:
        """begins: INSIDE | MAY_OPEN | OUTSIDE (None: the class's default)."""
        self.begins = begins or self.default_begins()
        self.state = CONTENT if self.begins == OUTSIDE else START
        self._buf = ""  # undecided text (START: the output's start; THINK: a held partial end / whitespace)
        self._lead = True  # THINK: no reasoning sent yet (leading whitespace is dropped)
        self.thought = False  # the machine has been inside the reasoning

    @classmethod
    def default_begins(cls) -> str:
        return INSIDE if cls.starts_inside else MAY_OPEN

    @property
    def in_reasoning(self) -> bool:
        return self.state in (START, THINK)

    def feed(self, delta: str) -> Split:
        self._buf += delta
        return self._advance(final=False)

    def finish(self) -> Split:
        out = self._advance(final=True)
        if self.state == THINK:
            out.reasoning += self._buf.rstrip(_WS)
        self._buf = ""
        return out

    @classmethod
    def parse(cls, text: str, begins: Optional[str] = None) -> Split:
        p = cls(begins)
        out = p.feed(text)
        out += p.finish()
        return out

    def _leave_at(self) -> tuple[int, int]:
        """THINK: (where the reasoning ends in the buffer, -1: not yet; how far the held text reaches past it)."""
        i = self._buf.find(self.end)
        if self.tool_start is not None:
            j = self._buf.find(self.tool_start)
            if j >= 0 and (i < 0 or j < i):
                return j, j  # the tool start stays: the content begins with it
        return i, (i + len(self.end) if i >= 0 else -1)

    def _advance(self, final: bool) -> Split:
        out = Split()
        if self.state == START:
            head = self._buf.lstrip(_WS)
            if head.startswith(self.start):
                self.state, self._buf = THINK, head[len(self.start):]
            elif not final and self.start.startswith(head):
                return out  # empty or a partial start marker: undecided
            elif self.begins == INSIDE:
                self.state = THINK
            else:
                self.state = CONTENT
        if self.state == THINK:
            self.thought = True
            if self._lead:
                self._buf = self._buf.lstrip(_WS)
                self._lead = not self._buf
            i, after = self._leave_at()
            if i < 0:
                if final:
                    return out  # finish() sends the rest
                keep = max(_partial_suffix(self._buf, m) for m in (self.end, self.tool_start or ""))
                body = self._buf[:len(self._buf) - keep]
                sent = body.rstrip(_WS)  # trailing whitespace waits: it may precede the end marker
                out.reasoning, self._buf = sent, self._buf[len(sent):]
                return out
            out.reasoning = self._buf[:i].rstrip(_WS)
            self.state, self._buf = (AFTER if after > i else CONTENT), self._buf[after:]
        if self.state == AFTER:
            self._buf = self._buf.lstrip(_WS)
            if not self._buf:
                return out
            self.state = CONTENT
        out.content, self._buf = self._buf, ""
        return out
