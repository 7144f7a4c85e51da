"""The one interface of every tool-call format: a streaming machine whose non-streaming parse is the
same machine run over the whole text (no torch).

A model's output is text with tool-call *groups* in it (`<tool_call>...</tool_call>`, `[TOOL_CALLS][...]`,
a leading `{...}` or `[f(...)]`). A format (one module each) says where a group may start
(find_group) and reads one group (parse_group -> GroupScan: its calls so far, open / done / invalid).
ToolParser turns that into events:
  Text(text)                       content outside the markup,
  CallStart(index, id, name)       a call begins (its name is decided),
  CallArgs(index, text)            the next piece of its arguments' JSON text.
Invariants:
- streaming (feed deltas, then finish) and parse(text) agree whenever every group in the text is
  well-formed or is refused before its first call commits (a call commits once its name is decided and
  its arguments have begun: from then on the stream has sent it). A group that breaks after a commit
  (JSON that goes wrong mid-arguments, a cut-off output) keeps, in a stream, the calls it sent (the text
  up to the break is dropped); parse(), which sees the whole group first, leaves such a group as text.
- a call's arguments are the JSON text the model wrote, byte for byte (pythonic: its keyword arguments
  as JSON), sent as growing prefixes: their concatenation is the whole text, and it json.loads to an object.
- a partial start marker at the end of the text so far is held back until it is decided; whitespace
  next to a call is not content (held until non-space text follows, dropped once a call commits, kept
  when the output has no call at all).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Collection, Optional, Union

from radixlang_runtime.tool_parsers.json_scan import COMPLETE, INVALID, PARTIAL, JsonScan, JsonScanner, scan_json, \
    skip_ws

OPEN, DONE = "open", "done"  # GroupScan.status besides INVALID
ARG_KEYS = ("arguments", "parameters")  # hermes / mistral write "arguments", Llama 3.1 "parameters"
_WS = " \t\n\r"


@dataclass
class Text:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class CallArgs:
    index: int
    text: str


Event = Union[Text, CallStart, CallArgs]


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object


@dataclass
class ParseResult:
    content: str
    calls: list[ToolCall] = field(default_factory=list)


@dataclass
class CallScan:
    name: str
    args: str  # the arguments' JSON text decided so far (the whole text once complete)
    complete: bool


@dataclass
class GroupScan:
    calls: list[CallScan]  # the calls committed so far, in order
    status: str  # OPEN (more text may continue it) / DONE / INVALID
    end: int  # DONE: one past the group; INVALID: the offending index; OPEN: len(text)


@dataclass(frozen=True)
class CallSyntax:
    """How a format writes calls, stated once per parser (forced tool_choice derives its constraint from it,
    server/openai_tools.forced_call_regex): the output is
        open + call + (sep + call)* + close,   a call = call_open + NAME [+ index + N] + name_close + ARGS + call_close,
    ARGS: "json" (a JSON object), "python" (keyword arguments `k=v, ...`, Python literals) or "xml" (per
    parameter `param[0] + KEY + param[1] + VALUE + param[2]`, VALUE text: a string as it is, other values as
    JSON); N: the call's number, digits the model writes (Kimi K2's `functions.NAME:N`), where `index` is
    set. Every layout written this way is one the format's parse_group reads
    (tests/constrained/test_forced_calls.py)."""
    open: str
    sep: str
    close: str
    call_open: str
    name_close: str
    call_close: str
    args: str = "json"
    index: str = ""
    param: tuple[str, str, str] = ("", "", "")  # args "xml": a parameter's open, key-to-value, close


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolParser:
    """Subclasses set `name` and implement find_group / parse_group."""

    name: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()  # group start markers found anywhere in the text
    keeps_special_tokens: ClassVar[bool] = False  # the markup is special tokens the detokenizer must keep
    syntax: ClassVar[Optional[CallSyntax]]  # the layout forced calls are written in (None: cannot be forced)

    @classmethod
    def call_syntax(cls, list_form: bool = False) -> Optional[CallSyntax]:
        """The layout a forced call is written in (list_form: the chat template writes a call list in one
        group, SmolLM2's <tool_call>[...]; formats with one layout ignore it)."""
        return cls.syntax

    def __init__(self, tool_names: Optional[Collection[str]] = None, new_id: Callable[[], str] = new_call_id,
                 schemas: Optional[dict[str, dict]] = None, past_calls: int = 0):
        self.tool_names = set(tool_names) if tool_names is not None else None  # None: any name
        self.schemas = schemas or {}  # parameters schema by function name (formats with typed text values)
        self.new_id = new_id
        self.past_calls = past_calls  # tool calls earlier in the conversation (formats that number calls by it)
        self._buf = ""  # text not decided yet: it starts at a group, a held marker prefix, or nothing
        self._in_group = False
        self._groups = 0  # groups seen (start-only formats take one, at the output's start)
        self._any_text = False  # non-space content went out
        self._pending_ws = ""
        self._sent: list[list[str]] = []  # per call emitted: [id, arguments sent]
        self._group_base = 0  # index of the current group's first call
        self._scanners: dict[int, Any] = {}  # values being read in _buf, by start (streaming stays linear)

    # ------------------------------------------------------------------ the interface
    def feed(self, delta: str) -> list[Event]:
        self._buf += delta
        return self._advance(final=False)

    def finish(self) -> list[Event]:
        """The text has ended: decide what is held back."""
        events = self._advance(final=True)
        if self._pending_ws and not self._sent:
            events.append(Text(self._pending_ws))
        self._pending_ws = ""
        return events

    @classmethod
    def parse(cls, text: str, tool_names: Optional[Collection[str]] = None,
              new_id: Callable[[], str] = new_call_id, schemas: Optional[dict[str, dict]] = None,
              past_calls: int = 0) -> ParseResult:
        """The whole output at once (each group is checked whole before any of its calls counts)."""
        p = cls(tool_names, new_id, schemas, past_calls)
        p._buf = text
        return collect(p.finish())

    def call_id(self, name: str, index: int) -> str:
        """The id of this output's call number `index` (its name decided)."""
        return self.new_id()

    @property
    def at_output_start(self) -> bool:
        return not self._any_text and self._groups == 0

    # ------------------------------------------------------------------ per format
    def find_group(self, text: str) -> tuple[int, int]:
        """(index of the first group start in text or -1, index from which text must be held back:
        a proper prefix of a marker at its end, else len(text))."""
        starts = [i for i in (text.find(m) for m in self.markers) if i >= 0]
        if starts:
            return min(starts), len(text)
        hold = len(text)
        for m in self.markers:
            for k in range(min(len(m) - 1, len(text)), 0, -1):
                if text.endswith(m[:k]):
                    hold = min(hold, len(text) - k)
                    break
        return -1, hold

    def parse_group(self, text: str, final: bool) -> GroupScan:
        """text starts at a group's start; final: nothing will follow it."""
        raise NotImplementedError

    def scan_at(self, text: str, i: int) -> JsonScan:
        """scan_json(text, i), continued from the last call with the same start (text only grew since)."""
        return self.scanner(i, JsonScanner).scan(text)

    def call_array_group(self, text: str, i: int, tag: str, final: bool, single: bool = False,
                         name_key: str = "name") -> GroupScan:
        """A group whose body at i is a JSON array of call objects (single: or one call object), then `tag`
        (closing; "" for none): the part the JSON call formats share after their own opening. name_key: the
        member holding a call's name."""
        calls: list[CallScan] = []
        if i >= len(text):
            return GroupScan(calls, INVALID if final else OPEN, len(text))
        if text[i] != "[" and not single:
            return GroupScan(calls, INVALID, i)
        at = call_array_at if text[i] == "[" else call_object_at
        status, end = at(text, i, final, self.tool_names, calls, self.scan_at, name_key)
        if status == INVALID or status == OPEN:
            return GroupScan(calls, status, end)
        return closing(text, end, tag, final, calls)

    def scanner(self, i: int, kind: Callable[[int], Any]) -> Any:
        """The scanner of the value starting at _buf[i] (made by kind(i) the first time)."""
        found = self._scanners.get(i)
        if found is None:
            found = self._scanners[i] = kind(i)
        return found

    def _consume(self, k: int) -> None:
        """Drop the first k characters of _buf (positions move: the scanners go)."""
        if k:
            self._buf = self._buf[k:]
            self._scanners.clear()

    # ------------------------------------------------------------------ the machine
    def _advance(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while self._buf:
            if not self._in_group:
                start, hold = self.find_group(self._buf)
                if start < 0:
                    cut = len(self._buf) if final else hold
                    self._text(self._buf[:cut], events)
                    self._consume(cut)
                    return events
                self._text(self._buf[:start], events)
                self._consume(start)
                self._in_group, self._group_base = True, len(self._sent)
                self._groups += 1
            scan = self.parse_group(self._buf, final)
            if scan.status == INVALID and len(self._sent) == self._group_base:
                self._in_group = False  # not tool markup: its first character is text, look again after it
                self._text(self._buf[:1], events)
                self._consume(1)
                continue
            self._emit_calls(scan.calls, events)
            if scan.status == OPEN:
                return events
            self._consume(scan.end)  # DONE, or broken after a commit (the broken part dropped)
            self._in_group = False
        return events

    def _emit_calls(self, calls: list[CallScan], events: list[Event]) -> None:
        for k, call in enumerate(calls):
            idx = self._group_base + k
            if idx == len(self._sent):
                self._pending_ws = ""  # whitespace before a call is not content
                self._sent.append([self.call_id(call.name, idx), ""])
                events.append(CallStart(idx, self._sent[idx][0], call.name))
            sent = self._sent[idx][1]
            if len(call.args) > len(sent) and call.args.startswith(sent):
                events.append(CallArgs(idx, call.args[len(sent):]))
                self._sent[idx][1] = call.args

    def _text(self, s: str, events: list[Event]) -> None:
        if not s:
            return
        s = self._pending_ws + s
        body = s.rstrip(_WS)
        self._pending_ws = s[len(body):]
        if body:
            self._any_text = True
            events.append(Text(body))


# ---------------------------------------------------------------------- shared pieces of formats
def call_from_object(text: str, scan: JsonScan, final: bool, names: Optional[set[str]],
                     name_key: str = "name") -> tuple[str, Optional[CallScan]]:
    """A `{"name": ..., "arguments" | "parameters": {...}}` object (name_key: the name's member, Cohere's
    "tool_name") -> (COMPLETE | PARTIAL | INVALID, the call once committed). Streaming commits when the name
    is the first member, complete, and the arguments object has begun right after it; other key orders wait
    for the whole object."""
    if scan.status == INVALID or (scan.start < len(text) and text[scan.start] != "{"):
        return INVALID, None
    if scan.status == COMPLETE:
        obj = json.loads(text[scan.start:scan.end])
        name = obj.get(name_key)
        args = [m for m in scan.members if m.key in ARG_KEYS]
        if not isinstance(name, str) or len(args) > 1 or (names is not None and name not in names):
            return INVALID, None
        if args and not isinstance(obj[args[0].key], dict):
            return INVALID, None
        return COMPLETE, CallScan(name, text[args[0].start:args[0].end] if args else "{}", True)
    if final:
        return INVALID, None  # cut off
    ms = scan.members
    if len(ms) < 2 or ms[0].key != name_key or ms[0].end is None or ms[1].key not in ARG_KEYS or ms[1].start < 0:
        return PARTIAL, None
    name = json.loads(text[ms[0].start:ms[0].end])
    if not isinstance(name, str) or (names is not None and name not in names) or text[ms[1].start] != "{":
        return INVALID, None
    return PARTIAL, CallScan(name, text[ms[1].start:ms[1].end or len(text)], False)


def call_object_at(text: str, i: int, final: bool, names: Optional[set[str]], calls: list[CallScan],
                   scan_at: Callable[[str, int], JsonScan] = scan_json, name_key: str = "name") -> tuple[str, int]:
    """One call object at text[i:] appended to calls once committed -> (COMPLETE, its end) or
    (OPEN, len) or (INVALID, index). scan_at: ToolParser.scan_at while streaming."""
    scan = scan_at(text, i)
    if scan.start >= len(text):
        return (INVALID if final else OPEN), len(text)
    status, call = call_from_object(text, scan, final, names, name_key)
    if call is not None:
        calls.append(call)
    if status == INVALID:
        return INVALID, scan.end
    return (COMPLETE, scan.end) if status == COMPLETE else (OPEN, len(text))


def call_array_at(text: str, i: int, final: bool, names: Optional[set[str]], calls: list[CallScan],
                  scan_at: Callable[[str, int], JsonScan] = scan_json, name_key: str = "name") -> tuple[str, int]:
    """A JSON array of call objects at text[i] == "[" -> (COMPLETE, one past "]") / (OPEN, len) / (INVALID, index)."""
    j = skip_ws(text, i + 1)
    if j < len(text) and text[j] == "]":
        return COMPLETE, j + 1
    while True:
        status, end = call_object_at(text, j, final, names, calls, scan_at, name_key)
        if status != COMPLETE:
            return status, end
        k = skip_ws(text, end)
        if k >= len(text):
            return (INVALID if final else OPEN), len(text)
        if text[k] == "]":
            return COMPLETE, k + 1
        if text[k] != ",":
            return INVALID, k
        j = k + 1


def closing(text: str, i: int, tag: str, final: bool, calls: list[CallScan]) -> GroupScan:
    """After a group's body ending at i: whitespace, then `tag` (accepted missing at the very end)."""
    j = skip_ws(text, i)
    if text.startswith(tag, j):
        return GroupScan(calls, DONE, j + len(tag))
    if j == len(text):
        return GroupScan(calls, DONE, j) if final else GroupScan(calls, OPEN, j)
    if not final and tag.startswith(text[j:]):
        return GroupScan(calls, OPEN, len(text))
    return GroupScan(calls, INVALID, j)


def collect(events: list[Event]) -> ParseResult:
    """Events -> the non-streaming result (content joined, each call's arguments joined)."""
    content: list[str] = []
    calls: list[ToolCall] = []
    for e in events:
        if isinstance(e, Text):
            content.append(e.text)
        elif isinstance(e, CallStart):
            calls.append(ToolCall(e.id, e.name, ""))
        else:
            calls[e.index].arguments += e.text
    return ParseResult("".join(content), calls)


def openai_delta(e: Event) -> dict:
    """One event -> the `delta` of an OpenAI chat.completion.chunk."""
    if isinstance(e, Text):
        return {"content": e.text}
    if isinstance(e, CallStart):
        return {"tool_calls": [{"index": e.index, "id": e.id, "type": "function",
                                "function": {"name": e.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]}
