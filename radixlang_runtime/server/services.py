"""The server's service functions: what a request does, apart from the protocol that carried it.

The HTTP handlers (generate_api.py, control_api.py) and the DSL's ZeroMQ frontend (frontend_zmq.py) both
call these with plain values (a parsed JSON body, the ServerState) and get plain values back (dicts,
GenerateRequest lists, snapshot iterators); no FastAPI object enters or leaves. Errors are exceptions
(ValueError: 400, ShuttingDown / RuntimeUnavailable: 503) that each protocol renders in its own shape.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any, AsyncIterator, Optional

from radixlang_runtime.version import __version__
from radixlang_runtime.multimodal.image_prep import image_token_text
from radixlang_runtime.protocol.generate_input import GenerateRequest, parse_generate_body
from radixlang_runtime.protocol.limits import MAX_RID_LEN, need_str
from radixlang_runtime.server.http_common import BadRequest, ServerState, final_result, merged, parse_pin_body
from radixlang_runtime.server.tokenizer_manager import TokenizerManager


def input_size(body: Any) -> int:
    """Characters / token ids of a generate body's prompts: picks its intake pool (tm.run_intake)."""
    prompt = body.get("text", body.get("input_ids")) if isinstance(body, dict) else None
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(p) if isinstance(p, (str, list)) else 1 for p in prompt)
    return 0


async def intake_generate(state: ServerState, body: Any) -> tuple[list[GenerateRequest], bool]:
    """A native /generate body -> (its requests, whether a list answers), parsed on an intake thread (the
    event loop never tokenizes) by the one intake (generate_input.parse_generate_body)."""
    tm = state.tm
    return await tm.run_intake(parse_generate_body, body, tm.encode_text, tm.limits, tm.encode_words,
                                tm.images.attach if tm.images is not None else None, size=input_size(body))


def generate_streams(state: ServerState, reqs: list[GenerateRequest]) -> list[AsyncIterator[dict]]:
    """The requests admitted now (tm.generate decides admission when called), their snapshots later."""
    return [state.tm.generate(r) for r in reqs]


async def generate_finals(state: ServerState, reqs: list[GenerateRequest]) -> list[dict]:
    """Each request's last snapshot (its result), in order."""
    return list(await asyncio.gather(*(final_result(g) for g in generate_streams(state, reqs))))


async def generate_events(streams: list[AsyncIterator[dict]], as_list: bool) -> AsyncIterator[dict]:
    """A streamed generate over generate_streams' iterators (made by the caller before any header goes out,
    so a refused request is a plain 503): each request's snapshots as they come, `index` when a list answers."""
    async for i, out in merged(streams):
        if as_list:
            out["index"] = i
        yield out


def frontend_port(state: ServerState) -> Optional[int]:
    """The DSL's ZeroMQ link's port while it serves (RuntimeEndpoint(http URL) connects to it), else None."""
    fe = state.frontend
    return fe.port if fe is not None and fe.problem() is None else None


def model_info(state: ServerState) -> dict[str, Any]:
    args, tm = state.args, state.tm
    return {"model_path": args.model_path or state.model_dir, "served_model_name": state.served_model_name,
            "tokenizer_path": args.tokenizer_path or state.model_dir, "is_generation": state.pooling is None,
            "max_context_length": tm.limits.context_len,
            # --chat-template, else the model's own: the DSL renders roles with it
            "chat_template": state.flag_template or getattr(tm.tokenizer, "chat_template", None),
            "frontend_port": frontend_port(state), "weight_version": tm.weight_gate.weight_version,
            "image_token": image_token_text(tm.tokenizer, tm.limits)}  # the DSL's sgl.image writes it


async def server_info(state: ServerState) -> dict[str, Any]:
    stats = await state.tm.get_stats()
    return {**state.args.to_public_dict(), **state.info, "version": __version__, "stats": stats,
            "weight_version": state.tm.weight_gate.weight_version,
            "pids": {"server": os.getpid(), **state.child_pids},
            "frontend_port": frontend_port(state),  # the bound port (the flag's 0 picks one), None: no link
            "frontend": state.frontend.stats() if state.frontend else None}


FLUSHED = "Cache flushed.\n"
NOT_FLUSHED = "Cache not flushed: requests are queued or running, or a prefix is pinned."


async def flush_cache(state: ServerState, tiers: Optional[list[str]] = None) -> bool:
    """tiers: the hierarchical cache's tiers to clear too (mem/hicache.check_flush_tiers; None: all)."""
    return await state.tm.flush_cache(tiers)


def pin_owner(api_key: Optional[str]) -> str:
    """Who owns a pin made with this API key (a digest: the key itself is never stored); "" without a key
    (then a pin's unguessable id is all that guards it)."""
    if not api_key:
        return ""
    return hashlib.blake2b(api_key.encode(), digest_size=16, person=b"radixlang-pin").hexdigest()


async def pin_prefix(tm: TokenizerManager, body: Any, default_ttl_s: Optional[float],
                     owner: str = "") -> dict[str, Any]:
    """{"text" | "input_ids", "ttl_s"?} -> {"pin_id", "pinned_len", "input_len"}: locks what is cached."""
    ids, ttl_s = await tm.run_intake(parse_pin_body, tm, body, default_ttl_s, size=input_size(body))
    return await tm.pin_prefix(ids, ttl_s, owner)


def pin_id_of(body: Any) -> str:
    if not isinstance(body, dict) or "pin_id" not in body:
        raise BadRequest("unpin_prefix needs {\"pin_id\": \"...\"}")
    return need_str(body["pin_id"], "pin_id", MAX_RID_LEN)


async def unpin_prefix(tm: TokenizerManager, pin_id: str, owner: str = "") -> dict[str, Any]:
    return {"pin_id": pin_id, "success": await tm.unpin_prefix(pin_id, owner)}
