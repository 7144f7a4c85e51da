"""The shape of a grammar, for the cost pre-check (grammar_cost.py): GBNF text or a regex -> rules of Nodes.
Torch- and numpy-free.

A Node keeps only what the cost model reads: literal lengths (bytes), one-character items, rule
references, sequences, alternatives and repetitions with their bounds. Parsing is linear in the text
and never expands anything (a repetition `x{0,50}` stays one node). Text this parser cannot read
raises Unreadable: the check is then skipped and the backend's own parser answers (its error names the
problem); the backend's limits and the step budget (step_guard.py) still hold.

GBNF as xgrammar / llguidance read it: `name ::= body` rules (a new rule starts where an identifier is
followed by `::=`), `#` comments, "literals" with escapes, [classes], `.`, ( groups ), `|`, and the
quantifiers `* + ? {m} {m,} {m,n}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

Node = Union["Lit", "Char", "Ref", "Seq", "Alt", "Rep"]


@dataclass(frozen=True)
class Lit:
    nbytes: int  # a fixed string of this many UTF-8 bytes (0: the empty string)


@dataclass(frozen=True)
class Char:
    pass  # one character out of a class (or `.`)


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Seq:
    items: tuple


@dataclass(frozen=True)
class Alt:
    options: tuple


@dataclass(frozen=True)
class Rep:
    lo: int
    hi: Optional[int]  # None: unbounded
    body: "Node"

    def text(self) -> str:
        if self.hi is None:
            return "*" if self.lo == 0 else "+" if self.lo == 1 else f"{{{self.lo},}}"
        return f"{{{self.lo},{self.hi}}}"


class Unreadable(ValueError):
    pass


# ----------------------------------------------------------------------------------------------- GBNF
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


class _Ebnf:
    def __init__(self, text: str):
        self.s, self.i = text, 0

    def _skip(self, newlines: bool = True) -> None:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == "#":
                while self.i < len(s) and s[self.i] != "\n":
                    self.i += 1
            elif c in " \t\r" or (newlines and c == "\n"):
                self.i += 1
            else:
                return

    def _name(self) -> str:
        j = self.i
        while j < len(self.s) and self.s[j] in _NAME_CHARS:
            j += 1
        if j == self.i:
            raise Unreadable(f"expected a rule name at offset {self.i}")
        name, self.i = self.s[self.i:j], j
        return name

    def _rule_starts(self) -> bool:
        """An identifier followed by ::= starts here."""
        j = self.i
        while j < len(self.s) and self.s[j] in _NAME_CHARS:
            j += 1
        if j == self.i:
            return False
        while j < len(self.s) and self.s[j] in " \t\r\n":
            j += 1
        return self.s.startswith("::=", j)

    def rules(self) -> dict[str, Node]:
        out: dict[str, Node] = {}
        self._skip()
        while self.i < len(self.s):
            name = self._name()
            self._skip()
            if not self.s.startswith("::=", self.i):
                raise Unreadable(f"expected ::= after {name}")
            self.i += 3
            out[name] = self._alt()
            self._skip()
        return out

    def _alt(self) -> Node:
        options = [self._seq()]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            options.append(self._seq())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def _seq(self) -> Node:
        items: list[Node] = []
        while True:
            self._skip()
            if self.i >= len(self.s) or self.s[self.i] in "|)" or self._rule_starts():
                break
            items.append(self._postfix(self._atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def _atom(self) -> Node:
        s, c = self.s, self.s[self.i]
        if c == '"':
            return Lit(len(self._quoted('"').encode("utf-8")))
        if c == "[":
            self._quoted("]", start="[")
            return Char()
        if c == ".":
            self.i += 1
            return Char()
        if c == "(":
            self.i += 1
            inner = self._alt()
            self._skip()
            if self.i >= len(s) or s[self.i] != ")":
                raise Unreadable("unclosed (")
            self.i += 1
            return inner
        return Ref(self._name())

    def _quoted(self, end: str, start: str = '"') -> str:
        s, j, out = self.s, self.i + len(start), []
        while j < len(s) and s[j] != end:
            if s[j] == "\\":
                out.append(s[j:j + 2])  # an escape counts as one character (\x41, \u0041: a little short)
                j += 2
                continue
            out.append(s[j])
            j += 1
        if j >= len(s):
            raise Unreadable(f"unclosed {start}")
        self.i = j + 1
        return "".join(x if len(x) == 1 else "?" for x in out)

    def _postfix(self, node: Node) -> Node:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in "*+?":
                self.i += 1
                node = Rep(0 if c != "+" else 1, None if c != "?" else 1, node)
            elif c == "{":
                j = s.find("}", self.i)
                if j < 0:
                    raise Unreadable("unclosed {")
                lo, comma, hi = s[self.i + 1:j].partition(",")
                try:
                    lo_n = int(lo.strip() or 0)
                    hi_n = lo_n if not comma else (int(hi.strip()) if hi.strip() else None)
                except ValueError:
                    raise Unreadable("bad repetition bounds") from None
                self.i = j + 1
                node = Rep(lo_n, hi_n, node)
            else:
                return node
        return node


def ebnf_rules(text: str) -> dict[str, Node]:
    """GBNF text -> {rule name: Node}. Unreadable when this parser cannot read it."""
    rules = _Ebnf(text).rules()
    if "root" not in rules:
        raise Unreadable("no root rule")
    return rules


# ---------------------------------------------------------------------------------------------- regex
def regex_rules(regex: str) -> dict[str, Node]:
    """A regex (the backends' Rust dialect) -> {"root": Node}. Unreadable when Python's parser cannot read it."""
    import warnings

    import re._constants as c
    import re._parser as sre_parse

    from radixlang_runtime.constrained.regex_dialect import to_python_syntax

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = sre_parse.parse(to_python_syntax(regex))
    except Exception as e:  # noqa: BLE001 - any construct Python's parser refuses: no verdict
        raise Unreadable(str(e)) from None

    def seq(items) -> Node:
        out: list[Node] = []
        run = 0
        for op, av in items:
            if op is c.LITERAL:
                run += len(chr(av).encode("utf-8", "surrogatepass"))
                continue
            if run:
                out.append(Lit(run))
                run = 0
            out.append(one(op, av))
        if run:
            out.append(Lit(run))
        return out[0] if len(out) == 1 else Seq(tuple(out))

    def one(op, av) -> Node:
        if op is c.BRANCH:
            return Alt(tuple(seq(b) for b in av[1]))
        if op is c.SUBPATTERN:
            return seq(av[-1])
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            lo, hi, body = av
            return Rep(lo, None if hi == c.MAXREPEAT else hi, seq(body))
        if op in (c.AT, c.ASSERT, c.ASSERT_NOT):
            return Lit(0)
        return Char()

    return {"root": seq(parsed)}
