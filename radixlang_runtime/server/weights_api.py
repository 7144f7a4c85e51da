"""Weight updates at run time (SGLang's routes, what RL trainers call between rollouts):
POST /update_weights_from_disk {"model_path", "load_format"?, "abort_all_requests"?, "weight_version"?,
"flush_cache"? (true only: the cache is always flushed)} -> {"success", "message", "num_paused_requests"}, 400
with success false when refused (the message names why; the old weights stay);
GET/POST /get_weights_by_name {"name", "truncate_size"?} -> the parameter's first truncate_size entries along
dim 0 (400 naming it when there is none); GET /get_weight_version -> {"weight_version"}."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from radixlang_runtime.protocol.limits import need_bool, need_int, need_str
from radixlang_runtime.server import weight_updates
from radixlang_runtime.server.generate_api import server_state
from radixlang_runtime.server.http_common import BadRequest, error_response, read_json

router = APIRouter()

_UPDATE_FIELDS = ("model_path", "load_format", "abort_all_requests", "weight_version", "flush_cache")


def _object(raw, fields: tuple[str, ...]) -> dict:
    if not isinstance(raw, dict):
        raise BadRequest("the body must be a JSON object")
    if unknown := sorted(set(raw) - set(fields)):
        raise BadRequest(f"unknown or unsupported field(s): {', '.join(unknown)}")
    return raw


def _opt_str(body: dict, name: str):
    return None if body.get(name) is None else need_str(body[name], name, 4096)


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(request: Request):
    body = _object(await read_json(request), _UPDATE_FIELDS)
    model_path = need_str(body.get("model_path"), "model_path", 4096)
    abort_all = need_bool(body.get("abort_all_requests", False), "abort_all_requests")
    if not need_bool(body.get("flush_cache", True), "flush_cache"):
        raise BadRequest("flush_cache false is not supported: the prefix cache holds the old weights' K/V")
    ok, message, paused = await weight_updates.update_weights_from_disk(
        server_state(request).tm, model_path, _opt_str(body, "load_format"), abort_all,
        _opt_str(body, "weight_version"))
    return JSONResponse({"success": ok, "message": message, "num_paused_requests": paused},
                        status_code=200 if ok else 400)


@router.api_route("/get_weights_by_name", methods=["GET", "POST"])
async def get_weights_by_name(request: Request):
    body = _object(await read_json(request), ("name", "truncate_size"))
    name = need_str(body.get("name"), "name", 4096)
    truncate = need_int(body.get("truncate_size", 100), "truncate_size", 0)
    try:
        return JSONResponse(await weight_updates.get_weights_by_name(server_state(request).tm, name, truncate))
    except ValueError as e:
        return error_response(400, str(e), param="name")


@router.get("/get_weight_version")
async def get_weight_version(request: Request):
    return {"weight_version": server_state(request).tm.weight_gate.weight_version}
