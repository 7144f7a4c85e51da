"""gpt-oss's harmony output for --reasoning-parser gpt-oss (no torch): not a start / end marker pair, a machine of
its own over the same feed / finish / parse interface (reasoning_machine.py)."""

from __future__ import annotations

from typing import Optional

from radixlang_runtime.reasoning_machine import AFTER, CONTENT, START, THINK, ReasoningParser, Split, _partial_suffix

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

    def __init__(self, begins: Optional[str] = None) -> None:
        super().__init__(None)  # the output begins where the prompt's role header goes on, whatever the prompt
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
                self.mode, self.state, self.thought = BODY_REASONING, THINK, True
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
