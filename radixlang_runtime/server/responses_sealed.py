"""A reasoning item's `encrypted_content` (include: ["reasoning.encrypted_content"]): the reasoning text sealed so
that a client which keeps no server state (store: false) can send the item back in a later `input` (no torch).

Not secret (a self-hosted server's client may read its own reasoning): base64 of the JSON
{"v": 1, "reasoning": text} behind an HMAC-SHA256 tag keyed by this server process. A changed byte, a token
from another server or from before a restart does not open (open_reasoning: None), and the request naming it
is a 400.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from typing import Any, Optional

_KEY = secrets.token_bytes(32)  # this process's: drawn at start, never leaves it
_TAG = 32  # bytes of the SHA-256 tag before the JSON


def seal_reasoning(text: str) -> str:
    body = json.dumps({"v": 1, "reasoning": text}, ensure_ascii=False, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(hmac.new(_KEY, body, hashlib.sha256).digest() + body).decode("ascii")


def open_reasoning(token: Any) -> Optional[str]:
    """The reasoning text sealed in `token`; None when it was not sealed here, or was changed."""
    if not isinstance(token, str) or not token.isascii():
        return None
    try:
        raw = base64.urlsafe_b64decode(token.encode("ascii"))
    except ValueError:  # binascii.Error: bad padding or length
        return None
    tag, body = raw[:_TAG], raw[_TAG:]
    if base64.urlsafe_b64encode(raw).decode("ascii") != token:  # characters the decoder skipped or cut off
        return None
    if len(raw) <= _TAG or not hmac.compare_digest(tag, hmac.new(_KEY, body, hashlib.sha256).digest()):
        return None
    sealed = json.loads(body)  # ours (the tag holds): the shape seal_reasoning wrote
    return sealed["reasoning"]
