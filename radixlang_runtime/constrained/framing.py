"""Length-prefixed msgpack frames over a pipe (the compile worker's link). Stdlib + msgpack only.

A frame is a 4-byte big-endian length, then that many bytes of msgpack (a map). Frames are read
with FrameReader.feed(chunk) -> the complete messages so far, so the reader decides how to wait
(the parent waits with select and a deadline; the child blocks).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import msgpack

MAX_FRAME = 4 << 30


def encode_frame(msg: dict[str, Any]) -> bytes:
    body = msgpack.packb(msg, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def write_frame(fd: int, msg: dict[str, Any]) -> None:
    view = memoryview(encode_frame(msg))
    while view:
        n = os.write(fd, view)
        view = view[n:]


class FrameReader:
    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        self._buf += chunk
        out = []
        while len(self._buf) >= 4:
            n = int.from_bytes(self._buf[:4], "big")
            if n > MAX_FRAME:
                raise ValueError(f"frame of {n} bytes")
            if len(self._buf) < 4 + n:
                break
            out.append(msgpack.unpackb(bytes(self._buf[4:4 + n]), raw=False, strict_map_key=False))
            del self._buf[:4 + n]
        return out


def read_frame_blocking(fd: int, reader: FrameReader, pending: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """Next message from fd (blocking); None at end of file."""
    while not pending:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return None
        pending.extend(reader.feed(chunk))
    return pending.pop(0)
