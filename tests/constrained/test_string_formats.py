"""String formats (constrained/string_formats.py): each pattern accepts the values listed as valid and refuses
the rest (quotes and backslashes among them), jsonschema's FormatChecker agrees on every accepted value.
Unknown formats are refused by name. (Random walks through every backend's grammar: test_random_schemas.py.)"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixlang_runtime.constrained.spec import GrammarSpec
from radixlang_runtime.constrained.string_formats import FORMAT_REGEX, format_string_regex

CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
CASES = {  # format -> (accepted, refused)
    "date": (["2024-02-29", "2000-02-29", "2023-12-31", "0001-01-01", "2023-04-30"],
             ["1900-02-29", "2023-02-29", "2023-04-31", "2023-13-01", "2023-00-10", "23-01-01", "٢٠٢٣-01-01"]),
    "time": (["23:59:59Z", "00:00:00+05:30", "12:34:56.789-08:00"],
             ["12:00:00", "24:00:00Z", "12:60:00Z", '12:00:00\\x1"', "12:00:00.Z"]),
    "date-time": (["2024-02-29T12:00:00Z", "1999-12-31T23:59:59.5+01:00"],
                  ["2024-02-29 12:00:00Z", "2024-02-30T00:00:00Z"]),
    "uuid": (["123e4567-e89b-12d3-a456-426614174000"],
             ["123e4567e89b12d3a456426614174000", "zzze4567-e89b-12d3-a456-426614174000"]),
    "email": (["a.b+c@example.com", "x@y"], ['"a"@b.c', "a@b..c", "@b.c", "a b@c.d", "a\\b@c.d"]),
    "uri": (["https://example.com/a/b?q=1#f", "ftp://h/%20x", "urn://x"],
            ["example.com", 'http://a"b', "http://a\\b", "http://a b"]),
    "ipv4": (["0.0.0.0", "255.255.255.255", "10.0.0.1"], ["256.1.1.1", "01.1.1.1", "1.1.1"]),
    "ipv6": (["::", "::1", "fe80::1", "2001:db8:0:0:0:0:2:1", "1::"],
             ["1:::2", "12345::", "1:2:3:4:5:6:7:8:9", "g::1"]),
}


def test_every_format_has_cases():
    assert set(CASES) == set(FORMAT_REGEX)


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_format_patterns_accept_exactly_their_values(fmt):
    r = re.compile(format_string_regex(fmt))
    good, bad = CASES[fmt]
    for v in good:
        text = json.dumps(v)
        assert r.fullmatch(text), (fmt, v)
        assert json.loads(text) == v and CHECKER.conforms(v, fmt), (fmt, v)
    for v in bad:
        assert not r.fullmatch(f'"{v}"'), (fmt, v)


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "format": "hostname"}, "string format 'hostname' is not supported"),
    ({"type": ["string", "null"], "format": "date"}, "'format' with a 'type' list is not supported"),
    ({"type": "string", "format": "date", "maxLength": 3}, "'format' together with 'maxLength' is not supported"),
])
def test_unsupported_formats_are_named(schema, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        GrammarSpec.from_json_schema(schema)
