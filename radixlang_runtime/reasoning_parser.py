"""Reasoning (`<think>...</think>`) split from a model's answer, SGLang's --reasoning-parser names (no torch).

One streaming machine per output: feed(delta) -> Split(reasoning delta, content delta), finish() at the
end; parse(text) is the same machine over the whole text, so a stream in any chunking adds up to the
non-streamed split. The formats:
  deepseek-r1  the output starts inside the reasoning (the chat template opens `<think>`); a `<think>` the
               model writes itself at the start is skipped (R1-0528 writes it); no `</think>` at all: the
               whole output is reasoning (cut off while thinking).
  qwen3        the reasoning is an explicit `<think>...</think>` block opening the output (after
               whitespace); an output that does not open with one is all content.
  gpt-oss      OpenAI's harmony messages (HarmonyParser below): the analysis channel is the reasoning.
Invariants: reasoning is the text between the markers, without the whitespace next to them; content is
what follows `</think>` without its leading whitespace (an output without reasoning: its text verbatim).
A partial marker (or the whitespace before one) at the end of the text so far is held back until decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

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
    keeps_special_tokens: ClassVar[bool] = False  # the markers are special tokens the detokenizer must keep
    # before a forced tool call (openai_reasoning.ReasoningPlan.regex_prefix): the optional reasoning block, as
    # a regex; None: the <think> block
    forced_prefix: ClassVar[Optional[str]] = None

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


_H_START, _H_CHANNEL, _H_MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
_H_ENDS = ("<|end|>", "<|return|>", "<|call|>")
_H_MARKERS = (_H_START, _H_CHANNEL, *_H_ENDS)
_H_TAIL = " to="  # the output's first message addressed in its role header
BETWEEN, BODY_REASONING, BODY_CONTENT, BODY_CALL = "between", "think", "content", "call"  # HarmonyParser modes


class HarmonyParser(ReasoningParser):
    """gpt-oss's harmony output (the chat template ends the prompt with `<|start|>assistant`), messages of
    `[<|start|>ROLE]<|channel|>HEADER<|message|>BODY` ended by <|end|>, <|return|> or <|call|> (or the output's end):
      analysis              its body is the reasoning (markers dropped);
      HEADER with `to=`     a tool call: the whole message, markers included, is content (the gpt-oss tool parser
                            reads it);
      final, commentary...  its body is content (markers dropped).
    The first message's role header may go on in the output (` to=functions.NAME<|channel|>...`: a call).
    Text outside any message is content verbatim. The markers are special tokens: the detokenizer keeps them.
    A partial marker at the end of the text so far is held back until decided."""

    name = "gpt-oss"
    start = _H_CHANNEL + "analysis" + _H_MESSAGE
    end = "<|end|>"
    keeps_special_tokens = True
    forced_prefix = r"<\|channel\|>analysis<\|message\|>[^<]*<\|end\|><\|start\|>assistant"

    def __init__(self) -> None:
        super().__init__()
        self.mode = BETWEEN
        self._begun = False  # some of the output is decided (past the place the prompt's role header goes on)

    def feed(self, delta: str) -> Split:
        self._buf += delta
        return self._run(final=False)

    def finish(self) -> Split:
        out = self._run(final=True)
        self._buf = ""
        return out

    def _run(self, final: bool) -> Split:
        out = Split()
        while self._buf:
            if self.mode == BETWEEN and not self._between(out, final):
                break
            self._begun = True
            if self.mode != BETWEEN and not self._body(out, final):
                break
        return out

    def _between(self, out: Split, final: bool) -> bool:
        """Outside a message: a header, an end marker, or plain text. False: wait for more text."""
        buf = self._buf
        for mark in _H_ENDS:
            if buf.startswith(mark):
                self._buf = buf[len(mark):]
                return True
        tail = not self._begun and buf.startswith(_H_TAIL)  # the prompt's `<|start|>assistant` goes on
        if not self._begun and not final and _H_TAIL.startswith(buf):
            return False
        if buf.startswith((_H_START, _H_CHANNEL)) or tail:
            i = buf.find(_H_MESSAGE)
            if i < 0:
                if final:  # a header cut off: its text as it came
                    out.content += buf
                    self._buf = ""
                return False
            header = buf[:i]
            channel = header.split(_H_CHANNEL, 1)[-1].split()
            if " to=" in " " + header.replace(_H_CHANNEL, " ").replace(_H_START, " "):
                self.mode, self.state = BODY_CALL, CONTENT
                out.content += buf[:i + len(_H_MESSAGE)]
            elif channel[:1] == ["analysis"]:
                self.mode, self.state = BODY_REASONING, THINK
            else:
                self.mode, self.state = BODY_CONTENT, CONTENT
            self._buf = buf[i + len(_H_MESSAGE):]
            return True
        if not final and any(m.startswith(buf) for m in _H_MARKERS):
            return False  # a partial marker
        cut = [i for i in (buf.find(m) for m in _H_MARKERS) if i > 0]
        n = min(cut) if cut else len(buf) - (0 if final else max(_partial_suffix(buf, m) for m in _H_MARKERS))
        out.content += buf[:n]
        self._buf = buf[n:]
        self.state = CONTENT
        return n > 0

    def _body(self, out: Split, final: bool) -> bool:
        """Inside a message's body: up to its end marker (or a new message's header, or the output's end)."""
        buf = self._buf
        ends = [(i, m) for m in (*_H_ENDS, _H_START) if (i := buf.find(m)) >= 0]
        if ends:
            i, mark = min(ends)
            n, rest = i, buf[i + (0 if mark == _H_START else len(mark)):]
            done = True
        else:
            n = len(buf) - (0 if final else max(_partial_suffix(buf, m) for m in (*_H_ENDS, _H_START)))
            rest, mark, done = buf[n:], "", False
        text = buf[:n] + (mark if self.mode == BODY_CALL and mark in _H_ENDS else "")
        if self.mode == BODY_REASONING:
            out.reasoning += text
        else:
            out.content += text
        self._buf = rest
        if done:
            if self.mode == BODY_REASONING:
                self.state = AFTER  # left the reasoning
            self.mode = BETWEEN
        return done

    @property
    def in_reasoning(self) -> bool:
        return self.state in (START, THINK)


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {p.name: p for p in (DeepSeekR1Parser, Qwen3Parser,
                                                                           HarmonyParser)}


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; known: {', '.join(sorted(REASONING_PARSERS))}") \
            from None
