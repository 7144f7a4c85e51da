"""Every message that crosses a process boundary, as typed dataclasses encoded with msgpack.

Torch-free (the DSL's ZeroMQ backend imports it). Links:
  tokenizer manager -> scheduler:   TokenizedGenerateReq, TokenizedBatchReq, AbortReq, FlushCacheReq, GetStatsReq,
                                    PinPrefixReq, UnpinPrefixReq
  scheduler -> detokenizer:         BatchTokenIDOut
  detokenizer -> tokenizer manager: BatchStrOut
  scheduler -> tokenizer manager:   FlushCacheOut, StatsOut, ErrorOut, PinPrefixOut, UnpinPrefixOut
  decode scheduler -> prefill bootstrap (PD, disagg/): PDRegister, PDAck, PDCancel, PDPing
  prefill bootstrap -> decode scheduler (PD, disagg/):  PDKVChunk, PDDone, PDFail, PDPong
`encode` writes [type name, field values in declaration order]; a field declared with `_record` holds a
nested record (ReqTokenOut, ...) or a list of them, written as its own field values the same way; `decode`
rebuilds the dataclasses from the declarations and rejects unknown types. Never pickle: a message is
data, not code.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import msgpack

from radixlang_runtime.protocol.bootstrap_peers import Bootstrap


def _record(cls: Union[type, str], many: bool = False, **kw: Any) -> Any:
    """A field holding a nested record (or a list of them, many=True): encoded as its field values, rebuilt as
    `cls` on decode (no type name travels: the field says what it holds). A record class with its own
    `to_wire()` / `from_wire(values)` (SamplingParams, PoolSpec) is written and read by them. `cls` may be
    "module:Class", imported on first use (the DSL imports this module and never sends such a message)."""
    return field(metadata={"record": cls, "many": many}, **kw)


@dataclass
class TokenizedGenerateReq:
    """One runtime request, validated by its sender (generate_input.py): the scheduler takes it as it is."""

    rid: str
    input_ids: list[int]
    # SamplingParams with its grammar spec (GrammarSpec, built at intake; None: unconstrained)
    sampling_params: Any = _record("radixlang_runtime.protocol.sampling_params:SamplingParams")
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = 0  # validated: < len(input_ids)
    top_logprobs_num: int = 0
    # PD (disaggregation_mode prefill / decode): where the K/V comes from / goes to
    bootstrap: Optional[Bootstrap] = _record(Bootstrap, default=None)
    # a prefill-only request returning a pooled vector (pooling.PoolSpec)
    pooling: Any = _record("radixlang_runtime.pooling:PoolSpec", default=None)
    lora_id: int = 0  # the LoRA adapter it runs (lora_spec.py; 0: the base model)
    priority: int = 0  # its place in the waiting queue under --enable-priority-scheduling (preemption.PriorityRule)
    cache_salt: Optional[str] = None  # its prefix cache namespace (request_extras.py; None: the shared one)
    return_hidden_states: bool = False  # meta_info.hidden_states (scheduler/hidden_states.py)
    # its images (input_ids hold their pad ids at their positions: protocol/image_input.py)
    images: list = _record("radixlang_runtime.protocol.image_input:ImageInput", many=True, default_factory=list)


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
    owner: str = ""  # who may unpin it (services.pin_owner; "": anyone)


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
    owner: str = ""  # must be the pin's owner


@dataclass
class UnpinPrefixOut:
    req_id: str
    success: bool  # False: no such pin of this owner (unknown, already unpinned, expired, another owner's)


@dataclass
class LoadLoraReq:
    """Load a LoRA adapter (a peft directory) at run time; its id is the runner's next (ids are never reused)."""

    req_id: str
    lora_name: str
    lora_path: str


@dataclass
class LoadLoraOut:
    req_id: str
    lora_id: int  # 0: not loaded (error says why)
    error: Optional[str] = None


@dataclass
class UnloadLoraReq:
    """Drop adapter lora_id's weights if no request of it is queued or running."""

    req_id: str
    lora_id: int


@dataclass
class UnloadLoraOut:
    req_id: str
    success: bool  # False: requests of the adapter are still queued or running (ask again)


@dataclass
class UpdateWeightsReq:
    """Replace the served weights with model_path's checkpoint (model/executor/weight_update.py); only while
    the scheduler is idle, then the prefix cache is flushed."""

    req_id: str
    model_path: str
    load_format: Optional[str] = None


@dataclass
class UpdateWeightsOut:
    req_id: str
    success: bool
    message: str


@dataclass
class GetWeightsReq:
    """A served parameter by its checkpoint name, its first truncate_size entries along dim 0."""

    req_id: str
    name: str
    truncate_size: int = 100


@dataclass
class GetWeightsOut:
    req_id: str
    values: Optional[list] = None  # None: refused (error says why)
    error: Optional[str] = None


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
class ReqConsts:
    """What stays fixed for a request's whole life and the detokenizer needs: sent once, in its first
    ReqTokenOut (prompt_tokens is not here: the tokenizer manager has the prompt)."""

    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False


@dataclass
class ReqProgress:
    """One request's progress since its previous record; the counters are totals so far (small ints).
    Logprobs (None for requests that did not ask): input ones whole, in the first record of a request;
    output ones as deltas aligned with new_ids. Values and [[logprob, id], ...] top rows. The detokenizer
    passes it on unchanged (scheduler -> detokenizer -> tokenizer manager)."""

    new_ids: list[int]  # tokens since the previous record for that request
    finished_reason: Optional[dict[str, Any]] = None
    completion_tokens: int = 0
    cached_tokens: int = 0
    num_retractions: int = 0
    queue_time: float = 0.0  # seconds from arrival at the scheduler to first admission (0 until admitted)
    forced_tokens: int = 0  # jump-forward tokens so far (meta_info.forced_tokens)
    forward_passes: int = 0  # forward steps so far (meta_info.forward_passes)
    spec_draft_tokens: int = 0  # n-gram draft tokens verified so far
    spec_accepted_tokens: int = 0  # of which accepted (meta_info, same names)
    input_logprobs: Optional[list[float]] = None
    input_top_logprobs: Optional[list] = None
    output_logprobs: Optional[list[float]] = None
    output_top_logprobs: Optional[list] = None
    embedding: Optional[list[float]] = None  # a pooling request's result, in its final record (pooling.py)
    input_ranks: Optional[list[int]] = None  # each input_logprobs token's rank in the vocabulary (1: the top)
    # return_hidden_states, in the final record: [prompt rows, then a row per generated token but the last]
    hidden_states: Optional[list] = None


@dataclass
class ReqTokenOut:
    """Scheduler -> detokenizer: one request's new tokens after one scheduler step (built by keyword in
    scheduler/loop.py). consts: in the request's first record only."""

    rid: str
    progress: ReqProgress = _record(ReqProgress)
    stop_from_end: int = 0  # Req.stop_from_end (0: no stop string)
    consts: Optional[ReqConsts] = _record(ReqConsts, default=None)


@dataclass
class ReqStrOut:
    """Detokenizer -> tokenizer manager: one request's new text. The text so far becomes
    text_so_far[: len - trim] + text; trim > 0 only in a final record whose stop string was cut from
    text already sent (then text is ""); a stream that already showed those characters keeps them."""

    rid: str
    text: str
    progress: ReqProgress = _record(ReqProgress)
    trim: int = 0


@dataclass
class TokenizedBatchReq:
    """Several requests in one message: the scheduler drains them together (one prefill batch where its
    budgets allow): a pooling call's inputs."""

    reqs: list[TokenizedGenerateReq] = _record(TokenizedGenerateReq, many=True, default_factory=list)


@dataclass
class BatchTokenIDOut:
    """New output tokens of some requests after one scheduler step (one record per request)."""

    reqs: list[ReqTokenOut] = _record(ReqTokenOut, many=True, default_factory=list)


@dataclass
class BatchStrOut:
    """Detokenized progress of some requests (one record per request, text as deltas)."""

    reqs: list[ReqStrOut] = _record(ReqStrOut, many=True, default_factory=list)


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


# ------------------------------------------------------------------ prefill-decode transfer (disagg/)
@dataclass
class PDRegister:
    """Decode -> prefill: room's slots are allocated; send K/V of positions prefix_len .. total_len - 1.
    token_bytes: one token's K/V for all layers in the decode's pool (the layouts must agree). adapter: the
    content identity of the request's LoRA adapter on the decode ("" the base; disagg/adapters.py)."""

    room: int
    prefix_len: int
    total_len: int
    token_bytes: int
    adapter: str = ""


@dataclass
class PDKVChunk:
    """Prefill -> decode: K/V of positions start .. start + len(payload) // token_bytes - 1, token after token,
    each [2, layers, kv_heads, 1, head_dim] (mem/kv_records.py with one-token records). The PD link sends the
    payload as a frame of its own; received, it is a memoryview of that frame (disagg/link.py). state: the
    payload is instead bytes start .. of a hybrid model's recurrent state after the prompt (mem/state_records.py)."""

    room: int
    start: int
    payload: bytes
    state: bool = False


@dataclass
class PDDone:
    """Prefill -> decode: every chunk of room is sent; the first token (None: max_new_tokens 0) and its logprobs."""

    room: int
    first_token: Optional[int]
    cached_len: int  # the prefill's cache hit (meta_info.cached_tokens)
    output_logprob: Optional[float] = None
    output_top: Optional[list] = None
    input_logprobs: Optional[list[float]] = None
    input_top: Optional[list] = None
    adapter: str = ""  # the identity of the LoRA adapter the K/V was computed under ("" the base)
    input_ranks: Optional[list] = None  # the prompt tokens' ranks, aligned with input_logprobs


@dataclass
class PDAck:
    """Decode -> prefill: room's K/V and first token arrived whole (the prefill's request ends now)."""

    room: int


@dataclass
class PDCancel:
    """Decode -> prefill: room failed or was aborted on the decode side."""

    room: int
    message: str = ""


@dataclass
class PDFail:
    """Prefill -> decode: room failed on the prefill side (message names the cause)."""

    room: int
    message: str


@dataclass
class PDPing:
    """Decode -> prefill heartbeat (answered by the bootstrap thread, never by the scheduler loop)."""

    seq: int = 0


@dataclass
class PDPong:
    seq: int = 0


PD_MESSAGES = (PDRegister, PDKVChunk, PDDone, PDAck, PDCancel, PDFail, PDPing, PDPong)
MESSAGES = (TokenizedGenerateReq, TokenizedBatchReq, AbortReq, FlushCacheReq, FlushCacheOut, GetStatsReq, StatsOut,
            ErrorOut, BatchTokenIDOut, BatchStrOut, PinPrefixReq, PinPrefixOut, UnpinPrefixReq, UnpinPrefixOut,
            SchedulerHeartbeat, LoadLoraReq, LoadLoraOut, UnloadLoraReq, UnloadLoraOut, UpdateWeightsReq,
            UpdateWeightsOut, GetWeightsReq, GetWeightsOut, *PD_MESSAGES)
FRONTEND_MESSAGES = (FrontendReq, FrontendOut)  # the DSL's ZeroMQ link (tests/dsl/test_dsl_messages.py)
_BY_NAME = {cls.__name__: cls for cls in MESSAGES + FRONTEND_MESSAGES}
RECORDS = (ReqConsts, ReqProgress, ReqTokenOut, ReqStrOut, Bootstrap)  # nested inside messages, never sent alone
# per class: (field name, record class or None, whether a list of them) in declaration order
_SPECS: dict[type, list[tuple[str, Optional[type], bool]]] = {
    cls: [(f.name, f.metadata.get("record"), f.metadata.get("many", False)) for f in dataclasses.fields(cls)]
    for cls in MESSAGES + FRONTEND_MESSAGES + RECORDS}


@functools.cache
def _record_class(rec: Union[type, str]) -> type:
    if isinstance(rec, str):
        module, _, name = rec.partition(":")
        return getattr(importlib.import_module(module), name)
    return rec


def _encode_record(obj: Any) -> Any:
    return obj.to_wire() if hasattr(type(obj), "from_wire") else _values(obj)


def _decode_record(rec: Union[type, str], values: Any) -> Any:
    cls = _record_class(rec)
    return cls.from_wire(values) if hasattr(cls, "from_wire") else _build(cls, values)


def _values(obj: Any) -> list:
    out = []
    for name, rec, many in _SPECS[type(obj)]:
        v = getattr(obj, name)
        if rec is not None and v is not None:
            v = [_encode_record(r) for r in v] if many else _encode_record(v)
        out.append(v)
    return out


def _build(cls: type, values: Any) -> Any:
    spec = _SPECS[cls]
    if not isinstance(values, list) or len(values) > len(spec):
        raise ValueError(f"malformed {cls.__name__}")
    args = []
    for (_name, rec, many), v in zip(spec, values):
        if rec is not None and v is not None:
            if many and not isinstance(v, list):
                raise ValueError(f"malformed {cls.__name__}")
            try:
                v = [_decode_record(rec, r) for r in v] if many else _decode_record(rec, v)
            except (TypeError, KeyError, IndexError) as e:
                raise ValueError(f"malformed {cls.__name__}: {type(e).__name__}: {e}") from None
        args.append(v)
    return cls(*args)


def rids_of(data: bytes) -> list[str]:
    """The request id(s) a message that did not decode was about, where its envelope still reads (a
    TokenizedGenerateReq's first field): the receiver fails them rather than losing them. [] otherwise."""
    try:
        name, values = msgpack.unpackb(data, raw=False, strict_map_key=False)
        if name == "TokenizedGenerateReq" and isinstance(values[0], str):
            return [values[0]]
        if name == "TokenizedBatchReq":
            return [r[0] for r in values[0] if isinstance(r, list) and r and isinstance(r[0], str)]
    except Exception:  # noqa: BLE001 - not even the envelope: nothing to answer
        pass
    return []


def encode(msg: Any) -> bytes:
    cls = type(msg)
    if _BY_NAME.get(cls.__name__) is not cls:
        raise TypeError(f"not a message type: {cls.__name__}")
    return msgpack.packb([cls.__name__, _values(msg)], use_bin_type=True)


def decode(data: bytes) -> Any:
    name, values = msgpack.unpackb(data, raw=False, strict_map_key=False)
    cls = _BY_NAME.get(name)
    if cls is None:
        raise ValueError(f"unknown message type {name!r}")
    return _build(cls, values)


__all__ = [c.__name__ for c in MESSAGES + FRONTEND_MESSAGES + RECORDS] + ["encode", "decode", "rids_of", "MESSAGES",
                                                                        "FRONTEND_MESSAGES", "RECORDS"]
