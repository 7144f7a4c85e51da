"""Every message that crosses a process boundary, as typed dataclasses encoded with msgpack.

Torch-free (the DSL's ZeroMQ backend imports it). Links:
  tokenizer manager -> scheduler:   TokenizedGenerateReq, AbortReq, FlushCacheReq, GetStatsReq,
                                    PinPrefixReq, UnpinPrefixReq
  scheduler -> detokenizer:         BatchTokenIDOut
  detokenizer -> tokenizer manager: BatchStrOut
  scheduler -> tokenizer manager:   FlushCacheOut, StatsOut, ErrorOut, PinPrefixOut, UnpinPrefixOut
`encode` writes [type name, field values in declaration order]; `decode` rebuilds the dataclass and
rejects unknown types. Never pickle: a message is data, not code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

import msgpack


@dataclass
class TokenizedGenerateReq:
    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]  # SamplingParams.to_wire(), validated by the sender; from_wire on arrival
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = 0  # validated: < len(input_ids)
    top_logprobs_num: int = 0
    grammar: Optional[list] = None  # GrammarSpec.to_wire() built at intake (None: unconstrained)


@dataclass
class AbortReq:
    rid: str


@dataclass
class FlushCacheReq:
    req_id: str
    tiers: Optional[list[str]] = None  # hicache tiers to clear ("l1", "l2", "l3"); None: all


@dataclass
class FlushCacheOut:
    req_id: str
    success: bool


@dataclass
class GetStatsReq:
    req_id: str
    detail: str = ""  # "dashboard": also the live view's state (scheduler/dashboard_state.py)
    with_ids: bool = False  # the dashboard's tree nodes carry their first token ids (--dashboard-show-text)


@dataclass
class StatsOut:
    req_id: str
    stats: dict[str, Any]


@dataclass
class PinPrefixReq:
    """Lock the longest cached prefix of input_ids in the radix cache (KVManager.pin); ttl_s: it
    expires after that many seconds (None: until UnpinPrefixReq)."""

    req_id: str
    input_ids: list[int]
    ttl_s: Optional[float] = None


@dataclass
class PinPrefixOut:
    req_id: str
    pin_id: Optional[str]  # None when refused (error says why)
    pinned_len: int = 0  # page-aligned tokens locked (0: nothing of it was cached)
    error: Optional[str] = None


@dataclass
class UnpinPrefixReq:
    req_id: str
    pin_id: str


@dataclass
class UnpinPrefixOut:
    req_id: str
    success: bool  # False: no such pin (unknown, already unpinned or expired)


@dataclass
class ErrorOut:
    """These requests ended with an error; they are finished. status: 500 an internal fault, 400 the
    request's own (a grammar that does not compile)."""

    rids: list[str]
    message: str
    status: int = 500


@dataclass
class SchedulerHeartbeat:
    """Scheduler -> tokenizer manager, at least every lifecycle.HEARTBEAT_S while the scheduler's loop
    turns: /health reports a replica stuck when it has requests in flight and sends none (lifecycle.py)."""

    replica: int


@dataclass
class BatchTokenIDOut:
    """New output tokens of some requests after one scheduler step (one entry per request)."""

    rids: list[str]
    new_ids: list[list[int]]  # tokens since the previous message for that request
    finished_reasons: list[Optional[dict[str, Any]]]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    num_retractions: list[int]
    queue_times: list[float]  # seconds from arrival at the scheduler to first admission (0 until admitted)
    skip_special_tokens: list[bool]
    spaces_between_special_tokens: list[bool]
    no_stop_trim: list[bool]
    # Logprobs (None for requests that did not ask): input ones whole, in the first message of a request;
    # output ones as deltas aligned with new_ids. Values and [[logprob, id], ...] top rows.
    input_logprobs: list[Optional[list[float]]] = field(default_factory=list)
    input_top_logprobs: list[Optional[list]] = field(default_factory=list)
    output_logprobs: list[Optional[list[float]]] = field(default_factory=list)
    output_top_logprobs: list[Optional[list]] = field(default_factory=list)
    stop_from_end: list[int] = field(default_factory=list)  # Req.stop_from_end (0: no stop string)
    forced_tokens: list[int] = field(default_factory=list)  # jump-forward tokens so far (meta_info.forced_tokens)
    forward_passes: list[int] = field(default_factory=list)  # forward steps so far (meta_info.forward_passes)
    spec_draft_tokens: list[int] = field(default_factory=list)  # n-gram draft tokens verified so far
    spec_accepted_tokens: list[int] = field(default_factory=list)  # of which accepted (meta_info, same names)


@dataclass
class BatchStrOut:
    """Detokenized progress. text: the new text since the previous message, or, when text_is_full,
    the whole text (sent once, at the finish, when a stop string was trimmed from it)."""

    rids: list[str]
    texts: list[str]
    text_is_full: list[bool]
    new_ids: list[list[int]]
    finished_reasons: list[Optional[dict[str, Any]]]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    num_retractions: list[int]
    queue_times: list[float]
    input_logprobs: list[Optional[list[float]]] = field(default_factory=list)
    input_top_logprobs: list[Optional[list]] = field(default_factory=list)
    output_logprobs: list[Optional[list[float]]] = field(default_factory=list)
    output_top_logprobs: list[Optional[list]] = field(default_factory=list)
    forced_tokens: list[int] = field(default_factory=list)
    forward_passes: list[int] = field(default_factory=list)
    spec_draft_tokens: list[int] = field(default_factory=list)
    spec_accepted_tokens: list[int] = field(default_factory=list)


@dataclass
class FrontendReq:
    """DSL client -> server frontend socket (server/frontend_zmq.py). method: generate (body = the
    native /generate JSON body), model_info, server_info, flush_cache, abort ({"req_id"}),
    concate_and_append, pin_prefix, unpin_prefix, ping. api_key: the --api-key rule of HTTP; it stays
    the last field (the frontend checks a message's tail for the key before decoding it)."""

    req_id: str
    method: str
    body: Any = None
    api_key: Optional[str] = None


@dataclass
class FrontendOut:
    """Server frontend socket -> DSL client: one reply (or one stream event) for req_id. status is
    HTTP's (200, 400, 401, 404, 503); body the /generate JSON result / event or {"error": {...}};
    done marks the last message for that req_id."""

    req_id: str
    status: int
    body: Any = None
    done: bool = True


MESSAGES = (TokenizedGenerateReq, AbortReq, FlushCacheReq, FlushCacheOut, GetStatsReq, StatsOut, ErrorOut,
            BatchTokenIDOut, BatchStrOut, PinPrefixReq, PinPrefixOut, UnpinPrefixReq, UnpinPrefixOut,
            SchedulerHeartbeat)
FRONTEND_MESSAGES = (FrontendReq, FrontendOut)  # the DSL's ZeroMQ link (tests/test_dsl_messages.py)
_BY_NAME = {cls.__name__: cls for cls in MESSAGES + FRONTEND_MESSAGES}
_FIELDS = {cls: [f.name for f in dataclasses.fields(cls)] for cls in MESSAGES + FRONTEND_MESSAGES}


def encode(msg: Any) -> bytes:
    cls = type(msg)
    if cls not in _FIELDS:
        raise TypeError(f"not a message type: {cls.__name__}")
    return msgpack.packb([cls.__name__, [getattr(msg, n) for n in _FIELDS[cls]]], use_bin_type=True)


def decode(data: bytes) -> Any:
    name, values = msgpack.unpackb(data, raw=False, strict_map_key=False)
    cls = _BY_NAME.get(name)
    if cls is None:
        raise ValueError(f"unknown message type {name!r}")
    return cls(*values)


__all__ = [c.__name__ for c in MESSAGES + FRONTEND_MESSAGES] + ["encode", "decode", "MESSAGES", "FRONTEND_MESSAGES"]
