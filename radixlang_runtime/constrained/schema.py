"""JSON schema: checks that name what is unsupported, and schema -> regex with fixed separators.

outlines-core's build_regex_from_schema silently ignores keywords it does not know (`minimum`,
`uniqueItems`, ...), and picks one of several combinators (`properties` wins over `anyOf`); either
way a request would get output that breaks its own schema. check_schema refuses those with a
ValueError naming the keyword and where it is (a JSON pointer), before anything compiles. It is a
table (KEYWORD_CHECKS): the generic checks of every node, then one small check per keyword group.

Integer bounds (minimum / maximum / exclusiveMinimum / exclusiveMaximum on {"type": "integer"}, what
pydantic's ge / le / gt / lt produce) are supported: schema_to_regex puts a digit-range regex
(int_range.py) where the integer goes; bounds elsewhere (numbers, enums) are refused by name.

String formats (string_formats.py) and property names: outlines-core's format regexes and its property
names (regex-escaped, never JSON-escaped) can write invalid JSON; _marked swaps both for safe forms
before outlines-core sees the schema, so every backend compiles JSON-valid regexes (CONSTRAINED.md).

Whitespace: every separator slot gets exactly the layout models emit, `{"k": v, "k2": [a, b]}`:
nothing after `{` / `[` or before `}` / `]` / `,` / `:`, one space after `,` and `:` (Python's
json.dumps default layout). With fixed separators jump-forward can force them (CONSTRAINED.md).
It is done by compiling with a unique placeholder as the whitespace pattern and rewriting each slot:
a slot touching a separator comma or colon becomes that separator plus one space; every other slot
becomes empty. Invariant (checked): no placeholder survives the rewrite.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Callable, Optional, Union

from radixlang_runtime.constrained.int_range import int_range_regex
from radixlang_runtime.constrained.string_formats import STRING_FORMATS, format_string_regex

MAX_SCHEMA_CHARS = 1 << 20
MAX_SCHEMA_DEPTH = 32  # nested schema objects (properties / items / combinators), $ref not followed

ANNOTATIONS = {"title", "description", "$schema", "$id", "$comment", "default", "examples", "deprecated",
               "readOnly", "writeOnly", "$anchor"}
SUPPORTED = {"type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum", "const",
             "$ref", "$defs", "definitions", "anyOf", "oneOf", "allOf", "minLength", "maxLength", "pattern",
             "format", "minItems", "maxItems", "minProperties", "maxProperties", "minDigits", "maxDigits",
             "minDigitsInteger", "maxDigitsInteger", "minDigitsFraction", "maxDigitsFraction",
             "minDigitsExponent", "maxDigitsExponent", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")  # integers only (int_range.py)
MAX_BOUND = 10**18
COUNTS = ("minProperties", "maxProperties", "minItems", "maxItems", "minLength", "maxLength")
TYPES = {"string", "number", "integer", "boolean", "null", "array", "object"}
_DISPATCH = ("properties", "allOf", "anyOf", "oneOf", "prefixItems", "enum", "const", "$ref")


def canonical_schema(schema: Union[str, dict[str, Any]]) -> str:
    """A schema (JSON string or dict) -> compact JSON text with key order kept (order = output order)."""
    if isinstance(schema, str):
        if len(schema) > MAX_SCHEMA_CHARS:
            raise ValueError(f"json_schema too long: {len(schema)} characters (limit {MAX_SCHEMA_CHARS})")
        try:
            schema = json.loads(schema)
        except RecursionError:
            raise ValueError("json_schema is nested too deeply") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"json_schema must be a JSON object, got {type(schema).__name__}")
    try:
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    except (RecursionError, ValueError, TypeError) as e:
        raise ValueError(f"json_schema cannot be serialised: {e}") from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise ValueError(f"json_schema too long: {len(text)} characters (limit {MAX_SCHEMA_CHARS})")
    check_schema(schema)
    return text


def _err(msg: str, path: str) -> ValueError:
    return ValueError(f"json_schema: {msg} at {path or '#'}")


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def _nonneg_int(node: dict, key: str, path: str) -> None:
    v = node.get(key)
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
        raise _err(f"'{key}' must be a non-negative integer, got {v!r}", path)


class _Walk:
    """One check of a schema tree: the generic checks of every node, then KEYWORD_CHECKS in order."""

    def __init__(self, root: dict[str, Any]):
        self.root = root
        self.seen_refs: set[str] = set()

    def resolve(self, ref: str, path: str) -> Any:
        if not ref.startswith("#"):
            raise _err(f"only local references ('#/...') are supported, got $ref {ref!r}", path)
        node: Any = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise _err(f"$ref {ref!r} does not resolve", path)
            node = node[part]
        return node

    def walk(self, node: Any, path: str, depth: int) -> None:
        if depth > MAX_SCHEMA_DEPTH:
            raise _err(f"schema nested deeper than {MAX_SCHEMA_DEPTH} levels", path)
        if not isinstance(node, dict):
            raise _err(f"a schema must be an object, got {json.dumps(node)[:40]} (boolean schemas are not supported)",
                       path)
        for key in node:
            if key not in SUPPORTED and key not in ANNOTATIONS and not key.startswith("x-"):
                raise _err(f"unsupported keyword '{key}'", path)
        found = [k for k in _DISPATCH if k in node]
        if len(found) > 1:
            raise _err(f"'{found[0]}' together with '{found[1]}' is not supported", path)
        if node and not found and "type" not in node:
            raise _err("a schema needs 'type', 'enum', 'const', '$ref', 'properties' or a combinator", path)
        for keys, check in KEYWORD_CHECKS:
            if any(k in node for k in keys):
                check(self, node, path, depth)


def _types(node: dict) -> set[str]:
    t = node.get("type")
    return set([t] if isinstance(t, str) else (t or []))


def _check_defs(w: _Walk, node: dict, path: str, depth: int) -> None:
    for key in ("$defs", "definitions"):
        if key in node:
            defs = node[key]
            if not isinstance(defs, dict):
                raise _err(f"'{key}' must be an object", path)
            for name, sub in defs.items():
                w.walk(sub, f"{path}/{key}/{name}", depth + 1)


def _check_type(w: _Walk, node: dict, path: str, depth: int) -> None:
    types = node["type"]
    tl = [types] if isinstance(types, str) else types
    if not isinstance(tl, list) or not tl or not all(isinstance(t, str) for t in tl):
        raise _err("'type' must be a string or a non-empty list of strings", path)
    for t in tl:
        if t not in TYPES:
            raise _err(f"unsupported type {t!r}", path)


def _check_combinators(w: _Walk, node: dict, path: str, depth: int) -> None:
    for key in ("anyOf", "oneOf", "allOf"):
        if key in node:
            subs = node[key]
            if not isinstance(subs, list) or not subs:
                raise _err(f"'{key}' must be a non-empty list", path)
            if key == "allOf" and len(subs) > 1:
                raise _err("'allOf' with more than one schema is not supported", path)
            for k, sub in enumerate(subs):
                w.walk(sub, f"{path}/{key}/{k}", depth + 1)


def _check_literals(w: _Walk, node: dict, path: str, depth: int) -> None:
    if "enum" in node:
        vals = node["enum"]
        if not isinstance(vals, list) or not vals:
            raise _err("'enum' must be a non-empty list", path)
        if not all(_is_scalar(v) for v in vals):
            raise _err("'enum' values must be strings, numbers, booleans or null", path)
    if "const" in node and not _is_scalar(node["const"]):
        raise _err("'const' must be a string, number, boolean or null", path)


def _check_ref(w: _Walk, node: dict, path: str, depth: int) -> None:
    ref = node["$ref"]
    if not isinstance(ref, str):
        raise _err("'$ref' must be a string", path)
    target = w.resolve(ref, path)
    if ref not in w.seen_refs:
        w.seen_refs.add(ref)
        w.walk(target, ref, depth + 1)


def _check_properties(w: _Walk, node: dict, path: str, depth: int) -> None:
    props = node["properties"]
    if not isinstance(props, dict):
        raise _err("'properties' must be an object", path)
    for name, sub in props.items():
        w.walk(sub, f"{path}/properties/{name}", depth + 1)
    for key in ("minProperties", "maxProperties"):
        if key in node:
            raise _err(f"'{key}' together with 'properties' is not supported", path)


def _check_required(w: _Walk, node: dict, path: str, depth: int) -> None:
    req = node["required"]
    if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
        raise _err("'required' must be a list of strings", path)
    missing = [r for r in req if r not in (node.get("properties") or {})]
    if missing:
        raise _err(f"required property {missing[0]!r} is not in 'properties'", path)


def _check_additional(w: _Walk, node: dict, path: str, depth: int) -> None:
    ap, props = node["additionalProperties"], node.get("properties")
    if isinstance(ap, dict):
        if props is None:
            w.walk(ap, f"{path}/additionalProperties", depth + 1)
    elif not isinstance(ap, bool):
        raise _err("'additionalProperties' must be a boolean or a schema", path)
    elif ap is False and props is None:
        raise _err("'additionalProperties': false without 'properties' is not supported", path)


def _check_counts(w: _Walk, node: dict, path: str, depth: int) -> None:
    for key in COUNTS:
        _nonneg_int(node, key, path)


def _check_items(w: _Walk, node: dict, path: str, depth: int) -> None:
    if "items" in node:
        items = node["items"]
        if isinstance(items, list):
            raise _err("'items' as a list is not supported (use 'prefixItems')", path)
        w.walk(items, f"{path}/items", depth + 1)
    if "prefixItems" in node:
        pre = node["prefixItems"]
        if not isinstance(pre, list) or not pre:
            raise _err("'prefixItems' must be a non-empty list", path)
        for key in ("items", "minItems", "maxItems"):
            if key in node:
                raise _err(f"'{key}' together with 'prefixItems' is not supported", path)
        for k, sub in enumerate(pre):
            w.walk(sub, f"{path}/prefixItems/{k}", depth + 1)


def _check_pattern(w: _Walk, node: dict, path: str, depth: int) -> None:
    from radixlang_runtime.constrained.regex_check import check_regex

    if not isinstance(node["pattern"], str):
        raise _err("'pattern' must be a string", path)
    for key in ("minLength", "maxLength", "format"):
        if key in node:
            raise _err(f"'pattern' together with '{key}' is not supported", path)
    try:
        check_regex(node["pattern"])
    except ValueError as e:
        raise _err(f"'pattern': {e}", path) from None


def _check_format(w: _Walk, node: dict, path: str, depth: int) -> None:
    fmt, tl = node["format"], _types(node)
    if not tl or "string" in tl:
        if fmt not in STRING_FORMATS:
            raise _err(f"string format {fmt!r} is not supported (supported: {', '.join(sorted(STRING_FORMATS))})",
                       path)
        for key in ("minLength", "maxLength"):
            if key in node:
                raise _err(f"'format' together with '{key}' is not supported", path)
        if len(tl) > 1:
            raise _err("'format' with a 'type' list is not supported (use anyOf)", path)


def integer_bounds(node: dict, path: str = "") -> tuple[Optional[int], Optional[int]]:
    """(lo, hi) of an integer schema's minimum / maximum / exclusiveMinimum / exclusiveMaximum (None: no
    bound); ValueError naming what is not supported (bounds on anything but "type": "integer", non-integer
    bounds, an empty range)."""
    present = [k for k in BOUNDS if k in node]
    if node.get("type") != "integer" or "enum" in node or "const" in node:
        raise _err(f"'{present[0]}' is supported on {{\"type\": \"integer\"}} only", path)
    for k in present:
        v = node[k]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool) or abs(v) > MAX_BOUND:
            raise _err(f"'{k}' must be an integer within +-{MAX_BOUND:.0e}, got {node[k]!r}", path)
    lows = [int(node[k]) + (k == "exclusiveMinimum") for k in ("minimum", "exclusiveMinimum") if k in node]
    highs = [int(node[k]) - (k == "exclusiveMaximum") for k in ("maximum", "exclusiveMaximum") if k in node]
    lo, hi = (max(lows) if lows else None), (min(highs) if highs else None)
    if lo is not None and hi is not None and lo > hi:
        raise _err(f"the integer range is empty (lowest {lo} > highest {hi})", path)
    return lo, hi


def _check_bounds(w: _Walk, node: dict, path: str, depth: int) -> None:
    integer_bounds(node, path)


# (keywords, check): a check runs when its node has any of its keywords; order = the order errors are found
KEYWORD_CHECKS: list[tuple[tuple[str, ...], Callable[[_Walk, dict, str, int], None]]] = [
    (("$defs", "definitions"), _check_defs),
    (("type",), _check_type),
    (("anyOf", "oneOf", "allOf"), _check_combinators),
    (("enum", "const"), _check_literals),
    (("$ref",), _check_ref),
    (("properties",), _check_properties),
    (("required",), _check_required),
    (("additionalProperties",), _check_additional),
    (COUNTS, _check_counts),
    (("items", "prefixItems"), _check_items),
    (BOUNDS, _check_bounds),
    (("pattern",), _check_pattern),
    (("format",), _check_format),
]


def check_schema(root: dict[str, Any]) -> None:
    """ValueError naming the first unsupported keyword, combination or value (with its JSON pointer)."""
    _Walk(root).walk(root, "", 0)


def _mark(marks: dict[str, str], regex: str) -> int:
    """A unique integer (its digits become `regex` after outlines-core built the schema's regex)."""
    mark = int("8" + "".join(secrets.choice("0123456789") for _ in range(17)))  # within i64: kept exact
    marks[str(mark)] = regex
    return mark


_PY_LITERALS = ((True, "True"), (False, "False"), (None, "None"))


def _py(v: Any, marks: dict[str, str]) -> Any:
    """An enum / const value in Python literal syntax: true / false / null become marks of True / False / None."""
    for lit, text in _PY_LITERALS:
        if v is lit:
            return _mark(marks, text)
    return v


def _marked(node: Any, marks: dict[str, str], python: bool) -> Any:
    """A copy of the schema for build_regex_from_schema, which ignores integer bounds and writes JSON
    literals: every bounded integer becomes {"const": MARK} (MARK -> its range regex); python: booleans
    and null become marks of True / False / None (Python literal syntax, the pythonic tool-call format)."""
    if isinstance(node, list):
        return [_marked(v, marks, python) for v in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "integer" and any(isinstance(node.get(k), (int, float)) for k in BOUNDS):
        return {"const": _mark(marks, int_range_regex(*integer_bounds(node)))}
    if _types(node) <= {"string"} and node.get("format") in STRING_FORMATS and not ("enum" in node or "const" in node):
        return {"const": _mark(marks, format_string_regex(node["format"]))}
    if python and "enum" not in node and "const" not in node:
        types = _types(node)
        if len(types) > 1 and types & {"boolean", "null"}:
            raise ValueError("json_schema: a 'type' list with boolean or null is not supported in Python literals")
        if types == {"boolean"}:
            return {"enum": [_mark(marks, "True"), _mark(marks, "False")]}
        if types == {"null"}:
            return {"const": _mark(marks, "None")}
    out = {k: _marked(v, marks, python) for k, v in node.items()}
    if isinstance(node.get("properties"), dict):  # outlines-core writes names unescaped (see schema_to_regex)
        out["properties"] = {_escaped_name(k): v for k, v in out["properties"].items()}
        if isinstance(node.get("required"), list):
            out["required"] = [_escaped_name(k) if isinstance(k, str) else k for k in node["required"]]
    if python and isinstance(node.get("enum"), list):
        out["enum"] = [_py(v, marks) for v in node["enum"]]
    if python and "const" in node:
        out["const"] = _py(node["const"], marks)
    return out


def _escaped_name(name: str) -> str:
    """A property name as the characters between its JSON quotes (`a"b` -> `a\\"b`, a newline -> `\\n`).
    outlines-core regex-escapes a name but does not JSON-escape it, so the name it is given is the escaped
    text: the regex then matches the name's JSON spelling (json.dumps's: \\uXXXX for other control
    characters, non-ASCII kept). Distinct names stay distinct (JSON escaping is one-to-one)."""
    return json.dumps(name, ensure_ascii=False)[1:-1]


def fixed_separators(regex: str, mark: str) -> str:
    """Rewrite whitespace slots (each an occurrence of `mark`) into the fixed JSON layout."""
    parts = regex.split(mark)
    for i in range(len(parts) - 1):
        left, right = parts[i], parts[i + 1]
        if left.endswith(",") or (left.endswith(":") and not left.endswith("(?:")):
            parts[i] = left + " "
        elif right.startswith((",", ":")):
            parts[i + 1] = right[0] + " " + right[1:]
    out = "".join(parts)
    assert mark not in out
    return out


_JSON_ESCAPES, _PY_ESCAPES = r'\\["\\/bfnrt]', r'\\["\\bfnrt]'  # outlines-core's string escapes; `\/` is JSON only


def schema_to_regex(canonical: str, python: bool = False) -> str:
    """Canonical schema JSON -> regex with fixed separators (outlines-core; run it in the compile worker:
    a hostile schema can make this large). python: values in Python literal syntax (True / False / None,
    no backslash-slash escape), JSON's everywhere else."""
    from outlines_core.json_schema import build_regex_from_schema

    marks: dict[str, str] = {}
    canonical = json.dumps(_marked(json.loads(canonical), marks, python), separators=(",", ":"), ensure_ascii=False)
    mark = f"\x00WS{secrets.token_hex(8)}\x00"
    try:
        regex = build_regex_from_schema(canonical, mark)
    except (ValueError, TypeError) as e:
        raise ValueError(f"json_schema: {e}") from None
    for digits, bound in marks.items():
        regex = regex.replace(digits, bound)
    if python:
        regex = regex.replace(_JSON_ESCAPES, _PY_ESCAPES)
    return fixed_separators(regex, mark)
