"""The PD link's frames: a message to frames and back, each received message checked cheapest first.

On the wire a message is [encode(msg)], or for a PDKVChunk [its header, its payload] (the payload a frame of
its own, so the receiver writes from ZeroMQ's buffer). With a secret (--disaggregation-secret) a tag frame
goes first: link_key.LinkKey.tag, the HMAC of the header and the payload's length.

A received message passes, in order (each step cheaper than the next, so a flood costs little):
1. the frame count and the frames' sizes;
2. the tag (constant-time compare), when the link has a secret;
3. msgpack (messages.decode, whose limits are the frame's own size) and the message type;
4. the fields: ints where ints belong, rooms in [0, 2**63), positions and lengths >= 0, strings.
A message failing a step raises WireError naming the step (`reason`): the link drops and counts it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import zmq

from radixlang_runtime.disagg.adapters import IDENTITY_MAX
from radixlang_runtime.utils.link_key import LinkKey
from radixlang_runtime.protocol.messages import (PD_MESSAGES, PDAck, PDCancel, PDDone, PDFail, PDKVChunk, PDRegister,
                                                 decode, encode)

MAX_HEADER_BYTES = 64 << 20  # a PDDone carrying a long prompt's input logprobs stays far below this
MAX_PAYLOAD_BYTES = 64 << 20  # one PDKVChunk (the prefill sends <= 1 MiB, at least one token's records)
ROOM_MAX = 2**63 - 1


class WireError(ValueError):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def to_frames(msg: Any, key: Optional[LinkKey] = None) -> list[bytes]:
    """A message's frames on the wire: [encode(msg)], or for a PDKVChunk [its header, its payload]; with a
    key, its tag frame first."""
    if isinstance(msg, PDKVChunk):
        frames = [encode(dataclasses.replace(msg, payload=b"")), msg.payload]
    else:
        frames = [encode(msg)]
    if key is not None:
        frames.insert(0, key.tag(frames[0], len(frames[1]) if len(frames) == 2 else 0))
    return frames


def _raw(frame: Any) -> Any:
    return frame.buffer if isinstance(frame, zmq.Frame) else frame


def from_frames(frames: list[Any], key: Optional[LinkKey] = None) -> Any:
    """to_frames' inverse over received frames (bytes or zmq.Frame), checked (module docstring): a chunk's
    payload is a memoryview of its frame. WireError (a ValueError) for a message that fails a check."""
    first = 0 if key is None else 1
    body = [_raw(f) for f in frames[first:]]
    if len(frames) <= first or len(body) > 2:
        raise WireError("frames", f"a message of {len(frames)} frames")
    if len(body[0]) > MAX_HEADER_BYTES or (len(body) == 2 and len(body[1]) > MAX_PAYLOAD_BYTES):
        raise WireError("size", f"frames of {[len(b) for b in body]} bytes")
    if key is not None and not key.tagged(_raw(frames[0]), body[0], len(body[1]) if len(body) == 2 else 0):
        raise WireError("secret", "the tag does not match --disaggregation-secret")
    try:
        msg = decode(body[0])
    except Exception as e:  # noqa: BLE001 - whatever msgpack or the record builder raise
        raise WireError("decode", f"not a message: {e!r}") from None
    if type(msg) not in PD_MESSAGES:
        raise WireError("type", f"{type(msg).__name__} is not a PD message")
    if len(body) == 2:
        if not isinstance(msg, PDKVChunk) or msg.payload:
            raise WireError("frames", f"{type(msg).__name__} in {len(frames)} frames")
        msg.payload = body[1]
    if (why := shape_problem(msg)) is not None:
        raise WireError("shape", why)
    return msg


def _int(v: Any, lo: int = 0, hi: int = ROOM_MAX) -> bool:
    return type(v) is int and lo <= v <= hi


def _identity(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= IDENTITY_MAX


def shape_problem(msg: Any) -> Optional[str]:
    """What is wrong with a decoded PD message's field types, or None. Values against a request (lengths,
    the first token's range) are the roles' to check."""
    room = getattr(msg, "room", 0)
    if not _int(room):
        return f"{type(msg).__name__}: room must be an int in [0, 2**63)"
    if isinstance(msg, PDRegister):
        ok = _int(msg.prefix_len) and _int(msg.total_len) and _int(msg.token_bytes, 1) and _identity(msg.adapter)
    elif isinstance(msg, PDKVChunk):
        ok = _int(msg.start) and isinstance(msg.payload, (bytes, bytearray, memoryview)) and type(msg.state) is bool
    elif isinstance(msg, PDDone):
        ok = (msg.first_token is None or _int(msg.first_token)) and _int(msg.cached_len) \
            and (msg.output_logprob is None or isinstance(msg.output_logprob, (int, float))) \
            and all(v is None or isinstance(v, list) for v in (msg.output_top, msg.input_logprobs, msg.input_top,
                                                            msg.input_ranks)) \
            and _identity(msg.adapter)
    elif isinstance(msg, (PDFail, PDCancel)):
        ok = isinstance(msg.message, str)
    elif isinstance(msg, PDAck):
        ok = True
    else:  # PDPing / PDPong
        ok = _int(msg.seq, 0, 2**64 - 1)
    return None if ok else f"{type(msg).__name__}: a field of the wrong type or range"
