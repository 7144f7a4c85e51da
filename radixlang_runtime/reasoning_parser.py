"""Reasoning (`<think>...</think>`) split from a model's answer, SGLang's --reasoning-parser names (no torch).

One streaming machine per output: feed(delta) -> Split(reasoning delta, content delta), finish() at the
end; parse(text) is the same machine over the whole text, so a stream in any chunking adds up to the
non-streamed split. The formats:
  deepseek-r1  the output starts inside the reasoning (the chat template opens `<think>`); a `<think>` the
               model writes itself at the start is skipped (R1-0528 writes it); no `</think>` at all: the
               whole output is reasoning (cut off while thinking).
  qwen3        the reasoning is an explicit `<think>...</think>` block opening the output (after
               whitespace); an output that does not open with one is all content.
Invariants: reasoning is the text between the markers, without the whitespace next to them; content is
what follows `</think>` without its leading whitespace (an output without reasoning: its text verbatim).
A partial marker (or the whitespace before one) at the end of the text so far is held back until decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

_WS = " \t\n\r"
START, THINK, AFTER, CONTENT = "start", "think", "after", "content"  # machine states


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
    """Subclasses set name, start, end and starts_inside."""

    name: ClassVar[str] = ""
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    starts_inside: ClassVar[bool] = False  # the template opened the block: the output begins in reasoning

    def __init__(self) -> None:
        self.state = START
        self._buf = ""  # undecided text (START: the output's start; THINK: a held partial end / whitespace)
        self._lead = True  # THINK: no reasoning sent yet (leading whitespace is dropped)

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
    def parse(cls, text: str) -> Split:
        p = cls()
        out = p.feed(text)
        out += p.finish()
        return out

    def _advance(self, final: bool) -> Split:
        out = Split()
        if self.state == START:
            head = self._buf.lstrip(_WS)
            if head.startswith(self.start):
                self.state, self._buf = THINK, head[len(self.start):]
            elif not final and self.start.startswith(head):
                return out  # empty or a partial `<think>`: undecided
            elif self.starts_inside:
                self.state = THINK
            else:
                self.state = CONTENT
        if self.state == THINK:
            if self._lead:
                self._buf = self._buf.lstrip(_WS)
                self._lead = not self._buf
            i = self._buf.find(self.end)
            if i < 0:
                if final:
                    return out  # finish() sends the rest
                keep = _partial_suffix(self._buf, self.end)
                body = self._buf[:len(self._buf) - keep]
                sent = body.rstrip(_WS)  # trailing whitespace waits: it may precede </think>
                out.reasoning, self._buf = sent, self._buf[len(sent):]
                return out
            out.reasoning = self._buf[:i].rstrip(_WS)
            self.state, self._buf = AFTER, self._buf[i + len(self.end):]
        if self.state == AFTER:
            self._buf = self._buf.lstrip(_WS)
            if not self._buf:
                return out
            self.state = CONTENT
        out.content, self._buf = self._buf, ""
        return out


class DeepSeekR1Parser(ReasoningParser):
    name = "deepseek-r1"
    starts_inside = True


class Qwen3Parser(ReasoningParser):
    name = "qwen3"


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {p.name: p for p in (DeepSeekR1Parser, Qwen3Parser)}


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; known: {', '.join(sorted(REASONING_PARSERS))}") \
            from None
