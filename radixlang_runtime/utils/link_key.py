"""LinkKey: a shared secret checked on a ZeroMQ link before anything a message carries is decoded.

One mechanism for both links that take messages from a network port:
- the DSL's link (server/frontend_zmq.py, --api-key): the key travels inside the msgpack body as
  FrontendReq's last field, so a message that carries key K ends with K's msgpack string (`tail`);
  `ends_with_key` compares that tail in constant time before the body is decoded; `holds` checks the
  decoded field (the tail is a filter, the field the rule);
- the PD bootstrap link (disagg/link.py, --disaggregation-secret): every message travels behind a tag
  frame, HMAC-SHA256 of the secret over the message's header frame and its payload's length (`tag`);
  `tagged` compares it in constant time before the header is decoded. The secret itself never crosses
  the wire; the K/V payload is not hashed (its bytes would cost the decode's core as much as the copy).

Both comparisons are hmac.compare_digest over a few dozen bytes: cheap enough to run on every message
of a flood, which is why they come before msgpack.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Optional

import msgpack

TAG_BYTES = 32  # HMAC-SHA256


class LinkKey:
    def __init__(self, key: str):
        if not isinstance(key, str) or not key:
            raise ValueError("a link key must be a non-empty string")
        self._key = key.encode()
        self.tail = msgpack.packb(key, use_bin_type=True)  # what a FrontendReq carrying the key ends with

    # ------------------------------------------------------------------ the key inside the message (DSL link)
    def ends_with_key(self, data: Any) -> bool:
        """Whether data (bytes / memoryview) ends with the key's msgpack string."""
        n = len(self.tail)
        return len(data) >= n and hmac.compare_digest(bytes(data[-n:]), self.tail)

    def holds(self, key: Any) -> bool:
        """Whether a decoded key field is the key."""
        return isinstance(key, str) and hmac.compare_digest(key.encode(), self._key)

    # ------------------------------------------------------------------ a tag frame (PD link)
    def tag(self, header: Any, payload_len: int = 0) -> bytes:
        mac = hmac.new(self._key, bytes(header), hashlib.sha256)
        mac.update(payload_len.to_bytes(8, "little"))
        return mac.digest()

    def tagged(self, tag: Any, header: Any, payload_len: int = 0) -> bool:
        """Whether tag is header's (and the payload length's) HMAC under this key."""
        return len(tag) == TAG_BYTES and hmac.compare_digest(bytes(tag), self.tag(header, payload_len))


def link_key(key: Optional[str]) -> Optional[LinkKey]:
    """None for no key (every sender is let through), else the LinkKey."""
    return LinkKey(key) if key else None
