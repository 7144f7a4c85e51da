"""200 random JSON schemas (a seeded generator over the keywords constrained/schema.py supports: every type,
enum, const, required / optional properties, arrays with minItems / maxItems, integer bounds, string
patterns and lengths, string formats, nesting depth <= 3; property names with quotes, backslashes, control
characters, regex metacharacters and non-ASCII), each compiled by every grammar backend and sampled by a random
"model" (seeded random choices among the tokens the mask allows, EOS as soon as the output may end): every
output must parse with json.loads and validate with jsonschema (formats checked too).
Some schemas carry a keyword we do not support: the refusal is the
ValueError the server answers as a 400, and it names that keyword, in every backend (it comes before any
backend compiles).

The vocabulary is small (every byte + a few multi-byte tokens a JSON tokenizer has) so 600 compiles stay
cheap; the masks and states are the runtime's own (GrammarState, the backends' grammar objects)."""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest

from radixlang_runtime.constrained.grammar import compile_grammar
from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.state import GrammarState
from radixlang_runtime.constrained.string_formats import STRING_FORMATS
from radixlang_runtime.constrained.vocab import TokenVocab

BACKENDS = ("outlines", "xgrammar", "llguidance")
N_SCHEMAS = 200
MAX_STEPS = 2000
MULTI = [b'{"', b'": ', b'", "', b'"}', b", ", b"true", b"false", b"null", b"[]", b"{}", b"ab", b"12"]
# property names a JSON writer must escape (quote, backslash, control characters), regex metacharacters,
# non-ASCII, and plain ones
NAMES = ["a", "name", "n_2", "x y", 'a"b', "back\\slash", "new\nline", "tab\tbed", "\x01ctl\x1f", '"', "\\",
         'q"\\"', "a.b(c)[d]|e*", "é中文", "emoji\U0001F600", "\u2028sep", "{}", "$ref"]
FORMATS = sorted(STRING_FORMATS)
FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
BOUNDED_KINDS = ["string", "string_pattern", "string_format", "integer_bounds", "boolean", "null", "enum", "const"]
BOUNDED_FORMATS = ["date", "date-time", "time", "uuid", "ipv4", "ipv6"]
PATTERNS = ["[a-z]{1,4}", "[0-9]{3}-[0-9]{2}", "(ab|cd)+x?", "[A-Z][a-z]{0,3}", "id_[0-9]+"]
# keyword -> a schema carrying it that schema.py refuses (the refusal must name it)
UNSUPPORTED = {"uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
               "multipleOf": {"type": "integer", "multipleOf": 3},
               "patternProperties": {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
               "not": {"not": {"type": "string"}},
               "contains": {"type": "array", "contains": {"type": "integer"}}}


def small_vocab() -> TokenVocab:
    """Every byte as a token, a few multi-byte JSON pieces, EOS last."""
    table = [bytes([b]) for b in range(256)] + MULTI + [None]
    return TokenVocab(table, eos_token_id=len(table) - 1)


class SchemaGen:
    """Seeded random schemas over the supported keywords; depth <= 3 (the root is depth 1)."""

    def __init__(self, seed: int, bounded: bool = False):
        """bounded: every output has a bounded length (a model that never ends a string or a number cannot
        run past max_new_tokens): bounded leaves only, depth <= 2, at most 3 items an array."""
        self.r = random.Random(seed)
        self.bounded = bounded
        self.max_depth, self.max_items = (2, 3) if bounded else (3, 5)

    def leaf(self) -> dict:
        r = self.r
        kind = r.choice(BOUNDED_KINDS if self.bounded else
                        ["string", "string_pattern", "string_format", "integer", "integer_bounds", "number",
                         "boolean", "null", "enum", "const"])
        if kind == "string_format":
            return {"type": "string", "format": r.choice(BOUNDED_FORMATS if self.bounded else FORMATS)}
        if kind == "string":
            lo = r.randint(0, 3)
            return {"type": "string", "minLength": lo, "maxLength": lo + r.randint(0, 6)}
        if kind == "string_pattern":
            return {"type": "string", "pattern": r.choice(PATTERNS[:2] if self.bounded else PATTERNS)}
        if kind == "integer_bounds":
            lo = r.randint(-50, 50)
            lo_key, hi_key = r.choice([("minimum", "maximum"), ("exclusiveMinimum", "exclusiveMaximum"),
                                       ("minimum", "exclusiveMaximum")])
            node = {"type": "integer", lo_key: lo, hi_key: lo + r.randint(2, 500)}
            if r.random() < 0.3 and not self.bounded:
                node.pop(r.choice([lo_key, hi_key]))
            return node
        if kind == "enum":
            return {"enum": r.sample(["red", "green", 3, -1.5, True, None, "a b"], r.randint(1, 4))}
        if kind == "const":
            return {"const": r.choice(["fixed", 42, False, None])}
        return {"type": kind}

    def node(self, depth: int) -> dict:
        if depth >= self.max_depth or self.r.random() < 0.45:
            return self.leaf()
        return self.array(depth) if self.r.random() < 0.4 else self.obj(depth)

    def array(self, depth: int) -> dict:
        lo = self.r.randint(0, 2)
        hi = min(lo + self.r.randint(0, 3), self.max_items)
        return {"type": "array", "items": self.node(depth + 1), "minItems": min(lo, hi), "maxItems": hi}

    def obj(self, depth: int) -> dict:
        names = self.r.sample(NAMES, self.r.randint(1, 4))
        props = {n: self.node(depth + 1) for n in names}
        node = {"type": "object", "properties": props, "required": [n for n in names if self.r.random() < 0.6]}
        if self.r.random() < 0.5:
            node["additionalProperties"] = False
        return node

    def schema(self) -> tuple[dict, str | None]:
        """(a root schema, the unsupported keyword it carries or None)."""
        root = self.obj(1) if self.r.random() < 0.8 else self.node(1)
        if self.r.random() < 0.1:
            bad = self.r.choice(sorted(UNSUPPORTED))
            return {"type": "object", "properties": {"ok": self.leaf(), "bad": UNSUPPORTED[bad]}}, bad
        return root, None


def sample(g, vocab: TokenVocab, rng: np.random.Generator) -> bytes:
    """A random walk through the grammar: EOS once the output may end, else a random allowed token."""
    gs = GrammarState(g, [vocab.eos_token_id])
    out: list[int] = []
    for _ in range(MAX_STEPS):
        if gs.can_finish:
            return vocab.bytes_of(out)
        ids = np.asarray(gs.allowed().ids)
        assert len(ids), f"a dead end after {vocab.bytes_of(out)!r}"
        tok = int(ids[rng.integers(len(ids))])
        assert gs.advance(tok)
        out.append(tok)
    raise AssertionError(f"no end after {MAX_STEPS} tokens: {vocab.bytes_of(out)!r}")


def test_random_schemas_validate_in_every_backend():
    vocab = small_vocab()
    gen = SchemaGen(seed=1234)
    rng = np.random.default_rng(99)
    checked, refused = 0, set()
    for i in range(N_SCHEMAS):
        schema, bad = gen.schema()
        if bad is not None:
            with pytest.raises(ValueError, match=f"unsupported keyword '{bad}'"):
                GrammarSpec.from_json_schema(schema)
            refused.add(bad)
            continue
        spec = GrammarSpec.from_json_schema(schema)
        for backend in BACKENDS:
            g = compile_grammar(spec, vocab, backend)
            text = sample(g, vocab, rng).decode("utf-8")
            try:
                jsonschema.validate(json.loads(text), schema, format_checker=FORMAT_CHECKER)
            except (ValueError, jsonschema.ValidationError) as e:
                raise AssertionError(f"schema {i} ({backend}): {json.dumps(schema)}\noutput {text!r}\n{e}") from None
            checked += 1
    assert checked >= 150 * len(BACKENDS) and len(refused) >= 3, (checked, refused)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("regex", [".{0,3}", "[^a]{0,3}", '"([^"\\\\]|\\\\["\\\\])*"'])
def test_no_backend_writes_a_utf16_surrogate(backend, regex):
    """U+D800 as 3 bytes (ED A0 80) is not UTF-8; xgrammar's converter allowed it after `.` and in negated
    classes until xgrammar_backend.no_surrogates."""
    vocab = small_vocab()
    gs = GrammarState(compile_grammar(GrammarSpec.from_regex(regex), vocab, backend), [vocab.eos_token_id])
    if regex.startswith('"'):
        assert gs.advance(ord('"'))
    assert gs.advance(0xED) and not gs.advance(0xA0)  # ED 9F is still fine: U+D7C0..U+D7FF
    assert gs.advance(0x9F)
