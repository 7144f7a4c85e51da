"""L3: KV page records in Redis, shared by every replica and node that reaches it (torch-free).

Keys `radixlang:kv:<namespace>:<key hex>` (namespace: the fingerprint's digest, so `clear` drops only
this model's records); values are whole records (record.py) sealed by a MAC under the deployment secret's
key (secret.py: the shared tier is the one strangers can write, so it has no key of its own: a secret is
required, --hicache-secret / --hicache-secret-file); a value with a bad MAC is a miss, deleted, and
counted in faults and auth_faults. Every call has a bound (socket timeouts of `timeout_s`).
Faults are misses: Redis down, restarting or timing out, a corrupt or stale value ->
None / False, a count and one log line; after a connection fault the tier is skipped for
`retry_after_s` (requests do not each wait for the timeout), then tried again.
Expiry (`ttl_s`, --hicache-storage-backend-extra-config '{"ttl_s": N}'): a record expires N seconds after
its last write or read (SET EX; a hit's key gets EXPIRE again in one pipeline after the MGET), so a
shared store does not keep what no replica uses; None: records stay until evicted by Redis or flushed.
`bytes_stored` (stats, /metrics' hicache_used_bytes{tier="l3"}): the records this process wrote that are
still live by its own clock (each counted once however often rewritten; gone once expired by ttl_s from its
last write or read here, found bad, or flushed); another replica's reads keeping one alive are not seen.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Callable, Optional

from radixlang_runtime.mem.tiers.record import HEADER, RecordAuthError, RecordCodec, RecordError

logger = logging.getLogger(__name__)
MAX_TRACKED = 1 << 20  # records bytes_stored follows (the oldest written / read are forgotten past it)


class RedisTier:
    name = "l3"

    def __init__(self, url: str, namespace: str, record_bytes: Optional[int] = None, timeout_s: float = 1.0,
                 retry_after_s: float = 1.0, ttl_s: Optional[float] = None,
                 clock: Callable[[], float] = time.monotonic, *, mac_key: bytes):
        import redis  # the redis PyPI client; only needed when this tier is on

        self._errors = (redis.RedisError, OSError)
        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                           retry_on_timeout=False)
        self.url = url
        self.prefix = f"radixlang:kv:{namespace}:"
        self.record_bytes = record_bytes
        self.codec = RecordCodec(mac_key)
        self.retry_after_s = retry_after_s
        if ttl_s is not None and not 0 < ttl_s < float("inf"):
            raise ValueError(f"l3 ttl_s must be a positive number of seconds; got {ttl_s!r}")
        self.ttl_ms = None if ttl_s is None else max(int(ttl_s * 1000), 1)  # Redis PX
        self._down_until = 0.0
        self._lock = threading.Lock()
        self.faults = 0  # connection faults, timeouts, corrupt / stale / forged values
        self.auth_faults = 0  # of which: a bad MAC
        self._clock = clock
        # records this process wrote: key -> (bytes, expiry on clock; inf without ttl), in expiry order (one
        # ttl for all, so the order of the last write / read); bytes_stored = their sum
        self._stored: OrderedDict[bytes, tuple[int, float]] = OrderedDict()
        self._stored_bytes = 0

    def _name(self, key: bytes) -> str:
        return self.prefix + key.hex()

    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _fault(self, what: str, e: BaseException, down: bool) -> None:
        with self._lock:
            self.faults += 1
            if down:
                self._down_until = time.monotonic() + self.retry_after_s
        logger.warning("hicache l3 (%s): %s failed (%s: %s): a miss%s", self.url, what, type(e).__name__, e,
                       f"; skipped for {self.retry_after_s:g} s" if down else "")

    # ------------------------------------------------------------------ access
    def get_many(self, keys: list[bytes]) -> list[Optional[bytes]]:
        """Payloads of keys (None for a miss or a bad value: that value is deleted). All None while down."""
        if not keys or not self.available():
            return [None] * len(keys)
        try:
            blobs = self.client.mget([self._name(k) for k in keys])
        except self._errors as e:
            self._fault("read", e, down=True)
            return [None] * len(keys)
        if self.ttl_ms is not None and any(b is not None for b in blobs):
            hits = [k for k, b in zip(keys, blobs) if b is not None]
            if self._refresh(hits):
                self._track(hits)
        out: list[Optional[bytes]] = []
        for key, blob in zip(keys, blobs):
            if blob is None:
                out.append(None)
                continue
            try:
                out.append(self.codec.decode(key, blob, self.record_bytes))
            except RecordError as e:
                if isinstance(e, RecordAuthError):
                    with self._lock:
                        self.auth_faults += 1
                self._fault(f"record {key.hex()[:12]}", e, down=False)
                self._delete(key)
                out.append(None)
        return out

    def put(self, key: bytes, payload: bytes) -> bool:
        if not self.available():
            return False
        try:
            self.client.set(self._name(key), self.codec.encode(key, payload), px=self.ttl_ms)
        except self._errors as e:
            self._fault("write", e, down=True)
            return False
        self._track([key], HEADER.size + len(payload))
        return True

    def _expiry(self) -> float:
        return float("inf") if self.ttl_ms is None else self._clock() + self.ttl_ms / 1000

    def _track(self, keys: list[bytes], size: Optional[int] = None) -> None:
        """size: keys were written (size bytes each); None: read hits that got ttl_s again (ours only)."""
        with self._lock:
            expiry = self._expiry()
            for key in keys:
                old = self._stored.pop(key, None)
                if old is None and size is None:
                    continue
                self._stored_bytes += (old[0] if size is None else size) - (0 if old is None else old[0])
                self._stored[key] = (old[0] if size is None else size, expiry)
            while len(self._stored) > MAX_TRACKED:
                self._stored_bytes -= self._stored.popitem(last=False)[1][0]

    def _untrack(self, key: Optional[bytes] = None) -> None:
        """Forget key (None: every record)."""
        with self._lock:
            if key is None:
                self._stored.clear()
                self._stored_bytes = 0
            elif (old := self._stored.pop(key, None)) is not None:
                self._stored_bytes -= old[0]

    @property
    def bytes_stored(self) -> int:
        """Bytes of this process's records not yet expired by its clock (the expired are forgotten here)."""
        with self._lock:
            now = self._clock()
            while self._stored and next(iter(self._stored.values()))[1] <= now:
                self._stored_bytes -= self._stored.popitem(last=False)[1][0]
            return self._stored_bytes

    def _refresh(self, keys: list[bytes]) -> bool:
        """Read hits live ttl_s longer (one pipeline); a failure is counted (False), the hits stay hits."""
        try:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.pexpire(self._name(key), self.ttl_ms)
            pipe.execute()
        except self._errors as e:
            self._fault("expire", e, down=True)
            return False
        return True

    def _delete(self, key: bytes) -> None:
        self._untrack(key)
        try:
            self.client.delete(self._name(key))
        except self._errors:
            pass

    def _our_keys(self) -> list:
        return list(self.client.scan_iter(match=self.prefix + "*", count=1000))

    def clear(self) -> bool:
        """Delete this model's records. False when Redis cannot be reached (counted)."""
        try:
            names = self._our_keys()
            for i in range(0, len(names), 1000):
                self.client.delete(*names[i:i + 1000])
        except self._errors as e:
            self._fault("clear", e, down=True)
            return False
        self._untrack()
        return True

    # ------------------------------------------------------------------ checks
    def stats(self) -> dict:
        stored = self.bytes_stored
        with self._lock:
            return {"faults": self.faults, "auth_faults": self.auth_faults, "bytes_stored": stored,
                    "available": self.available(),
                    "ttl_s": None if self.ttl_ms is None else self.ttl_ms / 1000}

    def check_integrity(self, deep: bool = False) -> None:
        """Redis answers; deep: every record of this model passes its checks. Raises AssertionError."""
        try:
            self.client.ping()
            if deep:
                for name in self._our_keys():
                    key = bytes.fromhex(name.decode()[len(self.prefix):])
                    self.codec.decode(key, self.client.get(name), self.record_bytes)
        except self._errors as e:
            raise AssertionError(f"l3: Redis at {self.url} unreachable: {e}") from e
        except RecordError as e:
            raise AssertionError(f"l3: a bad record: {e}") from e
