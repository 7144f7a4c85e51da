"""Integer bounds as a regex: JSON integers (no leading zeros, `-0` excluded) in [lo, hi]. Pure Python.

int_range_regex(lo, hi) with either bound None (unbounded) -> a regex in the dialect both Rust and
Python read, built digit count by digit count (`[1-9][0-9]{d,}` for the unbounded tail), so its size
grows with the number of digits, not with hi - lo: {"minimum": 1, "maximum": 10**12} costs tens of
characters. schema.py puts it where a schema's integer carries minimum / maximum /
exclusiveMinimum / exclusiveMaximum (pydantic's ge / le / gt / lt, as instructor sends them).
Invariant (tested against int comparisons): fullmatch(int_range_regex(lo, hi), str(n)) iff lo <= n <= hi.
"""

from __future__ import annotations

from typing import Optional


def _digits(x: int, y: int) -> str:
    return str(x) if x == y else f"[{x}-{y}]"


def _same_len(a: str, b: str) -> str:
    """Decimal strings of equal length n, a <= b -> regex for the n-digit strings in [a, b]. Full tails
    ("0..0" to "9..9") become [0-9]{k}, so each level recurses into at most two one-sided ranges and the
    regex has O(n^2) size."""
    n = len(a)
    if a == b:
        return a
    full = f"[0-9]{{{n - 1}}}" if n > 1 else ""
    if a[1:] == "0" * (n - 1) and b[1:] == "9" * (n - 1):
        return _digits(int(a[0]), int(b[0])) + full
    if a[0] == b[0]:
        return a[0] + _group(_same_len(a[1:], b[1:]))
    parts, lo, hi, tail = [], int(a[0]), int(b[0]), None
    if a[1:] != "0" * (n - 1):
        parts.append(a[0] + _group(_same_len(a[1:], "9" * (n - 1))))
        lo += 1
    if b[1:] != "9" * (n - 1):
        tail = b[0] + _group(_same_len("0" * (n - 1), b[1:]))
        hi -= 1
    if lo <= hi:
        parts.append(_digits(lo, hi) + full)
    if tail is not None:
        parts.append(tail)
    return "|".join(parts)


def _group(r: str) -> str:
    return r if r.isdigit() or (r.startswith("[") and r.endswith("]") and r.count("[") == 1) else f"(?:{r})"


def _natural(lo: int, hi: Optional[int]) -> list[str]:
    """Alternatives for the non-negative integers in [lo, hi] (hi None: unbounded), lo >= 0."""
    parts = []
    top = hi if hi is not None else 10 ** len(str(lo)) - 1  # the unbounded tail starts one digit longer
    for d in range(len(str(lo)), len(str(top)) + 1):
        a = max(lo, 10 ** (d - 1) if d > 1 else 0)
        b = min(top, 10 ** d - 1)
        if a <= b:
            parts.append(_same_len(str(a), str(b)))
    if hi is None:
        parts.append(f"[1-9][0-9]{{{len(str(lo))},}}")
    return parts


def int_range_regex(lo: Optional[int], hi: Optional[int]) -> str:
    """JSON integers n with lo <= n <= hi (None: no bound on that side). ValueError when empty."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"the integer range is empty: minimum {lo} > maximum {hi}")
    parts = []
    if lo is None or lo < 0:  # negative values: -m with m in [max(1, -hi), -lo]
        m_lo = 1 if hi is None or hi >= 0 else -hi
        m_hi = None if lo is None else -lo
        parts += ["-" + _group(p) for p in _natural(m_lo, m_hi)]
    if hi is None or hi >= 0:
        parts += _natural(0 if lo is None or lo < 0 else lo, hi)
    return f"(?:{'|'.join(parts)})"
