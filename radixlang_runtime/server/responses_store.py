"""The stored responses behind `previous_response_id` and GET / DELETE /v1/responses/{id} (no torch).

An in-memory store of this server process, bounded three ways: at most --responses-store-max-entries
responses, --responses-store-max-bytes bytes (each entry's JSON size), each kept --responses-store-ttl
seconds. Putting into a full store evicts the oldest entries (expired ones first); an entry larger than
the whole byte cap is not kept. Each entry holds its response object and its conversation (the chat
messages through its output, instructions excluded), so a chain reads one entry whatever was evicted
before it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class StoredResponse:
    response: dict  # the response object as GET returns it
    conversation: list[dict]  # chat messages through this response's output (a chain's next turn renders them)
    size: int  # bytes: the JSON of both
    expires_at: float  # the store clock's time


class ResponseNotFound(LookupError):
    """An id the store does not hold (never stored, store: false, deleted, expired or evicted): HTTP 404."""

    def __init__(self, response_id: str, param: Optional[str] = None):
        super().__init__(f"Response with id {response_id!r} not found (never stored, stored with store: false, "
                         "deleted, expired or evicted).")
        self.param = param


class ResponsesStore:
    def __init__(self, max_entries: int, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.max_entries, self.max_bytes, self.ttl_s, self.clock = max_entries, max_bytes, ttl_s, clock
        self._entries: "OrderedDict[str, StoredResponse]" = OrderedDict()  # oldest first
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response_id: str, response: dict, conversation: list[dict]) -> bool:
        """Keeps the entry (evicting the oldest as needed); False when it alone exceeds max_bytes."""
        size = len(json.dumps(response, ensure_ascii=False).encode()) + \
            len(json.dumps(conversation, ensure_ascii=False).encode())
        if size > self.max_bytes or self.max_entries == 0:
            return False
        with self._lock:
            self._drop(response_id)
            self._expire()
            while self._entries and (len(self._entries) >= self.max_entries or self._bytes + size > self.max_bytes):
                self._drop(next(iter(self._entries)))
            self._entries[response_id] = StoredResponse(response, conversation, size, self.clock() + self.ttl_s)
            self._bytes += size
        return True

    def get(self, response_id: str, param: Optional[str] = None) -> StoredResponse:
        """Raises ResponseNotFound (param: the request field that named it)."""
        with self._lock:
            self._expire()
            entry = self._entries.get(response_id)
        if entry is None:
            raise ResponseNotFound(response_id, param)
        return entry

    def delete(self, response_id: str) -> None:
        """Raises ResponseNotFound."""
        with self._lock:
            self._expire()
            if not self._drop(response_id):
                raise ResponseNotFound(response_id)

    def stats(self) -> dict:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self._bytes}

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry.size
        return entry is not None

    def _expire(self) -> None:
        now = self.clock()
        while self._entries:
            first_id, first = next(iter(self._entries.items()))
            if first.expires_at > now:  # entries are in insertion order, all with the same ttl
                return
            self._drop(first_id)
