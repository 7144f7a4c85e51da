"""The /v1/responses response object and its stream's typed events, from the chat path's results (no torch).

output_items: a finished chat message (content, reasoning_content, tool_calls) -> output items: a
`reasoning` item (with a --reasoning-parser), a `message` with one `output_text` part (left out when the
reply is only calls), one `function_call` item per call (`call_id`: the call's id). ResponseEvents turns
the chat path's stream deltas into the event sequence the openai SDK's `responses.stream` reads:
response.created, response.in_progress, per item output_item.added, (content_part.added, text deltas,
text done, content_part.done) or function_call_arguments.delta / .done, output_item.done, then
response.completed (response.incomplete when max_output_tokens cut it); each with its sequence_number.
OutputShape adds what the request asked for: the reasoning text as the reasoning item's `summary` too
(streamed with the reasoning_summary_part / reasoning_summary_text events beside the reasoning_text ones),
its `encrypted_content` (responses_sealed.py), the output_text part's `logprobs` (chat's logprobs.content
entries, the same shape; streamed: each text delta carries those of the tokens since the one before, and
the tokens after the last one an empty delta before output_text.done, so the deltas carry each once).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from radixlang_runtime.server.http_common import sse
from radixlang_runtime.server.responses_sealed import seal_reasoning


@dataclass(frozen=True)
class OutputShape:
    summary: bool = False  # reasoning.summary: the reasoning text is the reasoning item's summary
    sealed: bool = False  # include reasoning.encrypted_content


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_usage(chat_usage: dict) -> dict:
    """Chat's usage -> Responses' (input / output tokens, cached input tokens, reasoning tokens)."""
    reasoning = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
    return {"input_tokens": chat_usage["prompt_tokens"], "output_tokens": chat_usage["completion_tokens"],
            "total_tokens": chat_usage["total_tokens"],
            "input_tokens_details": {"cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"],
                                     "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": reasoning}}


def status_of(finish: Optional[str]) -> tuple[str, Optional[dict]]:
    """A chat finish_reason -> (the response's status, its incomplete_details)."""
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def response_object(response_id: str, created: int, model: str, echo: dict, status: str, output: list[dict],
                    usage: Optional[dict], incomplete: Optional[dict] = None) -> dict:
    return {"id": response_id, "object": "response", "created_at": created, "model": model, "status": status,
            "error": None, "incomplete_details": incomplete, "output": output, "usage": usage,
            "completed_at": int(time.time()) if status != "in_progress" else None, **echo}


def _message_item(text: str, status: str = "completed", item_id: Optional[str] = None) -> dict:
    return {"id": item_id or new_id("msg"), "type": "message", "role": "assistant", "status": status,
            "content": [_text_part(text)] if text is not None else []}


def _text_part(text: str, logprobs: Optional[list] = None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _reasoning_item(text: str, status: str = "completed", item_id: Optional[str] = None,
                    shape: OutputShape = OutputShape()) -> dict:
    item = {"id": item_id or new_id("rs"), "type": "reasoning", "status": status,
            "summary": [{"type": "summary_text", "text": text}] if shape.summary and text is not None else [],
            "content": [{"type": "reasoning_text", "text": text}] if text is not None else []}
    if shape.sealed and text is not None:
        item["encrypted_content"] = seal_reasoning(text)
    return item


def _call_item(call_id: str, name: str, arguments: str, status: str = "completed",
               item_id: Optional[str] = None) -> dict:
    return {"id": item_id or new_id("fc"), "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def output_items(message: dict, shape: OutputShape = OutputShape(), logprobs: Optional[list] = None) -> list[dict]:
    """A finished chat message (and its chat logprobs.content entries) -> the response's output items."""
    items = []
    if message.get("reasoning_content"):
        items.append(_reasoning_item(message["reasoning_content"], shape=shape))
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        items.append(_message_item(message.get("content") or ""))
        items[-1]["content"][0]["logprobs"] = logprobs or []
    items += [_call_item(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]
    return items


def conversation_turn(output: list[dict]) -> list[dict]:
    """Output items -> the assistant chat message a chain's next turn renders (reasoning left out)."""
    text = "".join(p["text"] for it in output if it["type"] == "message" for p in it["content"])
    calls = [{"id": it["call_id"], "type": "function", "function": {"name": it["name"], "arguments": it["arguments"]}}
             for it in output if it["type"] == "function_call"]
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = calls
    return [msg]


class ResponseEvents:
    """One streamed response: chat deltas in, SSE events out (bytes); `output` holds the finished items."""

    def __init__(self, skeleton: dict, shape: OutputShape = OutputShape()):
        self.skeleton = skeleton  # the response object while in progress (output / usage filled at the end)
        self.shape = shape
        self.seq = 0
        self.output: list[dict] = []
        self.open: Optional[dict] = None  # the item being streamed
        self.logprobs: list[dict] = []  # the tokens' logprobs not yet sent with a text delta

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(event)

    def start(self) -> list[bytes]:
        r = {**self.skeleton, "status": "in_progress", "output": [], "usage": None, "completed_at": None}
        return [self._event("response.created", response=r), self._event("response.in_progress", response=r)]

    def _where(self) -> dict:
        return {"item_id": self.open["id"], "output_index": len(self.output)}

    def _begin(self, item: dict, part: Optional[dict]) -> list[bytes]:
        self.open = item
        out = [self._event("response.output_item.added", output_index=len(self.output), item=item)]
        if part is not None:
            out.append(self._event("response.content_part.added", content_index=0, part=part, **self._where()))
        return out

    def reasoning(self, delta: str) -> list[bytes]:
        out = []
        if not (self.open and self.open["type"] == "reasoning"):
            out = self.close() + self._begin(_reasoning_item(None, "in_progress"), {"type": "reasoning_text",
                                                                                   "text": ""})
            if self.shape.summary:
                out.append(self._event("response.reasoning_summary_part.added", summary_index=0,
                                       part={"type": "summary_text", "text": ""}, **self._where()))
        self.open["_text"] = self.open.get("_text", "") + delta
        out.append(self._event("response.reasoning_text.delta", content_index=0, delta=delta, **self._where()))
        if self.shape.summary:
            out.append(self._event("response.reasoning_summary_text.delta", summary_index=0, delta=delta,
                                   **self._where()))
        return out

    def add_logprobs(self, entries: list[dict]) -> None:
        """A snapshot's tokens' logprobs (chat's logprobs.content entries): sent with the next text delta."""
        self.logprobs += entries

    def text(self, delta: str) -> list[bytes]:
        out = [] if self.open and self.open["type"] == "message" else \
            self.close() + self._begin(_message_item(None, "in_progress"), _text_part(""))
        self.open["_text"] = self.open.get("_text", "") + delta
        sent, self.logprobs = self.logprobs, []
        self.open["_logprobs"] = self.open.get("_logprobs", []) + sent
        return out + [self._event("response.output_text.delta", content_index=0, delta=delta, logprobs=sent,
                                  **self._where())]

    def call(self, delta: dict) -> list[bytes]:
        """A chat tool_calls delta: a call's start (id, name) or a piece of its arguments."""
        tc = delta["tool_calls"][0]
        out = []
        if tc.get("id"):
            out = self.close() + self._begin(_call_item(tc["id"], tc["function"]["name"], "", "in_progress"), None)
        piece = tc["function"].get("arguments") or ""
        if piece:
            self.open["_text"] = self.open.get("_text", "") + piece
            out.append(self._event("response.function_call_arguments.delta", delta=piece, **self._where()))
        return out

    def chat_delta(self, delta: dict) -> list[bytes]:
        if "tool_calls" in delta:
            return self.call(delta)
        return self.text(delta["content"]) if delta.get("content") else []

    def close(self) -> list[bytes]:
        """Ends the open item: its done events, the item kept in output. A message's tokens no text delta has
        carried yet (the turn's last ones, whose text is empty or was held back) first go out on one more
        output_text.delta with an empty `delta`, as the chat stream sends them on an empty content delta."""
        pending = self.logprobs and self.open is not None and self.open["type"] == "message"
        out = self.text("") if pending else []
        item, self.open = self.open, None
        if item is None:
            return []
        text = item.pop("_text", "")
        where = {"item_id": item["id"], "output_index": len(self.output)}
        if item["type"] == "message":
            lps = item.pop("_logprobs", [])
            part = _text_part(text, lps)
            out += [self._event("response.output_text.done", content_index=0, text=text, logprobs=lps, **where),
                    self._event("response.content_part.done", content_index=0, part=part, **where)]
            item = {**_message_item(text, item_id=item["id"]), "content": [part]}
        elif item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            out += [self._event("response.reasoning_text.done", content_index=0, text=text, **where),
                    self._event("response.content_part.done", content_index=0, part=part, **where)]
            if self.shape.summary:
                summary = {"type": "summary_text", "text": text}
                out += [self._event("response.reasoning_summary_text.done", summary_index=0, text=text, **where),
                        self._event("response.reasoning_summary_part.done", summary_index=0, part=summary,
                                    **where)]
            item = _reasoning_item(text, item_id=item["id"], shape=self.shape)
        else:
            out.append(self._event("response.function_call_arguments.done", arguments=text, name=item["name"], **where))
            item = _call_item(item["call_id"], item["name"], text, item_id=item["id"])
        self.output.append(item)
        return out + [self._event("response.output_item.done", output_index=where["output_index"], item=item)]

    def finish(self, usage: dict, finish: Optional[str]) -> tuple[list[bytes], dict]:
        """The last events (response.completed / .incomplete) and the final response object."""
        out = self.close()
        if not any(o["type"] in ("message", "function_call") for o in self.output):
            # as output_items: a reply without text or calls (empty, or only reasoning) is still one message
            out += self._begin(_message_item(None, "in_progress"), _text_part("")) + self.close()
        status, incomplete = status_of(finish)
        final = {**self.skeleton, "status": status, "incomplete_details": incomplete, "output": self.output,
                 "usage": usage, "completed_at": int(time.time())}
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + [self._event(kind, response=final)], final
