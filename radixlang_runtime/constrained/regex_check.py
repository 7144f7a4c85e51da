"""Python-side regex checks, run before a regex goes anywhere near a compiler.

outlines-core builds a byte-level DFA with Rust's `regex` syntax: no look-around, no backreferences,
no word boundaries, and the whole output must match (anchors are implicit). Its own errors are often
unhelpful ("Failed to build DFA error building NFA"), so the common mistakes are named here, with
their position. The scan is a single pass over the pattern (no Python `re` dialect involved: Python
rejects Rust-only syntax such as `\\p{L}` and accepts look-around that Rust refuses).

Also estimated here: how far counted repetitions expand (`a{1000}{1000}` -> ~1,000,000 copies);
past MAX_EXPANSION the grammar is refused before a worker spends its time and memory limits on it.
Whatever slips through is still bounded by the compile worker's limits.

This module is the one regex / dtype validator of the project: the runtime (GrammarSpec) and the DSL
(`radixlang/ir.py`: gen(regex=...) and gen(dtype=...)) both use check_regex and DTYPE_REGEX, so the DSL
accepts exactly the runtime's dialect (`\\p{L}` included). Torch-free: it imports only `re`.
"""

from __future__ import annotations

import re

# The DSL's dtype regexes (SGLang's sglang/lang/ir.py), matched against the whole generated text.
DTYPE_REGEX = {
    "int": r"[-+]?[0-9]+[ \n]*",
    "float": r"[-+]?[0-9]*\.?[0-9]+[ \n]*",
    "bool": r"(True|False)",
    "str": r"\"[\w\d\s]*\"",
}
NUMBER_DTYPES = ("int", "float")  # their text also ends at a space / newline (the DSL adds those stops)

MAX_REGEX_CHARS = 128 * 1024
MAX_EXPANSION = 100_000  # estimated atoms after expanding counted repetitions


def _fail(msg: str, pattern: str, pos: int) -> ValueError:
    shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
    return ValueError(f"invalid regex: {msg} at position {pos} in {shown!r}")


def _too_large(pos: int) -> ValueError:
    return ValueError(f"grammar too large: counted repetitions in the regex expand to more than "
                      f"{MAX_EXPANSION:,} items (at position {pos})")


def _strip_anchors(p: str) -> str:
    if p.startswith("^"):
        p = p[1:]
    if p.endswith("$"):
        backslashes = len(p[:-1]) - len(p[:-1].rstrip("\\"))
        if backslashes % 2 == 0:
            p = p[:-1]
    return p


def _class_end(p: str, i: int) -> int:
    """p[i] == '[': index just past the matching ']' (Rust allows nested classes like [a-z&&[^x]])."""
    depth, j, n = 0, i, len(p)
    while j < n:
        c = p[j]
        if c == "\\":
            j += 2
            continue
        if c == "[":
            depth += 1
            j += 1
            if j < n and p[j] == "^":
                j += 1
            if j < n and p[j] == "]":  # a leading ']' is literal
                j += 1
            continue
        if c == "]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise _fail("unterminated character class '['", p, i)


_QUANT = re.compile(r"\{(\d+)(,(\d*))?\}")
_LOOK = {"(?=": "look-ahead (?=...)", "(?!": "negative look-ahead (?!...)", "(?<=": "look-behind (?<=...)",
         "(?<!": "negative look-behind (?<!...)", "(?>": "atomic group (?>...)", "(?(": "conditional (?(...)",
         "(?P=": "backreference (?P=name)", "(?#": "comment group (?#...)"}


def check_regex(pattern: str) -> str:
    """Returns the pattern ready for outlines-core (outer ^ / $ removed); ValueError naming the problem."""
    if not isinstance(pattern, str):
        raise ValueError(f"regex must be a string, got {type(pattern).__name__}")
    if len(pattern) > MAX_REGEX_CHARS:
        raise ValueError(f"regex too long: {len(pattern)} characters (limit {MAX_REGEX_CHARS})")
    p = _strip_anchors(pattern)
    frames: list[list[int]] = [[0, 0]]  # per open group: [sum of item sizes, size of the last item]
    opens: list[int] = []
    i, n = 0, len(p)
    while i < n:
        c = p[i]
        if c == "\\":
            if i + 1 >= n:
                raise _fail("trailing backslash", p, i)
            e = p[i + 1]
            if e in "123456789" or (e == "k" and p[i + 2: i + 3] in ("<", "{", "'")):
                raise _fail(f"backreference \\{e} is not supported", p, i)
            if e in "bB<>":
                raise _fail(f"word boundary \\{e} is not supported", p, i)
            if e in "AzZG":
                raise _fail(f"anchor \\{e} is not supported (the whole output always matches)", p, i)
            j = i + 2
            if e in "pPxu" and j < n and p[j] == "{":
                k = p.find("}", j)
                if k < 0:
                    raise _fail(f"unterminated \\{e}{{...}}", p, i)
                j = k + 1
            frames[-1][0] += 1
            frames[-1][1] = 1
            i = j
            continue
        if c == "[":
            i = _class_end(p, i)
            frames[-1][0] += 1
            frames[-1][1] = 1
            continue
        if c == "(":
            for prefix, what in _LOOK.items():
                if p.startswith(prefix, i):
                    raise _fail(f"{what} is not supported", p, i)
            opens.append(i)
            frames.append([0, 0])
            i += 1
            continue
        if c == ")":
            if not opens:
                raise _fail("unbalanced ')'", p, i)
            opens.pop()
            size = max(frames.pop()[0], 1)
            frames[-1][0] += size
            frames[-1][1] = size
            i += 1
            continue
        if c in "^$":
            raise _fail(f"anchor '{c}' inside the pattern is not supported (the whole output always matches)", p, i)
        if c == "{":
            m = _QUANT.match(p, i)
            if m:
                lo, hi = int(m.group(1)), m.group(3)
                count = max(lo, int(hi) if hi else lo, 1)
                f = frames[-1]
                f[0] += f[1] * (count - 1)
                f[1] *= count
                if f[0] > MAX_EXPANSION:
                    raise _too_large(i)
                i = m.end()
                continue
        if c == "|":
            i += 1
            continue
        if c not in "*+?":
            frames[-1][0] += 1
            frames[-1][1] = 1
        i += 1
    if opens:
        raise _fail("missing ')' for the group opened", p, opens[-1])
    if frames[0][0] > MAX_EXPANSION:
        raise _too_large(n)
    return p


def dtype_name(dtype: object) -> str:
    """A dtype as the DSL takes it (int, float, bool, str, or their names) -> its DTYPE_REGEX key;
    ValueError naming the allowed ones."""
    name = dtype.__name__ if dtype in (int, float, bool, str) else dtype
    if not isinstance(name, str) or name not in DTYPE_REGEX:
        raise ValueError(f"unknown dtype {dtype!r} (int | float | bool | str)")
    return name


def describe_compile_error(pattern: str, message: str) -> str:
    """A compiler error on `pattern` -> text for the client; adds Python's parse error when it has one
    (it names the position; outlines-core's often does not)."""
    try:
        re.compile(pattern)
    except re.error as e:
        return f"invalid regex: {e} (outlines-core: {message})"
    except Exception:  # noqa: BLE001 - only a better message is at stake
        pass
    return f"invalid regex: {message}"
