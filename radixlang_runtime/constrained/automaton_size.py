"""Bounded pre-check: how many automaton states a grammar's regex needs, before outlines-core builds them.

outlines-core (0.2.14) compiles a regex by building its whole byte-level DFA (regex-automata: a
Thompson NFA over bytes, then subset construction, not minimised), then walks every vocabulary token
from every state. It cannot say "too large" before it has done all of that, so a regex bomb such as
`.*a.{20}` (2^21 subset states) used to cost its request the whole compile time limit. Here the same
kind of subset construction runs in pure Python at the level of characters, with these bounds:

- states: past max_states subset states the regex is refused ("needs more than N automaton states").
  A counted repetition x{n,m} of a non-nullable x with m > max_states is refused from the parse alone
  (it has m distinct subset states, see _size), without expanding it;
- positions: counted repetitions are expanded (`x{2,4}` = `xx(x(x)?)?`, nested so that each state
  stays small, as regex-automata compiles them); past MAX_POSITIONS character positions the regex is
  refused (the guard regex_check.MAX_EXPANSION already applies to `regex`, now also on json_schema's);
- work: every unit of work (a position looked at, a follow-set entry written) is counted; past
  MAX_WORK the regex is refused. The counter, not the clock, bounds it, so the verdict is
  deterministic; a wall-clock deadline (DEADLINE_S, only reached on a starved CPU) gives up
  *without* refusing: the compile and its own limits decide then.

Where it runs: compile_index.build_index, in the compile child (worker_child.py), for both kinds (a
json_schema after its conversion to a regex), before outlines-core starts. So it never holds the
server's GIL or the scheduler thread; its refusal reaches the request as any compile error does (the
GrammarHandle's error, an HTTP 400, cached in the error LRU), and the worker's time limit still bounds it.

Why a state-cap refusal is an automaton outlines-core would have to build (invariants):
- The character automaton here is the Glushkov (position) automaton of the regex as Python's
  parser reads it, determinised with a state = (set of positions that may read the next character,
  accepting). regex-automata's determiniser keys its states the same way: by the set of
  character(byte)-reading NFA states after the epsilon closure, plus match-ness; `x+` / `x{n,}` use
  one looping copy of x and `x{n,m}` nested optional copies, as its Thompson compiler does.
- A byte-level DFA of the same regex has at least one state per distinct character-level state
  reachable at a character boundary: the bytes of a UTF-8 character lead from a character-boundary
  state to a character-boundary state, and two inputs whose character-level candidate sets differ
  have byte-level candidate sets that differ (each character position becomes a byte sequence
  automaton of its own). Mid-character states only add to the byte count.
  tests/constrained/test_automaton_size.py checks count <= outlines-core's own index states on random regexes.
- Where the translation loses precision it errs towards fewer states (fewer refusals): Unicode
  classes (`\\p{..}`, the non-ASCII part of `\\d` / `\\w` / `\\s`) become symbols of their own,
  disjoint from every other character, so they overlap nothing and add no nondeterminism; Python's
  parser factors common prefixes of alternatives and merges one-character alternatives into a class,
  as regex-syntax does. A construct Python cannot parse (Rust class set operations `&&` / `--` /
  `~~`, nested classes) skips the check: the compile's limits still bound it.
- outlines-core then walks every vocabulary token from every state of that automaton: its cost grows
  at least with the state count, so MAX_STATES is set where the cheapest states measured (narrow
  classes) already take longer than the compile limit, above every grammar the tests and benchmarks
  use (docs/PERFORMANCE.md, "Grammar pre-check", with the command). Wide states (`.`, JSON strings)
  cost far more each: a grammar under the cap can still meet the compile's time / memory limits.

Torch- and numpy-free.
"""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass, field
from typing import Optional

import re._constants as sre_c
import re._parser as sre_parse

from radixlang_runtime.constrained.regex_dialect import OPAQUE_BASE, Unanalysable, to_python_syntax

MAX_STATES = 20_000  # char-level subset states (see the module docstring and docs/PERFORMANCE.md)
MAX_POSITIONS = 100_000  # character positions after expanding counted repetitions
MAX_WORK = 4_000_000  # positions visited + follow entries written (legit grammars: a few % of it)
DEADLINE_S = 5.0  # wall clock: give up (no verdict) past it; only a starved CPU gets there

_MAXCHAR = 0x110000
_ASCII_DIGIT = [(0x30, 0x3A)]
_ASCII_WORD = [(0x30, 0x3A), (0x41, 0x5B), (0x5F, 0x60), (0x61, 0x7B)]
_ASCII_SPACE = [(0x09, 0x0E), (0x1C, 0x21)]
_CATEGORY = {  # category -> (ASCII ranges, opaque symbol standing for its non-ASCII members)
    sre_c.CATEGORY_DIGIT: (_ASCII_DIGIT, OPAQUE_BASE + 1),
    sre_c.CATEGORY_WORD: (_ASCII_WORD, OPAQUE_BASE + 2),
    sre_c.CATEGORY_SPACE: (_ASCII_SPACE, OPAQUE_BASE + 3),
}
_NOT_CATEGORY = {sre_c.CATEGORY_NOT_DIGIT: sre_c.CATEGORY_DIGIT, sre_c.CATEGORY_NOT_WORD: sre_c.CATEGORY_WORD,
                 sre_c.CATEGORY_NOT_SPACE: sre_c.CATEGORY_SPACE}

Ranges = list[tuple[int, int]]  # half-open [lo, hi) codepoint ranges


class TooLarge(ValueError):
    """The regex is over a bound: `what` names it ("automaton states", ...), `limit` its value."""

    def __init__(self, what: str, limit: int):
        super().__init__(f"more than {limit:,} {what}")
        self.what, self.limit = what, limit


@dataclass
class CharDFA:
    """The bounded subset construction. Character c is in class `alphabet_index(c)` (an index into the
    elementary intervals `bounds`); trans[s] lists (bitmask of classes, next state); state 0 starts."""

    bounds: list[int]  # sorted interval starts; class i = [bounds[i], bounds[i+1])
    trans: list[list[tuple[int, int]]] = field(default_factory=list)
    accepting: list[bool] = field(default_factory=list)
    work: int = 0

    @property
    def num_states(self) -> int:
        return len(self.accepting)

    def alphabet_index(self, ch: str) -> int:
        import bisect

        return bisect.bisect_right(self.bounds, ord(ch)) - 1

    def matches(self, text: str) -> bool:
        s = 0
        for ch in text:
            bit = 1 << self.alphabet_index(ch)
            s = next((t for m, t in self.trans[s] if m & bit), -1)
            if s < 0:
                return False
        return self.accepting[s]


# ----------------------------------------------------------------------------------------- positions
@dataclass
class _Frag:
    first: set[int]
    last: set[int]
    nullable: bool


class _Builder:
    """Glushkov positions of a parsed regex: classes[p] (Ranges), follow[p] (set of positions)."""

    def __init__(self, max_positions: int, max_work: int):
        self.classes: list[Ranges] = []
        self.follow: list[set[int]] = []
        self.max_positions, self.max_work = max_positions, max_work
        self.work = 0

    def spend(self, units: int) -> None:
        self.work += units
        if self.work > self.max_work:
            raise TooLarge("steps to analyse", self.max_work)

    def position(self, ranges: Ranges) -> _Frag:
        if len(self.classes) >= self.max_positions:
            raise TooLarge("character positions after expanding repetitions", self.max_positions)
        self.classes.append(ranges)
        self.follow.append(set())
        p = len(self.classes) - 1
        return _Frag({p}, {p}, False)

    def concat(self, a: _Frag, b: _Frag) -> _Frag:
        self.spend(len(a.last) * len(b.first) + (len(a.first) + len(b.first)) * a.nullable
                   + (len(a.last) + len(b.last)) * b.nullable)
        for p in a.last:
            self.follow[p] |= b.first
        first = a.first | b.first if a.nullable else a.first
        last = a.last | b.last if b.nullable else b.last
        return _Frag(first, last, a.nullable and b.nullable)

    def plus(self, a: _Frag) -> _Frag:
        """a+: one copy of a that may loop back to its start."""
        self.spend(len(a.last) * len(a.first))
        for p in a.last:
            self.follow[p] |= a.first
        return _Frag(a.first, a.last, a.nullable)

    def seq(self, items: list, flags: int) -> _Frag:
        frag = _Frag(set(), set(), True)
        for op, av in items:
            frag = self.concat(frag, self.node(op, av, flags))
        return frag

    def node(self, op, av, flags: int) -> _Frag:
        if op in (sre_c.LITERAL, sre_c.NOT_LITERAL, sre_c.IN, sre_c.ANY):
            return self.position(_ranges(op, av, flags))
        if op is sre_c.SUBPATTERN:
            _group, add, rem, sub = av
            return self.seq(sub, (flags | add) & ~rem)
        if op is sre_c.ATOMIC_GROUP:
            return self.seq(av, flags)
        if op is sre_c.BRANCH:  # the union built in place: linear in the alternatives
            frag = _Frag(set(), set(), False)
            for sub in av[1]:
                f = self.seq(sub, flags)
                self.spend(len(f.first) + len(f.last))
                frag.first |= f.first
                frag.last |= f.last
                frag.nullable |= f.nullable
            return frag
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, sre_c.POSSESSIVE_REPEAT):
            lo, hi, sub = av
            return self.repeat(lo, hi, sub, flags)
        raise Unanalysable(f"regex construct {op}")

    def repeat(self, lo: int, hi, sub: list, flags: int) -> _Frag:
        frag = _Frag(set(), set(), True)
        if hi is sre_c.MAXREPEAT:  # x{n,} = x^(n-1) x+, one looping copy (regex-automata compiles it so)
            for _ in range(lo - 1):
                frag = self.concat(frag, self.seq(sub, flags))
            loop = self.plus(self.seq(sub, flags))
            return self.concat(frag, loop if lo else _Frag(loop.first, loop.last, True))
        for _ in range(lo):
            frag = self.concat(frag, self.seq(sub, flags))
        if hi == lo:
            return frag
        # x{0,k} as (x(x(...)?)?)?: copy i+1 follows copy i only, and every copy may end it (linear size
        # when x is not nullable; a nullable x takes the general path, bounded by the work count)
        first = self.seq(sub, flags)
        if first.nullable:
            tail = first
            for _ in range(hi - lo - 1):
                tail = self.concat(self.seq(sub, flags), tail)
            return self.concat(frag, _Frag(tail.first, tail.last, True))
        prev, last = first, set(first.last)
        for _ in range(hi - lo - 1):
            cur = self.seq(sub, flags)
            self.spend(len(prev.last) * len(cur.first) + len(cur.last))
            for p in prev.last:
                self.follow[p] |= cur.first
            last |= cur.last
            prev = cur
        return self.concat(frag, _Frag(first.first, last, True))


def _nullable(items) -> bool:
    for op, av in items:
        if op is sre_c.SUBPATTERN:
            ok = _nullable(av[3])
        elif op is sre_c.ATOMIC_GROUP:
            ok = _nullable(av)
        elif op is sre_c.BRANCH:
            ok = any(_nullable(sub) for sub in av[1])
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, sre_c.POSSESSIVE_REPEAT):
            ok = av[0] == 0 or _nullable(av[2])
        else:
            ok = op is sre_c.AT
        if not ok:
            return False
    return True


def _size(items, max_states: int) -> int:
    """Positions the parsed regex expands to (counted repetitions multiplied out), before building any.
    Raises TooLarge("automaton states") for a counted repetition x{n,m} (x{n,}) of a non-nullable x with
    m (n) > max_states: after i = 0..m-1 shortest copies of x the candidates hold copy i+1's first positions
    and no later copy's, so the subset construction has m distinct states (regex-automata's too: it
    compiles one NFA copy per count; x matchable and the repetition reachable assumed)."""
    total = 0
    for op, av in items:
        if op in (sre_c.LITERAL, sre_c.NOT_LITERAL, sre_c.IN, sre_c.ANY):
            total += 1
        elif op is sre_c.SUBPATTERN:
            total += _size(av[3], max_states)
        elif op is sre_c.ATOMIC_GROUP:
            total += _size(av, max_states)
        elif op is sre_c.BRANCH:
            total += sum(_size(sub, max_states) for sub in av[1])
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, sre_c.POSSESSIVE_REPEAT):
            lo, hi, sub = av
            copies = lo + 1 if hi is sre_c.MAXREPEAT else max(hi, 1)
            if (lo if hi is sre_c.MAXREPEAT else hi) > max_states and not _nullable(sub):
                raise TooLarge("automaton states", max_states)
            total += copies * _size(sub, max_states)
    return total


def _ranges(op, av, flags: int) -> Ranges:
    """One character position's class as sorted, disjoint half-open ranges."""
    icase = bool(flags & sre_c.SRE_FLAG_IGNORECASE)
    if op is sre_c.ANY:
        if flags & sre_c.SRE_FLAG_DOTALL:
            return [(0, _MAXCHAR)]
        return [(0, 10), (11, _MAXCHAR)]
    items = [(op, av)] if op is not sre_c.IN else av
    negate = bool(items) and items[0][0] is sre_c.NEGATE
    if op is sre_c.NOT_LITERAL:
        negate, items = True, [(sre_c.LITERAL, av)]
    out: Ranges = []
    for iop, iav in items:
        if iop is sre_c.LITERAL:
            out.append((iav, iav + 1))
        elif iop is sre_c.RANGE:
            out.append((iav[0], iav[1] + 1))
        elif iop is sre_c.CATEGORY:
            if iav in _CATEGORY:
                ascii_part, sym = _CATEGORY[iav]
                out.extend(ascii_part + [(sym, sym + 1)])
            elif iav in _NOT_CATEGORY:
                ascii_part, sym = _CATEGORY[_NOT_CATEGORY[iav]]
                out.extend(_complement(_normalise(ascii_part + [(sym, sym + 1)])))
            else:
                raise Unanalysable(f"category {iav}")
        elif iop is not sre_c.NEGATE:
            raise Unanalysable(f"class item {iop}")
    if icase:
        out.extend(_case_variants(out))
    out = _normalise(out)
    return _complement(out) if negate else out


def _case_variants(ranges: Ranges) -> Ranges:
    extra: Ranges = []
    for lo, hi in ranges:
        for a, b, delta in ((0x41, 0x5B, 32), (0x61, 0x7B, -32)):  # ASCII letters (what JSON grammars use)
            s, e = max(lo, a), min(hi, b)
            if s < e:
                extra.append((s + delta, e + delta))
    return extra


def _normalise(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges: Ranges) -> Ranges:
    out, at = [], 0
    for lo, hi in ranges:
        if lo > at:
            out.append((at, lo))
        at = hi
    if at < _MAXCHAR:
        out.append((at, _MAXCHAR))
    return out


# ----------------------------------------------------------------------------------------- determinise
def _masks(classes: list[Ranges]) -> tuple[list[int], list[int]]:
    """Elementary intervals over every class boundary -> (their starts, each class as a bitmask of them)."""
    import bisect

    bounds = sorted({0} | {b for rs in classes for r in rs for b in r if b < _MAXCHAR})
    masks = []
    for rs in classes:
        m = 0
        for lo, hi in rs:
            i, j = bisect.bisect_left(bounds, lo), bisect.bisect_left(bounds, hi)
            m |= ((1 << (j - i)) - 1) << i
        masks.append(m)
    return bounds, masks


def determinize(regex: str, max_states: int = MAX_STATES, max_positions: int = MAX_POSITIONS,
                max_work: int = MAX_WORK, deadline_s: float = DEADLINE_S) -> CharDFA:
    """The character-level DFA of `regex` (Rust syntax, whole-string match). TooLarge past a bound,
    Unanalysable when it has no verdict."""
    t_end = time.monotonic() + deadline_s
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = sre_parse.parse(to_python_syntax(regex))
    except (re.error, RecursionError, OverflowError, ValueError) as e:
        if isinstance(e, TooLarge):
            raise
        raise Unanalysable(f"parse: {e}") from None
    b = _Builder(max_positions, max_work)
    try:
        if _size(parsed, max_states) > max_positions:
            raise TooLarge("character positions after expanding repetitions", max_positions)
        root = b.seq(list(parsed), parsed.state.flags)
    except RecursionError:
        raise Unanalysable("nested too deeply") from None
    bounds, masks = _masks(b.classes)
    lasts = root.last
    dfa = CharDFA(bounds)
    ids: dict[tuple[frozenset[int], bool], int] = {}
    todo: list[frozenset[int]] = []

    def state(cands: frozenset[int], acc: bool) -> int:
        key = (cands, acc)
        s = ids.get(key)
        if s is None:
            if len(ids) >= max_states:
                raise TooLarge("automaton states", max_states)
            s = ids[key] = len(ids)
            dfa.accepting.append(acc)
            dfa.trans.append([])
            todo.append(cands)
        return s

    state(frozenset(root.first), root.nullable)
    done = 0
    while done < len(todo):
        if (done & 63) == 0 and time.monotonic() > t_end:
            raise Unanalysable("deadline")
        cands, s = todo[done], done
        done += 1
        groups: dict[int, list[int]] = {}
        for p in cands:
            groups.setdefault(masks[p], []).append(p)
        parts: list[tuple[int, list[int]]] = []  # refine: disjoint masks, each with the positions reading it
        for m, ps in groups.items():
            b.spend(len(ps) + len(parts))
            new, rest = [], m
            for am, aps in parts:
                inter = am & m
                if inter:
                    new.append((inter, aps + ps))
                    if am & ~m:
                        new.append((am & ~m, aps))
                    rest &= ~am
                else:
                    new.append((am, aps))
            if rest:
                new.append((rest, ps))
            parts = new
        for m, ps in parts:
            nxt: set[int] = set()
            for p in ps:
                nxt |= b.follow[p]
            b.spend(len(nxt))
            dfa.trans[s].append((m, state(frozenset(nxt), not lasts.isdisjoint(ps))))
    dfa.work = b.work
    return dfa


def check_automaton_size(regex: str, what: str, max_states: int = MAX_STATES) -> Optional[CharDFA]:
    """Raise ValueError ("grammar too large: <what> needs more than N automaton states (limit N) ...")
    when `regex` is over a bound; the DFA when it is within them; None when there is no verdict."""
    try:
        return determinize(regex, max_states)
    except TooLarge as e:
        raise ValueError(f"grammar too large: {what} needs {e} (limit {e.limit:,}); refused before "
                         "compiling: outlines-core builds the whole automaton before its limits can stop it") from None
    except (Unanalysable, RecursionError):
        return None
    except MemoryError:
        raise  # the compile child's memory cap: answered as "compile exceeded N GiB of memory"
    except Exception:  # noqa: BLE001 - a construct this model gets wrong must not cost the grammar its compile
        return None
