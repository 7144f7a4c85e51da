"""The cost pre-check of the context-free backends (xgrammar, llguidance): what their matchers find
expensive per token, refused before compiling. Torch- and numpy-free; bounded and deterministic (one
pass over the grammar's shape, grammar_shape.py, never expanding a repetition).

The constructs and their limits (a refusal is a ValueError, an HTTP 400 naming the construct and the limit):
- nested counted repetition: the product of the upper bounds of counted repetitions nested in one
  another (through rule references too) over MAX_REPEAT_PRODUCT. `(("a"{0,50}){0,50}){0,50}` is
  125,000 alternatives of the same string: xgrammar's Earley predictor enumerates them per token.
- repetition of a part that can match nothing (`(a*)*`, `("a"{0,50}){0,50}`) or of a repetition
  (`(a+)+`): every split of the input is a parse, the parser keeps all of them.
- ambiguous recursion: a rule whose alternatives reference the rule itself twice or more, in two or
  more alternatives (`e ::= e "+" e | e "*" e | n`) or in a rule that can match nothing
  (`s ::= s s | [a-z] | ""`): the number of parses grows exponentially with the output.
  Direct self-reference only (indirect ambiguity is left to the step budget, step_guard.py).
- literal size: a string literal over MAX_LITERAL_BYTES (a long forced string is decoded one
  jump-forward window at a time; a grammar that is mostly one literal belongs in the prompt).
Regexes get the literal and product checks on both backends; the nested-repetition check on xgrammar
only (llguidance lexes regexes with a DFA, for which `(a*)*` is as cheap as `a*`; so does outlines,
which has automaton_size.py instead). What the model cannot read (Unreadable) is not refused here.
"""

from __future__ import annotations

from typing import Optional

from radixlang_runtime.constrained.grammar_shape import (Alt, Char, Lit, Node, Ref, Rep, Seq, Unreadable,
                                                         ebnf_rules, regex_rules)

MAX_REPEAT_PRODUCT = 10_000  # product of nested counted repetitions' upper bounds
MAX_LITERAL_BYTES = 2048  # one string literal (a forced byte costs the matcher a mask in jump-forward)
MAX_RULES = 10_000  # rules looked at (a larger grammar is left to the backend's own limits)


class TooExpensive(ValueError):
    pass


def check_ebnf_cost(text: str, what: str) -> None:
    """ValueError naming the construct and the limit when the GBNF grammar is over one."""
    try:
        rules = ebnf_rules(text)
    except (Unreadable, RecursionError):
        return
    _check(rules, what, nested=True, recursion=True)


def check_regex_cost(regex: str, what: str, nested: bool) -> None:
    """The regex form (regex and json_schema kinds); `nested`: refuse nested repetitions (xgrammar)."""
    try:
        rules = regex_rules(regex)
    except (Unreadable, RecursionError):
        return
    _check(rules, what, nested=nested, recursion=False)


def _check(rules: dict[str, Node], what: str, nested: bool, recursion: bool) -> None:
    if len(rules) > MAX_RULES:
        return
    try:
        model = _Model(rules)
        for name, node in rules.items():
            model.walk(node, name, nested)
            if recursion:
                model.recursion(name, node)
        model.product("root", set())
    except TooExpensive as e:
        raise ValueError(f"grammar too expensive: {what} has {e}; refused before compiling") from None
    except RecursionError:
        return


class _Model:
    def __init__(self, rules: dict[str, Node]):
        self.rules = rules
        self.nullable = self._nullable_rules()
        self._product: dict[str, int] = {}

    def _nullable_rules(self) -> set[str]:
        out: set[str] = set()
        changed = True
        while changed:  # fixed point: at most len(rules) rounds
            changed = False
            for name, node in self.rules.items():
                if name not in out and self.is_nullable(node, out):
                    out.add(name)
                    changed = True
        return out

    def is_nullable(self, node: Node, known: Optional[set[str]] = None) -> bool:
        known = self.nullable if known is None else known
        if isinstance(node, Lit):
            return node.nbytes == 0
        if isinstance(node, Char):
            return False
        if isinstance(node, Ref):
            return node.name in known
        if isinstance(node, Seq):
            return all(self.is_nullable(x, known) for x in node.items)
        if isinstance(node, Alt):
            return any(self.is_nullable(x, known) for x in node.options)
        return node.lo == 0 or self.is_nullable(node.body, known)

    def walk(self, node: Node, rule: str, nested: bool) -> None:
        if isinstance(node, Lit) and node.nbytes > MAX_LITERAL_BYTES:
            raise TooExpensive(f"a string literal of {node.nbytes:,} bytes in rule {rule} "
                               f"(limit {MAX_LITERAL_BYTES:,} bytes)")
        if isinstance(node, Rep):
            many = node.hi is None or node.hi > 1
            if nested and many and self.is_nullable(node.body):
                raise TooExpensive(f"a repetition {node.text()} of a part that can match nothing in rule {rule} "
                                   "(ambiguous: every split of the output is a parse; limit: none allowed)")
            if nested and many and isinstance(node.body, Rep) and (node.body.hi is None or node.body.hi > 1):
                raise TooExpensive(f"a repetition {node.text()} of a repetition {node.body.text()} in rule {rule} "
                                   "(ambiguous: every split of the output is a parse; limit: none allowed)")
            self.walk(node.body, rule, nested)
        elif isinstance(node, Seq):
            for x in node.items:
                self.walk(x, rule, nested)
        elif isinstance(node, Alt):
            for x in node.options:
                self.walk(x, rule, nested)

    def recursion(self, name: str, node: Node) -> None:
        options = node.options if isinstance(node, Alt) else (node,)
        multi = [o for o in options if _count_refs(o, name) >= 2]
        if len(multi) >= 2 or (multi and name in self.nullable):
            why = "in a rule that can match nothing" if len(multi) < 2 else f"in {len(multi)} alternatives"
            raise TooExpensive(f"ambiguous recursion: rule {name} references itself twice or more {why} "
                               "(parses grow exponentially with the output; limit: one such alternative, "
                               "in a rule that cannot match nothing)")

    def product(self, name: str, stack: set[str]) -> int:
        """Largest product of counted upper bounds along one nesting path from rule `name`."""
        hit = self._product.get(name)
        if hit is not None:
            return hit
        if name in stack or name not in self.rules:
            return 1
        stack.add(name)
        p = self._node_product(self.rules[name], stack)
        stack.discard(name)
        self._product[name] = p
        return p

    def _node_product(self, node: Node, stack: set[str]) -> int:
        if isinstance(node, Ref):
            return self.product(node.name, stack)
        if isinstance(node, (Seq, Alt)):
            kids = node.items if isinstance(node, Seq) else node.options
            return max((self._node_product(x, stack) for x in kids), default=1)
        if isinstance(node, Rep):
            counted = node.hi if node.hi is not None and node.hi > 1 else 1
            inner = self._node_product(node.body, stack)
            p = counted * inner
            if p > MAX_REPEAT_PRODUCT and counted > 1 and inner > 1:
                raise TooExpensive(f"nested counted repetition with bounds multiplying to {p:,} "
                                   f"({node.text()} around a part of {inner:,}; limit {MAX_REPEAT_PRODUCT:,})")
            return p
        return 1


def _count_refs(node: Node, name: str) -> int:
    if isinstance(node, Ref):
        return int(node.name == name)
    if isinstance(node, Seq):
        return sum(_count_refs(x, name) for x in node.items)
    if isinstance(node, Alt):
        return max((_count_refs(x, name) for x in node.options), default=0)
    if isinstance(node, Rep):
        return _count_refs(node.body, name) * (2 if node.hi is None or node.hi > 1 else 1)
    return 0
