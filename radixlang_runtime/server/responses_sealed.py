"""A reasoning item's `encrypted_content` (include: ["reasoning.encrypted_content"]): the reasoning text sealed so
that a client which keeps no server state (store: false) can send the item back in a later `input` (no torch).

Not secret (a self-hosted server's client may read its own reasoning): base64 of the JSON
{"v": 1, "reasoning": text} behind an HMAC-SHA256 tag. The key is this machine's: drawn once and kept in
`cache_root()/responses_seal.key` (mode 0600; RADIXLANG_CACHE_DIR moves it), so a restarted server opens what
it sealed before; where that file cannot be written, the key is this process's alone. A changed byte or a
token from another machine's key does not open (open_reasoning: None), and the request naming it is a 400.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import secrets
from typing import Any, Optional

from radixlang_runtime.model.loader.resolve import cache_root

logger = logging.getLogger(__name__)
_TAG = 32  # bytes of the SHA-256 tag before the JSON
_KEY_BYTES = 32


def machine_key(path: Optional[str] = None) -> bytes:
    """The sealing key kept at `path` (default: under cache_root()), made on first use; a fresh key for this
    process alone where the file can be neither read nor written."""
    path = path or os.path.join(cache_root(), "responses_seal.key")
    try:
        with open(path, "rb") as f:
            key = f.read()
        if len(key) == _KEY_BYTES:
            return key
    except OSError:
        pass
    key = secrets.token_bytes(_KEY_BYTES)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        try:
            os.link(tmp, path)  # the first writer's key wins: a racing server reads it back
        except FileExistsError:
            pass
        os.unlink(tmp)
        with open(path, "rb") as f:
            key = f.read()
    except OSError as e:
        logger.warning("responses: sealed reasoning uses a key of this process only (%s cannot be written: %s)",
                       path, e)
    return key


_KEY = machine_key()


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
