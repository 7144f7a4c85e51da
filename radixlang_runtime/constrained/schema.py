"""JSON schema: checks that name what is unsupported, and schema -> regex with fixed separators.

outlines-core's build_regex_from_schema silently ignores keywords it does not know (`minimum`,
`uniqueItems`, ...), and picks one of several combinators (`properties` wins over `anyOf`); either
way a request would get output that breaks its own schema. check_schema refuses those with a
ValueError naming the keyword and where it is (a JSON pointer), before anything compiles.

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
from typing import Any, Union

MAX_SCHEMA_CHARS = 1 << 20
MAX_SCHEMA_DEPTH = 32  # nested schema objects (properties / items / combinators), $ref not followed

ANNOTATIONS = {"title", "description", "$schema", "$id", "$comment", "default", "examples", "deprecated",
               "readOnly", "writeOnly", "$anchor"}
SUPPORTED = {"type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum", "const",
             "$ref", "$defs", "definitions", "anyOf", "oneOf", "allOf", "minLength", "maxLength", "pattern",
             "format", "minItems", "maxItems", "minProperties", "maxProperties", "minDigits", "maxDigits",
             "minDigitsInteger", "maxDigitsInteger", "minDigitsFraction", "maxDigitsFraction",
             "minDigitsExponent", "maxDigitsExponent"}
TYPES = {"string", "number", "integer", "boolean", "null", "array", "object"}
STRING_FORMATS = {"date-time", "date", "time", "uuid", "uri", "email"}
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


def check_schema(root: dict[str, Any]) -> None:
    """ValueError naming the first unsupported keyword, combination or value (with its JSON pointer)."""
    seen_refs: set[str] = set()

    def resolve(ref: str, path: str) -> Any:
        if not ref.startswith("#"):
            raise _err(f"only local references ('#/...') are supported, got $ref {ref!r}", path)
        node: Any = root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise _err(f"$ref {ref!r} does not resolve", path)
            node = node[part]
        return node

    def walk(node: Any, path: str, depth: int) -> None:
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
        for key in ("$defs", "definitions"):
            if key in node:
                defs = node[key]
                if not isinstance(defs, dict):
                    raise _err(f"'{key}' must be an object", path)
                for name, sub in defs.items():
                    walk(sub, f"{path}/{key}/{name}", depth + 1)
        types = node.get("type")
        if types is not None:
            tl = [types] if isinstance(types, str) else types
            if not isinstance(tl, list) or not tl or not all(isinstance(t, str) for t in tl):
                raise _err("'type' must be a string or a non-empty list of strings", path)
            for t in tl:
                if t not in TYPES:
                    raise _err(f"unsupported type {t!r}", path)
        tl = set([types] if isinstance(types, str) else (types or []))
        # --- combinators and literals ---
        for key in ("anyOf", "oneOf", "allOf"):
            if key in node:
                subs = node[key]
                if not isinstance(subs, list) or not subs:
                    raise _err(f"'{key}' must be a non-empty list", path)
                if key == "allOf" and len(subs) > 1:
                    raise _err("'allOf' with more than one schema is not supported", path)
                for k, sub in enumerate(subs):
                    walk(sub, f"{path}/{key}/{k}", depth + 1)
        if "enum" in node:
            vals = node["enum"]
            if not isinstance(vals, list) or not vals:
                raise _err("'enum' must be a non-empty list", path)
            if not all(_is_scalar(v) for v in vals):
                raise _err("'enum' values must be strings, numbers, booleans or null", path)
        if "const" in node and not _is_scalar(node["const"]):
            raise _err("'const' must be a string, number, boolean or null", path)
        if "$ref" in node:
            ref = node["$ref"]
            if not isinstance(ref, str):
                raise _err("'$ref' must be a string", path)
            target = resolve(ref, path)
            if ref not in seen_refs:
                seen_refs.add(ref)
                walk(target, ref, depth + 1)
        # --- objects ---
        props = node.get("properties")
        if props is not None:
            if not isinstance(props, dict):
                raise _err("'properties' must be an object", path)
            for name, sub in props.items():
                walk(sub, f"{path}/properties/{name}", depth + 1)
            for key in ("minProperties", "maxProperties"):
                if key in node:
                    raise _err(f"'{key}' together with 'properties' is not supported", path)
        req = node.get("required")
        if req is not None:
            if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
                raise _err("'required' must be a list of strings", path)
            missing = [r for r in req if r not in (props or {})]
            if missing:
                raise _err(f"required property {missing[0]!r} is not in 'properties'", path)
        ap = node.get("additionalProperties")
        if ap is not None:
            if isinstance(ap, dict):
                if props is None:
                    walk(ap, f"{path}/additionalProperties", depth + 1)
            elif not isinstance(ap, bool):
                raise _err("'additionalProperties' must be a boolean or a schema", path)
            elif ap is False and props is None:
                raise _err("'additionalProperties': false without 'properties' is not supported", path)
        _nonneg_int(node, "minProperties", path)
        _nonneg_int(node, "maxProperties", path)
        # --- arrays ---
        if "items" in node:
            items = node["items"]
            if isinstance(items, list):
                raise _err("'items' as a list is not supported (use 'prefixItems')", path)
            walk(items, f"{path}/items", depth + 1)
        if "prefixItems" in node:
            pre = node["prefixItems"]
            if not isinstance(pre, list) or not pre:
                raise _err("'prefixItems' must be a non-empty list", path)
            for key in ("items", "minItems", "maxItems"):
                if key in node:
                    raise _err(f"'{key}' together with 'prefixItems' is not supported", path)
            for k, sub in enumerate(pre):
                walk(sub, f"{path}/prefixItems/{k}", depth + 1)
        for key in ("minItems", "maxItems", "minLength", "maxLength"):
            _nonneg_int(node, key, path)
        # --- strings ---
        if "pattern" in node:
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
        fmt = node.get("format")
        if fmt is not None and (not tl or "string" in tl):
            if fmt not in STRING_FORMATS:
                raise _err(f"string format {fmt!r} is not supported (supported: {', '.join(sorted(STRING_FORMATS))})",
                           path)
            for key in ("minLength", "maxLength"):
                if key in node:
                    raise _err(f"'format' together with '{key}' is not supported", path)

    walk(root, "", 0)


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


def schema_to_regex(canonical: str) -> str:
    """Canonical schema JSON -> regex with fixed separators (outlines-core; run it in the compile worker:
    a hostile schema can make this large)."""
    from outlines_core.json_schema import build_regex_from_schema

    mark = f"\x00WS{secrets.token_hex(8)}\x00"
    try:
        regex = build_regex_from_schema(canonical, mark)
    except (ValueError, TypeError) as e:
        raise ValueError(f"json_schema: {e}") from None
    return fixed_separators(regex, mark)
