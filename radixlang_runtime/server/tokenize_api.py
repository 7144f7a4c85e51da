"""/tokenize and /detokenize (also under /v1/): the served tokenizer over HTTP, in vLLM's and SGLang's shapes.

POST /tokenize {"prompt": str | [str, ...], "add_special_tokens": true} or {"messages": [...],
"add_generation_prompt": true, "continue_final_message": false, "add_special_tokens": false,
"chat_template_kwargs": {...}} (rendered through the chat template as /v1/chat/completions renders it)
-> {"tokens", "count", "max_model_len"} (+ "token_strs" with "return_token_strs": true); a list of prompts
(SGLang) answers lists of tokens and counts. A non-empty `suffix` beside a text `prompt` answers the
fill-in-the-middle prompt /v1/completions runs for that prompt and suffix (fim_templates.FimPrompt; without
add_special_tokens no BOS); on a model without a fill-in-the-middle template it is the same 400 as there.
POST /detokenize {"tokens": [int, ...] | [[int, ...], ...], "skip_special_tokens": false} -> {"prompt", "text"}
(vLLM names the text `prompt`, SGLang `text`: both are sent). Fields are strict: an unknown one is a 400
naming it; `model` must be the served one (or "default"). Tokenizing runs on an intake thread.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixlang_runtime.fim_templates import no_fim_message
from radixlang_runtime.protocol.limits import MAX_BATCH, FieldError, need_bool, need_int_list, need_str, show
from radixlang_runtime.server.chat_render import render_chat, template_kwargs, turn_end
from radixlang_runtime.server.http_common import BadRequest, ServerState, read_json
from radixlang_runtime.server.openai_records import MODEL_ALIASES, ModelNotFound

_TOKENIZE_FIELDS = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                    "continue_final_message", "chat_template_kwargs", "reasoning_effort", "return_token_strs",
                    "suffix"}
_DETOKENIZE_FIELDS = {"model", "tokens", "skip_special_tokens"}

router = APIRouter()


def _check(state: ServerState, body: Any, fields: set[str], route: str) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if unknown := sorted(set(body) - fields):
        raise FieldError(unknown[0], f"unknown field(s) for {route}: {', '.join(show(u, 40) for u in unknown)}")
    model = body.get("model")
    if model is not None and need_str(model, "model") not in (state.served_model_name, *MODEL_ALIASES):
        raise ModelNotFound(f"The model {show(model)} does not exist: this server serves {state.served_model_name!r}")
    return body


def _flag(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    return default if v is None else need_bool(v, name)


def tokenize_body(state: ServerState, body: dict) -> dict[str, Any]:
    """A checked /tokenize body -> its answer (on an intake thread)."""
    tok = state.tm.tokenizer
    if ("prompt" in body) == ("messages" in body):
        raise BadRequest("tokenize needs either \"prompt\" or \"messages\" (one of them)")
    suffix = "" if body.get("suffix") is None else need_str(body["suffix"], "suffix")
    if "messages" in body:
        if suffix:
            raise FieldError("suffix", "suffix applies to \"prompt\" only")
        text, _ = render_chat(tok, body["messages"], state.args.chat_template, None, template_kwargs(body),
                              turn_end(body))
        prompts, special, many = [text], _flag(body, "add_special_tokens", False), False
    else:
        for name in ("add_generation_prompt", "continue_final_message", "chat_template_kwargs", "reasoning_effort"):
            if body.get(name) is not None:
                raise FieldError(name, f"{name} applies to \"messages\" only")
        p = body["prompt"]
        many = isinstance(p, list)
        prompts = p if many else [p]
        if not prompts or len(prompts) > MAX_BATCH or not all(isinstance(x, str) for x in prompts):
            raise FieldError("prompt", f"prompt must be a string or a list of 1 to {MAX_BATCH} strings")
        special = _flag(body, "add_special_tokens", True)
    if suffix:
        if state.fim is None:
            raise FieldError("suffix", no_fim_message(tok))
        ids = [state.fim.encoded(state.tm.encoder, t, suffix, special) for t in prompts]
    else:
        ids = [tok.encode(t, add_special_tokens=special) for t in prompts]
    out: dict[str, Any] = {"tokens": ids if many else ids[0], "count": [len(i) for i in ids] if many else len(ids[0]),
                           "max_model_len": state.tm.limits.context_len}
    if _flag(body, "return_token_strs", False):
        strs = [tok.convert_ids_to_tokens(i) for i in ids]
        out["token_strs"] = strs if many else strs[0]
    return out


def detokenize_body(state: ServerState, body: dict) -> dict[str, Any]:
    tm = state.tm
    tokens = body.get("tokens")
    many = isinstance(tokens, list) and bool(tokens) and all(isinstance(t, list) for t in tokens)
    rows = tokens if many else [tokens]
    if len(rows) > MAX_BATCH:
        raise FieldError("tokens", f"tokens may hold at most {MAX_BATCH} lists")
    rows = [need_int_list(r, "tokens", 0, tm.limits.vocab_size - 1, tm.limits.context_len) for r in rows]
    skip = _flag(body, "skip_special_tokens", False)
    texts = [tm.tokenizer.decode(r, skip_special_tokens=skip) for r in rows]
    text: Any = texts if many else texts[0]
    return {"prompt": text, "text": text}


async def _answer(request: Request, fields: set[str], route: str, fn: Any) -> Response:
    state: ServerState = request.app.state.server
    body = _check(state, await read_json(request), fields, route)
    return JSONResponse(await state.tm.run_intake(fn, state, body, size=len(await request.body())))


@router.post("/tokenize")
@router.post("/v1/tokenize")
async def tokenize(request: Request) -> Response:
    return await _answer(request, _TOKENIZE_FIELDS, "/tokenize", tokenize_body)


@router.post("/detokenize")
@router.post("/v1/detokenize")
async def detokenize(request: Request) -> Response:
    return await _answer(request, _DETOKENIZE_FIELDS, "/detokenize", detokenize_body)
