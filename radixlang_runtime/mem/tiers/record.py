"""One KV page record on a tier (torch-free): a fixed header, then the payload.

Header (little-endian, HEADER.size = 36 bytes): magic b"RLKV", format version (u16), reserved (u16),
the record's key (16 bytes, keys.py), payload length (u64), CRC-32 of the payload (u32).
`decode` checks all of it against the key the reader expects: a torn, truncated, corrupt or stale
record (another format, another key under this name) raises RecordError and the caller counts a miss.
"""

from __future__ import annotations

import struct
import zlib

from radixlang_runtime.mem.tiers.keys import FORMAT_VERSION, KEY_BYTES

MAGIC = b"RLKV"
HEADER = struct.Struct(f"<4sHH{KEY_BYTES}sQI")


class RecordError(ValueError):
    """A record that must not be used; the message says why (truncated / magic / version / key / checksum)."""


def encode_header(key: bytes, payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, FORMAT_VERSION, 0, key, len(payload), zlib.crc32(payload))


def encode(key: bytes, payload: bytes) -> bytes:
    return encode_header(key, payload) + payload


def decode(key: bytes, blob: bytes, expect_len: int | None = None) -> bytes:
    """The payload of blob, checked against key (and expect_len when given); RecordError otherwise."""
    if len(blob) < HEADER.size:
        raise RecordError(f"truncated header ({len(blob)} bytes)")
    magic, version, _, got_key, n, crc = HEADER.unpack_from(blob)
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
    if zlib.crc32(payload) != crc:
        raise RecordError("checksum mismatch")
    return bytes(payload)
