"""One KV page record on a tier (torch-free): a fixed header, then the payload, sealed by a keyed MAC.

Header (little-endian, HEADER.size = 64 bytes): magic b"RLKV", format version (u16), reserved (u16), the
record's key (16 bytes, keys.py), payload length (u64), MAC (32 bytes): HMAC-SHA256 under the tier's MAC
key (secret.py) over the header's first 32 bytes and the payload (OpenSSL's SHA-256: SHA-NI where the CPU
has it, several times blake2b's speed in hashlib). The MAC is the record's one check: it
catches a torn or corrupt record as a CRC would, and a forged one, which a CRC would not (anyone who can
write a record file or a Redis value can compute a CRC, not a MAC without the key).
`RecordCodec.decode` checks all of it against the key the reader expects: a torn, truncated, corrupt, forged
or stale record (another format, another key under this name) raises RecordError (RecordAuthError for a
bad MAC) and the caller counts a miss.
"""

from __future__ import annotations

import hmac
import struct

from radixlang_runtime.mem.tiers.keys import FORMAT_VERSION, KEY_BYTES

MAGIC = b"RLKV"
MAC_BYTES = 32
_FIELDS = struct.Struct(f"<4sHH{KEY_BYTES}sQ")  # what the MAC covers besides the payload
HEADER = struct.Struct(f"<4sHH{KEY_BYTES}sQ{MAC_BYTES}s")


class RecordError(ValueError):
    """A record that must not be used; the message says why (truncated / magic / version / key / MAC)."""


class RecordAuthError(RecordError):
    """The record's MAC is not the one this tier's key gives: corrupt, or written without the key."""


class RecordCodec:
    """Seals and opens records with one MAC key (32 bytes, secret.py)."""

    def __init__(self, mac_key: bytes):
        if len(mac_key) != 32:
            raise ValueError("a record MAC key has 32 bytes")
        self._mac_key = mac_key

    def _mac(self, fields: bytes, payload: bytes | memoryview) -> bytes:
        h = hmac.new(self._mac_key, fields, "sha256")
        h.update(payload)
        return h.digest()

    def encode_header(self, key: bytes, payload: bytes) -> bytes:
        fields = _FIELDS.pack(MAGIC, FORMAT_VERSION, 0, key, len(payload))
        return fields + self._mac(fields, payload)

    def encode(self, key: bytes, payload: bytes) -> bytes:
        return self.encode_header(key, payload) + payload

    def decode(self, key: bytes, blob: bytes, expect_len: int | None = None) -> bytes:
        """The payload of blob, checked against key (and expect_len when given); RecordError otherwise."""
        if len(blob) < HEADER.size:
            raise RecordError(f"truncated header ({len(blob)} bytes)")
        magic, version, _, got_key, n, mac = HEADER.unpack_from(blob)
        if magic != MAGIC:
            raise RecordError("bad magic")
        if version != FORMAT_VERSION:
            raise RecordError(f"stale format version {version} (this build reads {FORMAT_VERSION})")
        if got_key != key:
            raise RecordError("stale record: its key is not the one asked for")
        if len(blob) - HEADER.size != n:
            raise RecordError(f"truncated payload ({len(blob) - HEADER.size} of {n} bytes)")
        if expect_len is not None and n != expect_len:
            raise RecordError(f"payload of {n} bytes, this model's records hold {expect_len}")
        payload = memoryview(blob)[HEADER.size:]
        if not hmac.compare_digest(self._mac(bytes(blob[:_FIELDS.size]), payload), mac):
            raise RecordAuthError("MAC mismatch (corrupt, or not written with this tier's key)")
        return bytes(payload)
