"""L2: a local disk tier of KV page records (torch-free).

A directory of record files `<dir>/<key hex[:2]>/<key hex>.kv`, bounded by `capacity_bytes` with an
LRU of its own (the least recently read or written record goes first). Each record is written whole
to a temp file in the same directory and renamed into place (atomic: a reader sees an old record, a
whole new one, or none), and read with one sequential read.
Faults are misses: a record that fails its checks (record.py), a file that vanished or cannot be
read, a full disk on write -> the call returns None / False, counts it, logs one line, and the bad
file is removed. Invariant (check_integrity): the index holds exactly the record files on disk (this
process's view), their sizes add up to `used_bytes` <= capacity_bytes.
The directory belongs to one process (one replica), held by an flock on `<dir>/.lock`: a second process
given the same directory (another DP replica) takes `<dir>/replica-1` (then -2, ...), so replicas never
evict each other's files and a restart finds its records again. L3 (redis_tier.py) is the shared tier.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from typing import Optional

from radixlang_runtime.mem.tiers import record
from radixlang_runtime.mem.tiers.record import RecordError

logger = logging.getLogger(__name__)
SUFFIX = ".kv"


class DiskTier:
    name = "l2"

    def __init__(self, directory: str, capacity_bytes: int, record_bytes: Optional[int] = None):
        if capacity_bytes <= 0:
            raise ValueError(f"disk tier capacity must be > 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.record_bytes = record_bytes  # expected payload size (None: any)
        self._lock = threading.Lock()
        self._index: OrderedDict[bytes, int] = OrderedDict()  # key -> file size, least recent first
        self.used_bytes = 0
        self.faults = 0  # corrupt / truncated / stale / unreadable records and failed writes
        self.evictions = 0
        self.dir, self._lock_file = _claim(directory)
        self._scan()

    def _path(self, key: bytes) -> str:
        h = key.hex()
        return os.path.join(self.dir, h[:2], h + SUFFIX)

    def _scan(self) -> None:
        """Index the records a previous process left (oldest first by mtime); drop stray temp files."""
        found = []
        for sub in sorted(os.listdir(self.dir)):
            d = os.path.join(self.dir, sub)
            if not os.path.isdir(d) or sub.startswith("replica-"):
                continue
            for name in os.listdir(d):
                p = os.path.join(d, name)
                if not name.endswith(SUFFIX):
                    _unlink(p)
                    continue
                try:
                    st = os.stat(p)
                    found.append((st.st_mtime, bytes.fromhex(name[:-len(SUFFIX)]), st.st_size))
                except (OSError, ValueError):
                    _unlink(p)
        for _, key, size in sorted(found):
            self._index[key] = size
            self.used_bytes += size
        self._shrink(0)

    # ------------------------------------------------------------------ access
    def contains(self, key: bytes) -> bool:
        with self._lock:
            return key in self._index

    def get(self, key: bytes) -> Optional[bytes]:
        """The record's payload, or None (not here, or a fault: then the file is removed)."""
        with self._lock:
            if key not in self._index:
                return None
            self._index.move_to_end(key)
        try:
            with open(self._path(key), "rb") as f:
                blob = f.read()
            return record.decode(key, blob, self.record_bytes)
        except FileNotFoundError:
            with self._lock:
                evicted = key not in self._index  # the LRU removed it meanwhile: a plain miss
            if not evicted:
                self._fault(key, "file vanished")
            return None
        except (OSError, RecordError) as e:
            self._fault(key, f"read: {e}")
            return None

    def put(self, key: bytes, payload: bytes) -> bool:
        """Store a record (evicting least recent ones to make room). False: too big, or a write fault."""
        size = record.HEADER.size + len(payload)
        with self._lock:
            if key in self._index:
                self._index.move_to_end(key)
                return True
            if size > self.capacity_bytes:
                return False
            self._shrink(size)
        path = self._path(key)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(record.encode_header(key, payload))
                f.write(payload)
            with self._lock:  # the rename and the index change together (check_integrity sees both or none)
                if key not in self._index:
                    self._shrink(size)  # another thread may have filled the room meanwhile
                    os.replace(tmp, path)
                    self._index[key] = size
                    self.used_bytes += size
        except OSError as e:  # full disk, read-only, gone: the record is simply not stored
            with self._lock:
                self.faults += 1
            logger.warning("hicache l2: write of %s failed (%s): not stored", key.hex()[:12], e)
            return False
        finally:
            _unlink(tmp)  # (gone after a rename)
        return True

    def _shrink(self, room: int) -> None:
        """Drop least recent records until `room` more bytes fit. Caller holds the lock (or is __init__)."""
        while self._index and self.used_bytes + room > self.capacity_bytes:
            key, size = self._index.popitem(last=False)
            self.used_bytes -= size
            self.evictions += 1
            _unlink(self._path(key))

    def _fault(self, key: bytes, why: str) -> None:
        with self._lock:
            size = self._index.pop(key, None)
            if size is not None:
                self.used_bytes -= size
            self.faults += 1
        _unlink(self._path(key))
        logger.warning("hicache l2: record %s is a miss (%s); removed", key.hex()[:12], why)

    def clear(self) -> None:
        with self._lock:
            keys = list(self._index)
            self._index.clear()
            self.used_bytes = 0
        for key in keys:
            _unlink(self._path(key))

    def close(self) -> None:
        """Let another process (a restart) take this directory."""
        self._lock_file.close()

    # ------------------------------------------------------------------ checks
    def stats(self) -> dict:
        with self._lock:
            return {"records": len(self._index), "used_bytes": self.used_bytes,
                    "capacity_bytes": self.capacity_bytes, "faults": self.faults, "evictions": self.evictions}

    def check_integrity(self, deep: bool = False) -> None:
        """Index == files on disk with their sizes, used_bytes == their sum <= capacity; deep: every
        record also passes its checks."""
        with self._lock:
            index = dict(self._index)
            used = self.used_bytes
            on_disk = {}
            for sub in os.listdir(self.dir):
                d = os.path.join(self.dir, sub)
                if os.path.isdir(d) and not sub.startswith("replica-"):
                    for name in os.listdir(d):
                        if name.endswith(SUFFIX):
                            on_disk[bytes.fromhex(name[:-len(SUFFIX)])] = os.path.getsize(os.path.join(d, name))
        if used != sum(index.values()) or used > self.capacity_bytes:
            raise AssertionError(f"l2: used {used} bytes, index sums to {sum(index.values())}, "
                                 f"capacity {self.capacity_bytes}")
        if on_disk != index:
            raise AssertionError(f"l2: {len(on_disk)} record files on disk, {len(index)} indexed (or sizes differ)")
        if deep:
            for key in index:
                with open(self._path(key), "rb") as f:
                    record.decode(key, f.read(), self.record_bytes)


def _claim(directory: str, tries: int = 64):
    """(dir, open lock file): the first of directory, directory/replica-1, ... no other process holds."""
    import fcntl

    for i in range(tries):
        d = directory if i == 0 else os.path.join(directory, f"replica-{i}")
        os.makedirs(d, exist_ok=True)
        f = open(os.path.join(d, ".lock"), "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return d, f
        except OSError:
            f.close()
    raise RuntimeError(f"hicache l2: {tries} processes already use {directory}")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
