"""Pooling routes: /v1/embeddings (OpenAI), /encode (SGLang), /classify (vLLM; /v1/classify as SGLang names it),
/v1/rerank (Jina / Cohere shape, as vLLM), /v1/score (vLLM). Bodies are parsed on an intake thread by
pooling_input.py; a call's requests go to the scheduler as one message (TokenizerManager.generate_batch: one
prefill batch where the budgets allow). Errors answer in the one error shape (http_common.error_response:
OpenAI's), a refused body never reaches the scheduler.

A --is-embedding server embeds; rerank / score there are the cosine similarity of the embeddings. A generation
server answers /v1/embeddings and /encode with 400 naming --is-embedding (vLLM refuses them on a generative model
too), and scores rerank / score with its logits: P(true) over --classifier-from-token at the last position of
--rerank-template (a decoder reranker such as Qwen3-Reranker). A sequence classifier (classifier.py) answers
/classify, and rerank / score with its sigmoid when it has one label (a cross-encoder); the embedding routes
answer it with 400, as /classify answers every other server.
"""

from __future__ import annotations

import asyncio
import base64
import math
import time
import uuid
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from radixlang_runtime.protocol.limits import need_str, show
from radixlang_runtime.classifier import classify_probs, cross_encoder_score
from radixlang_runtime.pooling import finish_embedding, softmax_last
from radixlang_runtime.protocol.embed_bytes import embedding_bytes
from radixlang_runtime.protocol.pooling_input import (QWEN3_RERANK_TEMPLATE, CrossEncoder, EmbeddingCall, PairCall,
                                                      PromptEncoders, Reranker, embedding_encoder, parse_classify_body,
                                                      parse_embeddings_body, parse_encode_body, parse_rerank_body,
                                                      parse_score_body)
from radixlang_runtime.server.chat_render import chat_content_spans, render_chat, template_kwargs, turn_end
from radixlang_runtime.server.http_common import ServerState, final_result, read_json
from radixlang_runtime.server.openai_records import MODEL_ALIASES, ModelNotFound

router = APIRouter()


def _check_model(state: ServerState, body: Any) -> None:
    model = body.get("model") if isinstance(body, dict) else None
    if model is not None and need_str(model, "model") not in (state.served_model_name, *MODEL_ALIASES):
        raise ModelNotFound(f"The model {show(model)} does not exist: this server serves "
                            f"{state.served_model_name!r} (or {', '.join(map(repr, MODEL_ALIASES))})")


def _encode_with_specials(state: ServerState):
    return embedding_encoder(state.tm.tokenizer, state.pooling)


def _chat_ids(state: ServerState, body: dict, add_special_tokens: bool) -> list[int]:
    """vLLM's chat form of a pooling request: the messages rendered through the chat template as the generation
    routes render them (chat_render), add_generation_prompt defaulting to false, then tokenized as the text is
    (with the tokenizer's added tokens only for add_special_tokens)."""
    tm = state.tm
    gen = body.get("add_generation_prompt")
    turn = turn_end({**body, "add_generation_prompt": False if gen is None else gen})
    variables = template_kwargs(body)
    text, template = render_chat(tm.tokenizer, body["messages"], state.args.chat_template, None, variables, turn)
    spans = chat_content_spans(tm.tokenizer, body["messages"], template, text, tm.encoder.special_text_in, turn,
                               **variables)
    return tm.encoder.encode_rendered(text, spans, add_special_tokens)


def _encoders(state: ServerState) -> PromptEncoders:
    return PromptEncoders(_encode_with_specials(state), state.tm.encode_words,
                          lambda body, add: _chat_ids(state, body, add))


def _reranker(state: ServerState) -> Optional[Reranker]:
    """The generation model's reranker: --classifier-from-token's two tokens as ids (None: not single tokens)."""
    args, tok = state.args, state.tm.tokenizer
    ids = []
    for t in args.classifier_from_token.split(","):
        got = tok.encode(t, add_special_tokens=False)
        if len(got) != 1:
            return None
        ids.append(got[0])
    return Reranker(args.rerank_template or QWEN3_RERANK_TEMPLATE, args.rerank_instruction, (ids[0], ids[1]))


async def _run(state: ServerState, reqs: list) -> list[dict]:
    """Every request's final result, in order (sent as one batch)."""
    return list(await asyncio.gather(*(final_result(g) for g in state.tm.generate_batch(reqs))))


def _vector(out: dict) -> list[float]:
    vec = out.get("embedding")
    if vec is None:  # an abort (client gone) or a fault: the error path raised already for faults
        raise RuntimeError(f"request {out['meta_info']['id']} ended without a result "
                           f"({out['meta_info']['finish_reason']})")
    return vec


def _usage(outs: list[dict]) -> dict:
    n = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    return {"prompt_tokens": n, "total_tokens": n}


async def _body(request: Request) -> tuple[ServerState, Any]:
    state: ServerState = request.app.state.server
    body = await read_json(request)
    _check_model(state, body)
    return state, body


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> JSONResponse:
    state, body = await _body(request)
    tm = state.tm
    call = await tm.run_intake(parse_embeddings_body, body, state.pooling, _encoders(state), tm.limits,
                               size=len(await request.body()))
    outs = await _run(state, call.reqs)
    act = call.options.use_activation
    normalize = state.pooling.normalize if act is None else act
    size = sum(len(o.get("embedding") or ()) for o in outs)
    data = await tm.run_intake(_embedding_data, outs, normalize, call, size=size)
    return JSONResponse({"id": call.options.rid, "object": "list", "created": int(time.time()), "data": data,
                         "model": state.served_model_name, "usage": _usage(outs)})


def _embedding_data(outs: list[dict], normalize: bool, call: EmbeddingCall) -> list[dict]:
    """OpenAI's data entries (on an intake thread: a batch of large vectors is real work); base64: the vector's
    bytes in the call's embed_dtype and endianness (embed_bytes.py)."""
    data = []
    for i, out in enumerate(outs):
        vec = finish_embedding(_vector(out), normalize, call.dimensions)
        emb: Any = (vec if call.encoding_format == "float" else base64.b64encode(
            embedding_bytes(vec, call.embed_dtype, call.endianness)).decode("ascii"))
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return data


@router.post("/encode")
async def encode(request: Request) -> JSONResponse:
    state, body = await _body(request)
    tm = state.tm
    call = await tm.run_intake(parse_encode_body, body, state.pooling, _encode_with_specials(state), tm.limits,
                               uuid.uuid4().hex, size=len(await request.body()))
    outs = await _run(state, call.reqs)
    items = [{"embedding": finish_embedding(_vector(o), state.pooling.normalize), "meta_info": o["meta_info"]}
             for o in outs]
    return JSONResponse(items if call.as_list else items[0])


async def _scores(state: ServerState, call: PairCall) -> tuple[list[float], list[dict]]:
    """One score per pair: the cross-encoder's sigmoid, P(true) of the reranker, or the cosine of the two
    embeddings. use_activation false: the cross-encoder's logit, the reranker's logit(true) - logit(false) (the
    logit whose sigmoid is P(true), as vLLM's converted reranker head gives it); a cosine is the same either way."""
    outs = await _run(state, call.reqs)
    raw = call.options.use_activation is False
    if call.scorer == "classifier":
        return [_vector(o)[0] if raw else cross_encoder_score(_vector(o)) for o in outs], outs
    if call.scorer == "reranker":
        return [_vector(o)[-1] - _vector(o)[0] if raw else softmax_last(_vector(o)) for o in outs], outs
    vecs = [finish_embedding(_vector(o), True) for o in outs]
    return [math.fsum(a * b for a, b in zip(vecs[i], vecs[j])) for i, j in call.pairs], outs


def _plain_encoder(state: ServerState):
    return state.tm.encode_text  # a rendered reranker prompt: the tokenizer's BOS where it adds one (never twice)


def _pair_intake(parse: Any, state: ServerState, body: Any) -> Any:
    """rerank / score bodies on an intake thread (the reranker's tokens are looked up there too)."""
    tok = state.tm.tokenizer
    reranker = (_reranker(state) if state.pooling is None else
                CrossEncoder(lambda q, d: tok(q, text_pair=d)["input_ids"]) if state.pooling.classifies else None)
    return parse(body, state.pooling, reranker, _encode_with_specials(state), _plain_encoder(state), state.tm.limits)


@router.post("/v1/rerank")
@router.post("/rerank")  # vLLM serves the same answer under these names too
@router.post("/v2/rerank")
async def rerank(request: Request) -> JSONResponse:
    state, body = await _body(request)
    call, top_n, with_docs = await state.tm.run_intake(_pair_intake, parse_rerank_body, state, body,
                                                       size=len(await request.body()))
    scores, outs = await _scores(state, call)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]
    results = [{"index": i, "relevance_score": scores[i],
                **({"document": {"text": call.documents[i]}} if with_docs else {})} for i in order]
    return JSONResponse({"id": call.options.rid, "model": state.served_model_name,
                         "usage": _usage(outs), "results": results})


@router.post("/v1/score")
@router.post("/score")
async def score(request: Request) -> JSONResponse:
    state, body = await _body(request)
    call = await state.tm.run_intake(_pair_intake, parse_score_body, state, body, size=len(await request.body()))
    scores, outs = await _scores(state, call)
    return JSONResponse({"id": call.options.rid, "object": "list", "created": int(time.time()),
                         "model": state.served_model_name, "usage": _usage(outs),
                         "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]})


@router.post("/classify")
@router.post("/v1/classify")  # SGLang's name for the same route
async def classify(request: Request) -> JSONResponse:
    state, body = await _body(request)
    tm = state.tm
    call = await tm.run_intake(parse_classify_body, body, state.pooling, _encoders(state), tm.limits,
                               size=len(await request.body()))
    outs = await _run(state, call.reqs)
    labels, data = state.pooling.labels, []
    # use_activation false: the score head's logits as they are (vLLM's raw classify output)
    activation = "identity" if call.options.use_activation is False else state.pooling.activation
    for i, out in enumerate(outs):
        probs = classify_probs(_vector(out), activation)
        best = max(range(len(probs)), key=probs.__getitem__)  # the first of equal maxima, as argmax
        data.append({"index": i, "label": labels[best], "probs": probs, "num_classes": len(probs)})
    return JSONResponse({"id": call.options.rid, "object": "list", "created": int(time.time()),
                         "model": state.served_model_name, "data": data,
                         "usage": {**_usage(outs), "completion_tokens": 0, "prompt_tokens_details": None}})
