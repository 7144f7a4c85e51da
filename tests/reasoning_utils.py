"""What the reasoning-parser tests share: a parser fed in pieces."""

from __future__ import annotations

from typing import Optional

from radixlang_runtime.reasoning_parser import Split, get_reasoning_parser


def stream(name: str, pieces: list[str], begins: Optional[str] = None) -> Split:
    """The split of parser `name` (beginning where `begins` says; None: its default) fed `pieces` one by one."""
    p = get_reasoning_parser(name)(begins)
    out = Split()
    for piece in pieces:
        out += p.feed(piece)
    out += p.finish()
    return out
