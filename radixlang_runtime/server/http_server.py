"""The HTTP app: SGLang's native routes (PROTOCOL.md), the OpenAI routes (openai_api.py), /metrics.

Bodies are parsed by hand, not by pydantic models, so that every malformed request gets the
documented 400 `{"error": {"message": ...}}` naming the problem (FastAPI's default would be a 422
with a different shape). Streaming responses are Server-Sent Events: `data: {json}\\n\\n` per chunk,
then `data: [DONE]\\n\\n`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from radixlang_runtime import __version__
from radixlang_runtime.sampling_params import SamplingParams
from radixlang_runtime.logprob_format import normalize_logprob_args
from radixlang_runtime.server.tokenizer_manager import LogprobRequest, RuntimeUnavailable, TokenizerManager
from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)
OPEN_ROUTES = ("/health", "/health_generate", "/metrics")  # no API key needed


class BadRequest(ValueError):
    pass


@dataclass
class ServerState:
    args: ServerArgs  # resolved by the scheduler for its device
    tm: TokenizerManager
    model_dir: str
    served_model_name: str
    info: dict[str, Any]  # what the scheduler reported when it became ready
    child_pids: dict[str, int] = field(default_factory=dict)


def error_response(status: int, message: str, param: Optional[str] = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status)


async def read_json(request: Request) -> Any:
    body = await request.body()
    if not body:
        return {}
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not valid JSON: {e}") from None


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def text_delta(text: str, sent: int) -> tuple[str, int]:
    """The part of a cumulative text not sent yet, and the new sent length. A final text may be shorter
    (a stop string trimmed after it streamed): nothing more is sent then."""
    return text[sent:], max(sent, len(text))


def stream_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def guard_stream(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """After the headers went out an error can only travel as an event: send it, then [DONE]."""
    try:
        async for chunk in events:
            yield chunk
    except (ValueError, RuntimeError) as e:
        yield sse({"error": {"message": str(e)}})
        yield SSE_DONE


# ---------------------------------------------------------------------------------------- /generate
def _listify(value: Any, n: int, name: str) -> list:
    if isinstance(value, list):
        if len(value) != n:
            raise BadRequest(f"{name} has {len(value)} entries for {n} prompts")
        return value
    return [value] * n


Item = tuple[list[int], SamplingParams, Optional[str], Optional[LogprobRequest]]


def parse_generate(tm: TokenizerManager, body: Any) -> tuple[list[Item], bool]:
    """-> ([(input_ids, sampling, rid, logprob request)] with n > 1 fanned out, whether the input was a list)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise BadRequest("pass exactly one of text / input_ids")
    if text is not None:
        is_list = isinstance(text, list)
        texts = text if is_list else [text]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise BadRequest("text must be a string or a non-empty list of strings")
        prompts = [tm.encode_text(t) for t in texts]
    else:
        is_list = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        prompts = ids if is_list else [ids]
        if not isinstance(ids, list) or not all(isinstance(p, list) for p in prompts):
            raise BadRequest("input_ids must be a list of integers or a list of such lists")
    sps = _listify(body.get("sampling_params"), len(prompts), "sampling_params")
    rids = _listify(body.get("rid"), len(prompts), "rid")
    starts = _listify(body.get("logprob_start_len"), len(prompts), "logprob_start_len")
    return_logprob = body.get("return_logprob", False)
    if not isinstance(return_logprob, bool):
        raise BadRequest("return_logprob must be a boolean")
    out = []
    for p, sp_dict, rid, start in zip(prompts, sps, rids, starts):
        if rid is not None and not isinstance(rid, str):
            raise BadRequest("rid must be a string")
        sp = tm.prepare(p, sp_dict)
        lp = None
        if return_logprob:
            k, top = normalize_logprob_args(len(p), True, start, body.get("top_logprobs_num"))
            lp = LogprobRequest(k, top, bool(body.get("return_text_in_logprobs")))
        for j in range(sp.n):
            out.append((p, sp, rid if sp.n == 1 or rid is None else f"{rid}-{j}", lp))
    return out, is_list or len(out) > 1


async def generate_route(state: ServerState, request: Request) -> Response:
    tm = state.tm
    body = await read_json(request)
    items, as_list = parse_generate(tm, body)
    if rid_dupes := {it[2] for it in items if it[2] is not None and sum(x[2] == it[2] for x in items) > 1}:
        raise BadRequest(f"duplicate rid(s): {sorted(rid_dupes)}")
    if body.get("stream"):
        return stream_response(guard_stream(_stream_generate(tm, items, as_list, state.args.incremental_streaming_output)))
    results = await asyncio.gather(*(_final(tm.generate(ids, sp, rid, logprob=lp)) for ids, sp, rid, lp in items))
    return JSONResponse(results if as_list else results[0])


async def _final(gen: AsyncIterator[dict]) -> dict:
    last = None
    async for out in gen:
        last = out
    return last


async def merged(gens: list[AsyncIterator[dict]]) -> AsyncIterator[tuple[int, dict]]:
    """Interleave several requests' snapshots as they come: yields (index, snapshot). An error in one
    is raised here; leaving early (client gone, error) closes every generator, aborting its request."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, gen: AsyncIterator[dict]) -> None:
        try:
            async for out in gen:
                await queue.put((i, out))
        except Exception as e:  # surfaced to the consumer below
            await queue.put((i, e))
        await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        remaining = len(tasks)
        while remaining:
            i, out = await queue.get()
            if out is None:
                remaining -= 1
            elif isinstance(out, Exception):
                raise out
            else:
                yield i, out
    finally:
        for t in tasks:
            t.cancel()
        for g in gens:
            await g.aclose()


async def _stream_generate(tm: TokenizerManager, items: list, as_list: bool,
                           incremental: bool = False) -> AsyncIterator[bytes]:
    """One SSE event per update of any of the requests (cumulative text / output_ids, or deltas with
    --incremental-streaming-output); with several requests each event carries its `index`."""
    sent: dict[int, tuple[int, int]] = {}  # index -> (text chars, output ids) already sent (incremental mode)
    async for i, out in merged([tm.generate(ids, sp, rid, stream=True, logprob=lp) for ids, sp, rid, lp in items]):
        if incremental:
            t0, n0 = sent.get(i, (0, 0))
            ids = out["output_ids"]
            out["text"], t1 = text_delta(out["text"], t0)
            out["output_ids"] = ids[n0:]
            sent[i] = (t1, len(ids))
        if as_list:
            out["index"] = i
        yield sse(out)
    yield SSE_DONE


# ---------------------------------------------------------------------------------------- the app
def create_app(state: ServerState, lifespan: Optional[Callable] = None) -> FastAPI:
    from radixlang_runtime.server.openai_api import add_openai_routes

    app = FastAPI(title="radixlang", version=__version__, lifespan=lifespan)
    tm, args = state.tm, state.args

    @app.middleware("http")
    async def auth_and_log(request: Request, call_next):
        if args.api_key and not request.url.path.startswith(OPEN_ROUTES):
            if request.headers.get("authorization") != f"Bearer {args.api_key}":
                return error_response(401, "invalid or missing API key (Authorization: Bearer ...)")
        response = await call_next(request)
        if args.log_requests:
            logger.info("%s %s -> %d", request.method, request.url.path, response.status_code)
        return response

    @app.exception_handler(ValueError)  # BadRequest, and SamplingParams / limits validation
    async def bad_request(request: Request, e: ValueError):
        return error_response(400, str(e))

    @app.exception_handler(RuntimeUnavailable)
    async def unavailable(request: Request, e: RuntimeUnavailable):
        return error_response(503, f"the runtime is unavailable: {e}")

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception):  # never a hang or a bare traceback
        logger.exception("request failed")
        return error_response(500, f"internal error: {e!r}")

    @app.post("/generate")
    async def generate(request: Request):
        return await generate_route(state, request)

    @app.get("/health")
    async def health():
        if tm.dead:
            return error_response(503, tm.dead)
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate():
        try:
            sp = tm.prepare([1], {"max_new_tokens": 1, "temperature": 0})
            await asyncio.wait_for(_final(tm.generate([1], sp)), timeout=30)
        except Exception as e:
            return error_response(503, f"generation failed: {e}")
        return Response(status_code=200)

    def model_info():
        return {"model_path": args.model_path or state.model_dir, "served_model_name": state.served_model_name,
                "tokenizer_path": args.tokenizer_path or state.model_dir, "is_generation": True,
                "max_context_length": tm.limits.context_len}

    app.get("/model_info")(model_info)
    app.get("/get_model_info")(model_info)

    async def server_info():
        stats = await tm.get_stats()
        return {**args.to_dict(), **state.info, "version": __version__, "stats": stats,
                "pids": {"server": os.getpid(), **state.child_pids}}

    app.get("/server_info")(server_info)
    app.get("/get_server_info")(server_info)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        if await tm.flush_cache():
            return PlainTextResponse("Cache flushed.\n")
        return error_response(400, "Cache not flushed: requests are queued or running.")

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await read_json(request)
        rid = body.get("rid") if isinstance(body, dict) else None
        if not isinstance(rid, str):
            raise BadRequest("abort_request needs {\"rid\": \"...\"}")
        tm.abort(rid)
        return Response(status_code=200)

    @app.post("/concate_and_append_request")
    async def concate_and_append(request: Request):
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("src_rids"), list):
            raise BadRequest("concate_and_append_request needs {\"src_rids\": [...], \"dst_rid\": ...}")
        return {}  # the frontend already joined the texts; the radix cache shares the KV by itself

    if args.enable_metrics and tm.metrics is not None:
        @app.get("/metrics")
        async def metrics():
            data = tm.metrics.render(await tm.get_stats())
            return Response(data, media_type="text/plain; version=0.0.4; charset=utf-8")

    add_openai_routes(app, state)
    return app
