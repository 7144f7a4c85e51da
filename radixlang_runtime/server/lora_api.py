"""LoRA adapters at run time (SGLang's routes): POST /load_lora_adapter {"lora_name", "lora_path"} and
POST /unload_lora_adapter {"lora_name"}. Both answer {"success": true, "loaded_adapters": {name: id}};
a bad body, an unknown or already loaded name, or an adapter that cannot be read is 400 naming it; an unload
waits (bounded) for the adapter's queued and running requests to end, new ones are refused at once."""

from __future__ import annotations

from fastapi import APIRouter, Request

from radixlang_runtime.protocol.limits import need_str
from radixlang_runtime.server.generate_api import server_state
from radixlang_runtime.server.http_common import BadRequest, error_response, read_json

router = APIRouter()


def _loaded(tm) -> dict[str, int]:
    return {name: i + 1 for i, name in enumerate(tm.limits.lora_adapters) if name is not None}


def _body(raw, fields: tuple[str, ...]) -> list[str]:
    if not isinstance(raw, dict):
        raise BadRequest("the body must be a JSON object")
    if unknown := sorted(set(raw) - set(fields)):
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    return [need_str(raw.get(f), f, 4096) for f in fields]


@router.post("/load_lora_adapter")
async def load_lora_adapter(request: Request):
    state = server_state(request)
    if not state.args.enable_lora:
        return error_response(400, "loading LoRA adapters needs --enable-lora (or --lora-paths)")
    name, path = _body(await read_json(request), ("lora_name", "lora_path"))
    if not name or ":" in name:
        return error_response(400, f"lora_name {name!r} must be non-empty, without ':'", param="lora_name")
    await state.tm.load_lora_adapter(name, path)
    return {"success": True, "loaded_adapters": _loaded(state.tm)}


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(request: Request):
    state = server_state(request)
    (name,) = _body(await read_json(request), ("lora_name",))
    try:
        await state.tm.unload_lora_adapter(name)
    except TimeoutError as e:
        return error_response(503, str(e))
    return {"success": True, "loaded_adapters": _loaded(state.tm)}
