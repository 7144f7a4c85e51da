"""llama.cpp server's /infill: code infilling with the served model's fill-in-the-middle template.

POST /infill {"input_prefix": str, "input_suffix": str, "input_extra": [{"filename": str, "text": str, "time": any},
...], "prompt": str, "n_predict": int, sampling fields, "stream": bool, llama.cpp's limits and response_fields}.
The prompt is the one /v1/completions runs for a `suffix` (fim_templates.FimPrompt: BOS, the template's markers
as ids, the texts plain), with llama.cpp's additions (its format_infill): `prompt` is tokenized after the prefix
(the text already typed at the cursor), and `input_extra` goes before the template in the repo-level layout: the
repository-name token and llama.cpp's project line "myproject\n" (where the tokenizer has that token), then per
chunk the file separator token, its file name and a newline, then its text, then the separator and llama.cpp's
current-file line "filename\n" (a tokenizer without the separator token gets each chunk after llama.cpp's text
separator "\n\n--- snippet ---\n\n" instead, and no current-file line; a chunk's time is the client's bookkeeping,
taken whatever it holds, as llama.cpp). Without input_extra none of it is written, so the prompt is the
completion's (llama.cpp writes the project and current-file lines there too). It runs as one completion through
the OpenAI path's choices (openai_intake.Choices).

Cut to fit, as llama.cpp's format_infill (fit): with n_batch the longest prefill chunk of one request
(--chunked-prefill-size, else --max-prefill-tokens; at most the context) and n_ctx the context a request may fill,
the prefix keeps its last 3 * (n_batch // 4) tokens (nearest the cursor), the suffix its first
n_batch // 4 - 2 - (the prompt's tokens), and the input_extra layout its last n_ctx - n_batch - 2 * n_predict
(n_predict unset: 0), dropping the oldest chunks (and the project line) first; the prompt is never cut. A prompt
still past the context is refused as any other.

Sampling takes llama.cpp's names: n_predict (-1 or absent: until the end token or the context is full),
temperature, top_k, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty, stop, seed (-1: random),
ignore_eos; unset ones take the server's defaults, as /v1/completions does. cache_prompt is taken and changes
nothing (the radix cache always reuses a cached prefix). samplers, penalty_last_n, response_fields, n_indent,
t_max_prompt_ms and t_max_predict_ms are infill_fields.py's; the three limits run on the route's side of the
stream (infill_stops.py: reaching one ends the request as finished with a "length" finish reason, its memory freed,
and stops reading). Fields are strict: any other answers 400 naming it.

The answer is llama.cpp's /infill shape, the fields this server can fill: index, content (the middle), stop,
model, tokens_predicted, tokens_evaluated, tokens_cached, stop_type ("eos", "word", "limit"), stopping_word,
truncated (always false, as llama.cpp's: the cut to fit is no truncation), timings (infill_stops.py), cut to
response_fields' paths. With stream: true each `data:` event carries the next content with stop false, the last
one stop true and the rest of the fields (no [DONE], as llama.cpp). Both run the request as a stream, which the
limits need.
"""

from __future__ import annotations

import time
import uuid
from contextlib import aclosing
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, AsyncIterator, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixlang_runtime.fim_templates import no_fim_message
from radixlang_runtime.protocol.limits import MAX_BATCH, FieldError, need_bool, need_float, need_int, need_str, show
from radixlang_runtime.server.client_watch import unless_client_gone
from radixlang_runtime.server.http_common import (BadRequest, ServerState, client_gone_counter, guard_stream,
                                                  read_json, sse, stream_response)
from radixlang_runtime.server.infill_fields import (LLAMA_FIELDS, apply_penalty_last_n, apply_samplers, limits,
                                                    pick, response_fields)
from radixlang_runtime.server.infill_stops import InfillStops
from radixlang_runtime.server.openai_intake import Choices
from radixlang_runtime.server.openai_records import OpenAIOptions, sampling_fields

# fields whose name and meaning are the same in llama.cpp and OpenAI (openai_records.sampling_fields checks them)
_SHARED = ("temperature", "top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty", "stop", "seed",
           "ignore_eos")
INFILL_FIELDS = {"input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "repeat_penalty", "stream",
                 "cache_prompt", *_SHARED, *LLAMA_FIELDS}

router = APIRouter()
# llama.cpp's placeholders in the repo-level layout: the project's name after the repository-name token, and the
# current file's name after the last file separator (format_infill's "myproject\n" and "filename\n")
REPO_LINE, FILE_LINE = "myproject\n", "filename\n"
SNIPPET = "\n\n--- snippet ---\n\n"  # a chunk's separator where the tokenizer has no file separator token
LIMIT_FINISH = {"type": "length"}  # a route-side limit's finish reason: stop_type "limit", as the runtime's length


@dataclass(frozen=True)
class InfillRequest:
    prefix: str
    suffix: str
    extra: tuple[tuple[str, str], ...]  # (filename, text) per context chunk
    prompt: str  # llama.cpp's text after the prefix
    options: OpenAIOptions  # max_tokens: n_predict (None: until the end token or the context is full)
    limits: MappingProxyType  # n_indent, t_max_prompt_ms, t_max_predict_ms (0: off)
    fields: Optional[tuple[str, ...]]  # response_fields (None: the whole answer)


def _text(body: dict, name: str) -> str:
    v = body.get(name)
    return "" if v is None else need_str(v, name)


def _extra(value: Any) -> tuple[tuple[str, str], ...]:
    """input_extra: a list of {"filename", "text", "time"} objects (filename "tmp" when absent, as llama.cpp;
    time is the client's bookkeeping, which llama.cpp does not read either: any value is taken)."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_BATCH:
        raise FieldError("input_extra", f"input_extra must be a list of at most {MAX_BATCH} {{\"filename\", "
                                        f"\"text\"}} objects, got {show(value)}")
    out = []
    for i, chunk in enumerate(value):
        if not isinstance(chunk, dict) or set(chunk) - {"filename", "text", "time"}:
            raise FieldError("input_extra", f"input_extra[{i}] must be an object with \"filename\" and \"text\", "
                                            f"got {show(chunk)}")
        name = chunk.get("filename")
        out.append(("tmp" if name is None else need_str(name, f"input_extra[{i}].filename"),
                    need_str(chunk.get("text", ""), f"input_extra[{i}].text")))
    return tuple(out)


def parse_infill(state: ServerState, body: Any) -> InfillRequest:
    """A /infill body -> its request: known fields only, each checked under its own name."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if unknown := sorted(set(body) - INFILL_FIELDS):
        raise FieldError(unknown[0], f"unknown field(s) for /infill: {', '.join(show(u, 40) for u in unknown)}")
    if state.fim is None:
        raise BadRequest(no_fim_message(state.tm.tokenizer))
    if body.get("cache_prompt") is not None:
        need_bool(body["cache_prompt"], "cache_prompt")
    shared = {k: body[k] for k in _SHARED if body.get(k) is not None}
    if shared.get("seed") == -1 and type(shared["seed"]) is int:  # llama.cpp's random seed
        del shared["seed"]
    sampling, _ = sampling_fields(shared, dict(state.tm.limits.sampling_defaults))
    if body.get("repeat_penalty") is not None:
        sampling["repetition_penalty"] = need_float(body["repeat_penalty"], "repeat_penalty", 0.0, 2.0)
        if sampling["repetition_penalty"] <= 0:
            raise FieldError("repeat_penalty", f"repeat_penalty must be in (0, 2], got {body['repeat_penalty']}")
    apply_samplers(body.get("samplers"), body, sampling)
    apply_penalty_last_n(body.get("penalty_last_n"), body, sampling)
    n = body.get("n_predict")
    n = None if n is None else need_int(n, "n_predict", -1)
    stream = False if body.get("stream") is None else need_bool(body["stream"], "stream")
    options = OpenAIOptions(1, stream, False, 0, None, MappingProxyType(sampling), None if n == -1 else n)
    return InfillRequest(_text(body, "input_prefix"), _text(body, "input_suffix"), _extra(body.get("input_extra")),
                         _text(body, "prompt"), options, MappingProxyType(limits(body)),
                         response_fields(body.get("response_fields")))


def fit_sizes(state: ServerState) -> tuple[int, int]:
    """(n_batch, n_ctx) for llama.cpp's cut: the context a request may fill (the context length within the KV
    pool, as RuntimeLimits.room_after) and the longest prefill chunk of one request (--chunked-prefill-size; with
    chunking off, --max-prefill-tokens), at most the context."""
    args = state.args
    n_ctx = state.tm.limits.room_after(0)
    chunk = args.chunked_prefill_size
    n_batch = chunk if chunk is not None and chunk > 0 else args.max_prefill_tokens or n_ctx
    return min(n_batch, n_ctx), n_ctx


def fit(prefix: list[int], suffix: list[int], typed: int, extra: list[int], n_batch: int, n_ctx: int,
        n_predict: int) -> tuple[list[int], list[int], list[int]]:
    """llama.cpp's format_infill cut (typed: the prompt's token count, never cut): the prefix's last
    3 * (n_batch // 4) tokens (nearest the cursor), the suffix's first n_batch // 4 - 2 - typed, and the context
    layout's last n_ctx - n_batch - 2 * n_predict (its newest chunks, the first one possibly cut inside)."""
    quarter = n_batch // 4
    keep_prefix = min(len(prefix), 3 * quarter)
    keep_extra = min(len(extra), max(0, n_ctx - n_batch - 2 * n_predict))
    return (prefix[len(prefix) - keep_prefix:], suffix[:max(0, quarter - (2 + typed))],
            extra[len(extra) - keep_extra:])


def infill_ids(state: ServerState, req: InfillRequest) -> list[int]:
    """The prompt ids: BOS, the context chunks' layout, the template with the prefix (then the prompt) and the
    suffix, each part cut to llama.cpp's sizes (fit)."""
    fim, enc = state.fim, state.tm.encoder
    extra = []
    if req.extra:
        extra = fim.extra_ids([(enc.encode_literal(name + "\n"), enc.encode_literal(text)) for name, text in req.extra],
                              enc.encode_literal(REPO_LINE), enc.encode_literal(FILE_LINE), enc.encode_literal(SNIPPET))
    typed = enc.encode_literal(req.prompt)
    fim.check_text("prompt", typed, bool(extra))
    prefix, suffix, extra = fit(enc.encode_literal(req.prefix), enc.encode_literal(req.suffix), len(typed), extra,
                                *fit_sizes(state), req.options.max_tokens or 0)
    return fim.prompt_ids(prefix + typed, suffix, enc.prefix_ids, ("input_prefix", "input_suffix"), extra)


def infill_intake(state: ServerState, req: InfillRequest, rid: str) -> Choices:
    """The request's one choice (its prompt tokenized). On an intake thread."""
    ids = infill_ids(state, req)
    room = state.tm.limits.room_after(len(ids))
    sampling = req.options.sampling_params(room, room)
    return Choices.build(state, [ids], req.options, sampling, rid=rid)


def stop_fields(reason: Optional[dict]) -> dict:
    """The runtime's finish_reason -> llama.cpp's stop_type and stopping_word."""
    kind = (reason or {}).get("type")
    matched = (reason or {}).get("matched")
    if kind == "stop" and isinstance(matched, str):
        return {"stop_type": "word", "stopping_word": matched}
    return {"stop_type": {"stop": "eos", "length": "limit"}.get(kind, "none"), "stopping_word": ""}


def final_fields(state: ServerState, meta: dict, stops: InfillStops) -> dict:
    """What the last answer carries besides its content."""
    return {"model": state.served_model_name, "tokens_predicted": meta["completion_tokens"],
            "tokens_evaluated": meta["prompt_tokens"], "tokens_cached": meta["cached_tokens"], "truncated": False,
            **({"stop_type": "limit", "stopping_word": ""} if stops.stopped else stop_fields(meta["finish_reason"])),
            "timings": stops.timings(meta["prompt_tokens"], meta["cached_tokens"], meta["completion_tokens"])}


def _stops(req: InfillRequest) -> InfillStops:
    return InfillStops(req.limits["n_indent"], req.limits["t_max_predict_ms"], req.limits["t_max_prompt_ms"],
                       time.perf_counter())


async def _run(state: ServerState, rid: str, gen: AsyncIterator[dict],
               stops: InfillStops) -> AsyncIterator[tuple[str, Optional[dict]]]:
    """The request's stream `gen` (request id rid) -> (text to send, None) while it runs, then (the rest, its last
    meta_info) once it finished or a limit ended it (the request ended as finished, LIMIT_FINISH: end_early);
    leaving closes the stream, which aborts a request still running (a client gone: counted as abandoned)."""
    try:
        async for out in gen:
            meta = out["meta_info"]
            stopped = stops.feed(out["text"], len(out["output_ids"]), time.perf_counter(),
                                 out.get("text_trim", 0), meta.get("queue_time", 0.0))
            if stopped and meta["finish_reason"] is None:
                state.tm.end_early(rid, LIMIT_FINISH)
            if stopped or meta["finish_reason"] is not None:
                yield stops.ready(True), meta
                return
            yield stops.ready(False), None
    finally:
        await gen.aclose()


@router.post("/infill")
async def infill(request: Request) -> Response:
    state: ServerState = request.app.state.server
    req = parse_infill(state, await read_json(request))
    choices = await state.tm.run_intake(infill_intake, state, req, uuid.uuid4().hex, size=len(await request.body()))
    stops = _stops(req)
    gen, rid = choices.streams()[0], choices.reqs[0].rid  # before any header goes out: a refused request is a 503
    if req.options.stream:
        return stream_response(guard_stream(_stream(state, req, rid, gen, stops)))

    async def whole() -> dict:
        async with aclosing(_run(state, rid, gen, stops)) as run:
            async for _, meta in run:
                if meta is not None:
                    return meta
        raise RuntimeError("the request's stream ended without a final record")

    meta = await unless_client_gone(request, whole(), client_gone_counter(state))
    answer = {"index": 0, "content": stops.text, "stop": True, **final_fields(state, meta, stops)}
    return JSONResponse(pick(answer, req.fields))


async def _stream(state: ServerState, req: InfillRequest, rid: str, gen: AsyncIterator[dict],
                  stops: InfillStops) -> AsyncIterator[bytes]:
    async with aclosing(_run(state, rid, gen, stops)) as run:  # a client gone closes the request's stream too
        async for text, meta in run:
            if meta is not None:
                yield sse(pick({"index": 0, "content": text, "stop": True, **final_fields(state, meta, stops)},
                               req.fields))
            elif text:
                yield sse({"index": 0, "content": text, "stop": False})
