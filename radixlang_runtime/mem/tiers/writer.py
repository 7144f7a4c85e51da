"""TierWriter: the background thread that writes page records to the tiers (torch-free).

The scheduler thread copies a page's K/V out of the pool (it may be reused at once) and `submit`s
(key, payload, tiers); the writer thread stores it in each tier named. The queue is bounded: a full
queue drops the write (counted in `dropped`), never blocks the step. Until written, a record is
readable through `pending(key)` (a load does not miss what was just evicted).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Optional, Protocol

logger = logging.getLogger(__name__)


class Tier(Protocol):
    name: str

    def put(self, key: bytes, payload: bytes) -> bool: ...


class TierWriter:
    def __init__(self, max_queued: int = 256):
        self._q: queue.Queue = queue.Queue(maxsize=max_queued)
        self._pending: dict[bytes, bytes] = {}
        self._lock = threading.Lock()
        self.dropped = 0
        self.written: dict[str, int] = {}  # tier name -> records stored
        self.bytes_written: dict[str, int] = {}
        self.failed: dict[str, int] = {}  # tier name -> puts that returned False
        self._thread = threading.Thread(target=self._run, name="hicache-writer", daemon=True)
        self._thread.start()

    def submit(self, key: bytes, payload: bytes, tiers: list[Tier], wait_s: float = 0.0) -> bool:
        """Queue a write; a full queue drops it (counted) at once, or after wait_s seconds (shutdown)."""
        with self._lock:
            if key in self._pending:
                return True
            self._pending[key] = payload
        try:
            if wait_s > 0:
                self._q.put((key, payload, tiers), timeout=wait_s)
            else:
                self._q.put_nowait((key, payload, tiers))
        except queue.Full:
            with self._lock:
                self._pending.pop(key, None)
                self.dropped += 1
            return False
        return True

    def pending(self, key: bytes) -> Optional[bytes]:
        with self._lock:
            return self._pending.get(key)

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                key, payload, tiers = item
                for tier in tiers:
                    try:
                        ok = tier.put(key, payload)
                    except Exception:  # noqa: BLE001 - a tier's bug must not stop the writer
                        logger.exception("hicache %s: put failed", tier.name)
                        ok = False
                    with self._lock:
                        book = self.written if ok else self.failed
                        book[tier.name] = book.get(tier.name, 0) + 1
                        if ok:
                            self.bytes_written[tier.name] = self.bytes_written.get(tier.name, 0) + len(payload)
                with self._lock:
                    self._pending.pop(key, None)
            finally:
                self._q.task_done()

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait (bounded) until every submitted record is written or failed; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._q.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def discard_queued(self) -> None:
        """Forget writes not yet started (flush): they would refill a tier just cleared."""
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                with self._lock:
                    self._pending.pop(item[0], None)
            self._q.task_done()

    def close(self, timeout_s: float = 5.0) -> None:
        try:
            self._q.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def stats(self) -> dict:
        with self._lock:
            return {"queued": self._q.qsize(), "dropped": self.dropped, "written": dict(self.written),
                    "failed": dict(self.failed), "bytes_written": dict(self.bytes_written)}
