"""stop_regex in RE2 (google-re2, module `re2`): linear time, checked and bounded at intake. Torch-free.

The runtime speaks one regex dialect, RE2's, which is the Rust `regex` crate's (what outlines-core
compiles for `regex` / `json_schema`): no backreferences, no look-around. RE2 runs in time linear in the
text, so no pattern can make the scheduler backtrack; Python's `re` is never used on a stop_regex (a
`re2` module that is not google-re2, e.g. one that falls back to `re`, is refused at import).

Limits (a request over one gets a ValueError naming it, HTTP 400):
  stop strings       at most limits.MAX_STOP_STRINGS, each at most MAX_STOP_CHARS characters
  stop_regex         at most MAX_STOP_REGEX patterns, each at most MAX_STOP_CHARS characters; each compiled
                     under RE2's max_mem = STOP_REGEX_MAX_MEM (program and DFA cache); the request's
                     compiled programs together at most STOP_REGEX_MAX_PROGRAM RE2 instructions
The scan a step costs is one RE2 search a pattern over the window text (stop_check.py: at most
STOP_REGEX_WINDOW tokens and STOP_REGEX_WINDOW_CHARS characters), linear in the text times a factor
bounded by the program size.

What a stop is (first_stop), as the Python `re` scan before it: the first match, in finditer order
(leftmost-first, non-overlapping, from the window's start), that is non-empty and ends inside the
newest token's text. Cost: one RE2 search for "does any match end in the newest text" (the pattern
followed by at most k characters to the end; nearly every step ends there); only when one does, the
finditer steps, at most MAX_SCAN_MATCHES of them, after which the earliest start with a match that ends
in the newest text wins. Where the pattern prefers the empty match at a start, the non-empty retry
takes the shortest match (Python's re takes the preferred one; they agree for lazy patterns).
Assertions (`\\b`, `$`) see the whole window text.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional

import re2

MAX_STOP_REGEX = 16
MAX_STOP_CHARS = 1024  # per stop string and per stop_regex pattern
STOP_REGEX_MAX_MEM = 4 << 20  # bytes, RE2's per-pattern budget (its default is 8 MiB)
STOP_REGEX_MAX_PROGRAM = 4096  # RE2 instructions, all of one request's patterns together
MAX_NEWEST_CHARS = 256  # a newest token's text longer than this: only its last 256 characters are "newest"
EMPTY_RETRY_CHARS = 16  # a start whose preferred match is empty: the shortest non-empty one this long, or longest
MAX_SCAN_MATCHES = 64  # finditer steps first_stop takes; past them, any start whose match ends in the newest text

_DIALECT = "the runtime's regex dialect (RE2 / Rust regex syntax)"

if "max_mem" not in getattr(getattr(re2, "Options", None), "NAMES", ()):  # e.g. pyre2, which falls back to `re`
    raise ImportError("radixlang_runtime needs google-re2 (pip install google-re2): the installed `re2` module "
                      f"({getattr(re2, '__file__', '?')}) is another package")


def _options(capture: bool, longest: bool = False) -> Any:
    o = re2.Options()
    o.max_mem = STOP_REGEX_MAX_MEM
    o.never_capture = not capture
    o.longest_match = longest
    o.log_errors = False  # errors come back as exceptions; RE2 would also print them to stderr
    return o


def _compile(text: str, capture: bool = False, longest: bool = False) -> Any:
    """RE2-compiled `text`; re2.error when RE2 refuses it. Never a backtracking engine."""
    rx = re2.compile(text, _options(capture, longest))
    if type(rx).__module__.split(".")[0] != "re2" or not hasattr(rx, "programsize"):
        raise RuntimeError(f"re2.compile returned {type(rx).__name__}, not an RE2 program")
    return rx


def _shown(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 80 else pattern[:77] + "...")


def _unsupported_escape(pattern: str) -> Optional[str]:
    """\\Q...\\E and \\C are RE2-only (not Rust): \\Q would swallow the wrapping first_stop adds."""
    i = 0
    while i < len(pattern) - 1:
        if pattern[i] == "\\":
            if pattern[i + 1] in "QC":
                return "\\" + pattern[i + 1]
            i += 2
        else:
            i += 1
    return None


# RE2's error texts for constructs only a backtracking engine has (backreferences, look-around,
# atomic groups, conditionals)
_BACKTRACKING_ONLY = tuple(f"invalid escape sequence: \\{c}" for c in "123456789kg") + tuple(
    f"invalid perl operator: {op}" for op in ("(?=", "(?!", "(?<=", "(?<!", "(?P", "(?>", "(?("))


def _refusal(pattern: str, error: str) -> ValueError:
    shown = _shown(pattern)
    if error.startswith(_BACKTRACKING_ONLY):
        return ValueError(f"stop_regex {shown} is not supported: backreferences and lookaround are not in "
                          f"{_DIALECT} ({error})")
    if "pattern too large" in error:
        return ValueError(f"stop_regex {shown} is too large: its compiled program exceeds "
                          f"{STOP_REGEX_MAX_MEM >> 20} MiB")
    return ValueError(f"stop_regex {shown} is not a valid regular expression in {_DIALECT}: {error}")


@dataclass(frozen=True)
class StopRegex:
    pattern: str
    rx: Any  # the RE2 program of `pattern` (no captures)

    @property
    def program_size(self) -> int:
        return self.rx.programsize


@functools.lru_cache(maxsize=1024)
def compile_stop_regex(pattern: str) -> StopRegex:
    """One stop_regex checked and compiled (cached per process); ValueError naming it when refused."""
    if len(pattern) > MAX_STOP_CHARS:
        raise ValueError(f"stop_regex {_shown(pattern)} is too long: {len(pattern):,} characters "
                         f"(limit {MAX_STOP_CHARS:,})")
    bad = _unsupported_escape(pattern)
    if bad is not None:
        raise ValueError(f"stop_regex {_shown(pattern)} is not supported: {bad} is not in {_DIALECT}")
    try:
        rx = _compile(pattern)
    except re2.error as e:
        msg = e.args[0] if e.args else str(e)
        raise _refusal(pattern, msg.decode("utf-8", "replace") if isinstance(msg, bytes) else str(msg)) from None
    return StopRegex(pattern, rx)


def check_stops(stop_strs: list[str], stop_regex: list[str]) -> list[StopRegex]:
    """The per-request limits on stop strings' lengths and on stop_regex (their count: SamplingParams.validate,
    limits.MAX_STOP_STRINGS); the patterns compiled. ValueError (HTTP 400)."""
    for s in stop_strs:
        if len(s) > MAX_STOP_CHARS:
            raise ValueError(f"stop: a stop string is at most {MAX_STOP_CHARS:,} characters, got {len(s):,}")
    if len(stop_regex) > MAX_STOP_REGEX:
        raise ValueError(f"stop_regex: at most {MAX_STOP_REGEX} patterns, got {len(stop_regex)}")
    compiled = [compile_stop_regex(r) for r in stop_regex]
    total = sum(c.program_size for c in compiled)
    if total > STOP_REGEX_MAX_PROGRAM:
        raise ValueError(f"stop_regex: the patterns compile to {total:,} RE2 instructions together "
                         f"(limit {STOP_REGEX_MAX_PROGRAM:,}); use fewer or simpler patterns")
    return compiled


@functools.lru_cache(maxsize=128)
def _ending_within(pattern: str, k: int, capture: bool) -> Any:
    """`pattern` followed by at most k characters up to the end of the text: its matches are the
    pattern's matches ending in the last k + 1 positions. capture: group 1 is the pattern's match.
    Cannot be refused: pattern compiled alone, and the tail adds ~7 instructions a character."""
    head = f"({pattern})" if capture else f"(?:{pattern})"
    return _compile(f"{head}(?s:.){{0,{k}}}\\z", capture)


@functools.lru_cache(maxsize=128)
def _longest(pattern: str) -> Any:
    return _compile(pattern, longest=True)


def _preferred(stop: StopRegex, text: str, m: Any) -> tuple[int, str]:
    """(end, text) of `m`, the pattern's leftmost-first match at its start s. When that is empty, a
    non-empty one from s, as Python's finditer retries there: the shortest within EMPTY_RETRY_CHARS
    (what a lazy `.*?` gives), else the longest; (s, "") when there is none."""
    s = m.start()
    if m.end() > s:
        return m.end(), m.group()
    for e in range(s + 1, min(len(text), s + EMPTY_RETRY_CHARS) + 1):
        if stop.rx.fullmatch(text, s, e) is not None:
            return e, text[s:e]
    longest = _longest(stop.pattern).match(text, s)
    return (s, "") if longest is None else (longest.end(), longest.group())


def first_stop(stop: StopRegex, text: str, newest_from: int) -> Optional[tuple[int, str]]:
    """(start, matched text) of the stop ending after text[:newest_from], or None (module docstring).
    One RE2 search when no match ends in the newest text (nearly every step); else at most
    MAX_SCAN_MATCHES finditer steps, then at most k + 2 searches."""
    k = len(text) - newest_from - 1
    if k < 0:
        return None
    scan = _ending_within(stop.pattern, k, False)
    if scan.search(text) is None:
        return None
    pos = 0
    for _ in range(MAX_SCAN_MATCHES):  # Python's finditer order: leftmost-first, non-overlapping
        m = stop.rx.search(text, pos)
        if m is None:
            return None
        s = m.start()
        end, matched = _preferred(stop, text, m)
        if end > max(s, newest_from):
            return s, matched
        pos = end if end > s else s + 1
        if pos > len(text):
            return None
    while pos <= len(text):  # past MAX_SCAN_MATCHES: the next start with a match ending in the newest text
        m = scan.search(text, pos)
        if m is None:
            return None
        s = m.start()
        g = _ending_within(stop.pattern, k, True).match(text, s)  # the preferred one of those
        if g is not None and g.end(1) > g.start(1):
            return s, g.group(1)
        pos = s + 1  # only the empty match: s is in the newest text, so at most k + 1 of these
    return None
