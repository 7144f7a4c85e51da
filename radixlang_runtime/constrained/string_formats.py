"""JSON-schema string formats -> regexes of their JSON string (quotes included) that keep the output JSON.

outlines-core's own format regexes are not safe inside a JSON string: its `email` allows a quoted local
part (`"..."`, unescaped quotes and raw control bytes), its `uri` allows `"` and `\\` (`[^\\s]+`), its
`time` has `(\\\\.[0-9]+)?` (a literal backslash, then any character) and no offset, and `\\d` is any
Unicode digit in Rust's regex. schema.py puts these regexes in their place instead (the same marks as
integer bounds), so every backend compiles the same patterns. Each pattern uses only characters that need
no JSON escape, so a match is a valid JSON string, and each value is accepted by jsonschema's
FormatChecker for its format (dates are real calendar dates, leap days included).
"""

from __future__ import annotations

_MONTH_DAY = ("(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"  # 31-day months
              "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"  # 30-day months
              "|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
DATE = f"(?:[0-9]{{4}}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_HOUR_MIN = "(?:[01][0-9]|2[0-3]):[0-5][0-9]"
TIME = f"{_HOUR_MIN}:[0-5][0-9](?:\\.[0-9]{{1,6}})?(?:Z|[+-]{_HOUR_MIN})"  # RFC 3339 full-time
_HEX4 = "[0-9a-f]{1,4}"
_IPV4_PART = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV6 = "|".join([  # RFC 4291 text forms without an embedded IPv4 or a zone
    f"(?:{_HEX4}:){{7}}{_HEX4}",
    f"(?:{_HEX4}:){{1,7}}:",
    f"(?:{_HEX4}:){{1,6}}:{_HEX4}",
    f"(?:{_HEX4}:){{1,5}}(?::{_HEX4}){{1,2}}",
    f"(?:{_HEX4}:){{1,4}}(?::{_HEX4}){{1,3}}",
    f"(?:{_HEX4}:){{1,3}}(?::{_HEX4}){{1,4}}",
    f"(?:{_HEX4}:){{1,2}}(?::{_HEX4}){{1,5}}",
    f"{_HEX4}:(?::{_HEX4}){{1,6}}",
    f":(?:(?::{_HEX4}){{1,7}}|:)",
])
_ATOM = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"  # RFC 5322 dot-atom text (no quoted local part)
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_PCT = "%[0-9A-Fa-f]{2}"
_HOST = f"(?:[A-Za-z0-9._~!$&'()*+,;=-]|{_PCT})*"  # RFC 3986 reg-name
_PCHAR = f"(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|{_PCT})"
_URI = (f"[A-Za-z][A-Za-z0-9+.-]*://{_HOST}(?:/{_PCHAR}*)*"  # scheme, authority (a host), path
        f"(?:\\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?")  # query, fragment

FORMAT_REGEX: dict[str, str] = {
    "date": DATE,
    "time": TIME,
    "date-time": f"{DATE}T{TIME}",
    "uuid": "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "email": f"{_ATOM}(?:\\.{_ATOM})*@{_LABEL}(?:\\.{_LABEL})*",
    "uri": _URI,
    "ipv4": f"{_IPV4_PART}(?:\\.{_IPV4_PART}){{3}}",
    "ipv6": f"(?:{_IPV6})",
}
STRING_FORMATS = frozenset(FORMAT_REGEX)


def format_string_regex(fmt: str) -> str:
    """The regex of a JSON string (with its quotes) holding a value of format `fmt` (KeyError: unknown)."""
    return f'"(?:{FORMAT_REGEX[fmt]})"'
