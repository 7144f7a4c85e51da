"""L2: a local disk tier of KV page records (torch-free).

A directory of record files `<dir>/<key hex[:2]>/<key hex>.kv`, bounded by `capacity_bytes` with an
LRU of its own (the least recently read or written record goes first). Each record is written whole
to a temp file in the same directory and renamed into place (atomic: a reader sees an old record, a
whole new one, or none), and read with one sequential read.
Records are sealed by a keyed MAC (record.py) under `mac_key` (the deployment secret's) or, without one, the
directory's own random key (secret.py).
Faults are misses: a record that fails its checks (record.py; a bad MAC is also counted in auth_faults), a
file that vanished or cannot be read, a full disk on write -> the call returns None / False, counts it,
logs one line, and the bad file is removed.
Files are hostile: nothing in the directory is trusted to be what its name says. Only names of the cache's
own pattern (`<2 hex>/<32 hex>.kv`, temp files `<32 hex>.kv.<pid>.<tid>.tmp`) are indexed or deleted; no
symlink is followed, for reads, writes or deletes (subdirectories are opened O_NOFOLLOW and the files
inside them reached through that descriptor); a record is opened O_NOFOLLOW | O_NONBLOCK, refused unless
fstat says a regular file of exactly the record's size, then read to that size (a FIFO or a device never
blocks a load). Invariant (check_integrity): the index holds exactly the record files on disk (this
process's view), their sizes add up to `used_bytes` <= capacity_bytes.
The directory belongs to one process (one replica), held by an flock on `<dir>/.lock`: a second process
given the same directory (another DP replica) takes `<dir>/replica-1` (then -2, ...), so replicas never
evict each other's files and a restart finds its records again. L3 (redis_tier.py) is the shared tier.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
from collections import OrderedDict
from typing import Optional

from radixlang_runtime.mem.tiers.record import HEADER, RecordAuthError, RecordCodec, RecordError
from radixlang_runtime.mem.tiers.secret import directory_mac_key

logger = logging.getLogger(__name__)
SUFFIX = ".kv"
SUBDIR = re.compile(r"[0-9a-f]{2}")
RECORD = re.compile(r"[0-9a-f]{32}\.kv")
TEMP = re.compile(r"[0-9a-f]{32}\.kv\.\d+\.\d+\.tmp")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class DiskTier:
    name = "l2"

    def __init__(self, directory: str, capacity_bytes: int, record_bytes: Optional[int] = None,
                 mac_key: Optional[bytes] = None):
        if capacity_bytes <= 0:
            raise ValueError(f"disk tier capacity must be > 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.record_bytes = record_bytes  # expected payload size (None: any)
        self._lock = threading.Lock()
        self._index: OrderedDict[bytes, int] = OrderedDict()  # key -> file size, least recent first
        self.used_bytes = 0
        self.faults = 0  # corrupt / truncated / stale / forged / unreadable records and failed writes
        self.auth_faults = 0  # of which: a bad MAC
        self.evictions = 0
        self.dir, self._lock_file = _claim(directory)
        self.codec = RecordCodec(mac_key if mac_key is not None else directory_mac_key(self.dir))
        self._scan()

    @staticmethod
    def _names(key: bytes) -> tuple[str, str]:
        h = key.hex()
        return h[:2], h + SUFFIX

    def _path(self, key: bytes) -> str:
        return os.path.join(self.dir, *self._names(key))

    def _subdir(self, sub: str, create: bool = False) -> int:
        """An O_NOFOLLOW descriptor of <dir>/<sub> (OSError when it is a symlink or not a directory)."""
        path = os.path.join(self.dir, sub)
        if create:
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
        return os.open(path, _DIR_FLAGS)

    def _scan(self) -> None:
        """Index the records a previous process left (oldest first by mtime); drop stray temp files of ours.
        Entries of any other name or kind (symlinks, FIFOs, directories) are left alone and not indexed."""
        found = []
        with os.scandir(self.dir) as top:
            subs = [e.name for e in top if SUBDIR.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
        for sub in sorted(subs):
            try:
                fd = os.open(os.path.join(self.dir, sub), _DIR_FLAGS)
            except OSError:
                continue
            try:
                with os.scandir(fd) as entries:
                    for e in entries:
                        if not e.name.startswith(sub) or not e.is_file(follow_symlinks=False):
                            continue
                        if RECORD.fullmatch(e.name):
                            st = e.stat(follow_symlinks=False)
                            found.append((st.st_mtime, bytes.fromhex(e.name[:-len(SUFFIX)]), st.st_size))
                        elif TEMP.fullmatch(e.name):
                            _unlink_at(fd, e.name)
            finally:
                os.close(fd)
        for _, key, size in sorted(found):
            self._index[key] = size
            self.used_bytes += size
        self._shrink(0)

    # ------------------------------------------------------------------ access
    def contains(self, key: bytes) -> bool:
        with self._lock:
            return key in self._index

    def _read(self, key: bytes) -> bytes:
        """The record file's bytes: a regular file of the expected size, read to that size."""
        sub, name = self._names(key)
        dfd = self._subdir(sub)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        finally:
            os.close(dfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RecordError("not a regular file")
            want = HEADER.size + self.record_bytes if self.record_bytes is not None else None
            if (want is not None and st.st_size != want) or st.st_size > self.capacity_bytes:
                raise RecordError(f"{st.st_size} bytes on disk, a record has {want}")
            chunks, left = [], st.st_size
            while left > 0:
                chunk = os.read(fd, left)
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def get(self, key: bytes) -> Optional[bytes]:
        """The record's payload, or None (not here, or a fault: then the file is removed)."""
        with self._lock:
            if key not in self._index:
                return None
            self._index.move_to_end(key)
        try:
            return self.codec.decode(key, self._read(key), self.record_bytes)
        except FileNotFoundError:
            with self._lock:
                evicted = key not in self._index  # the LRU removed it meanwhile: a plain miss
            if not evicted:
                self._fault(key, "file vanished")
            return None
        except (OSError, RecordError) as e:
            self._fault(key, f"read: {e}", auth=isinstance(e, RecordAuthError))
            return None

    def put(self, key: bytes, payload: bytes) -> bool:
        """Store a record (evicting least recent ones to make room). False: too big, or a write fault."""
        size = HEADER.size + len(payload)
        with self._lock:
            if key in self._index:
                self._index.move_to_end(key)
                return True
            if size > self.capacity_bytes:
                return False
            self._shrink(size)
        sub, name = self._names(key)
        tmp = f"{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        dfd = -1
        try:
            dfd = self._subdir(sub, create=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb", closefd=False) as f:
                    f.write(self.codec.encode_header(key, payload))
                    f.write(payload)
            finally:
                os.close(fd)
            with self._lock:  # the rename and the index change together (check_integrity sees both or none)
                if key not in self._index:
                    self._shrink(size)  # another thread may have filled the room meanwhile
                    os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                    self._index[key] = size
                    self.used_bytes += size
        except OSError as e:  # full disk, read-only, gone, a symlink in the way: the record is simply not stored
            with self._lock:
                self.faults += 1
            logger.warning("hicache l2: write of %s failed (%s): not stored", key.hex()[:12], e)
            return False
        finally:
            if dfd >= 0:
                _unlink_at(dfd, tmp)  # (gone after a rename)
                os.close(dfd)
        return True

    def _remove(self, key: bytes) -> None:
        """Delete a record file of ours: through the subdirectory's O_NOFOLLOW descriptor, never a symlink's
        target (unlink removes the entry itself), a regular file or nothing."""
        sub, name = self._names(key)
        try:
            dfd = self._subdir(sub)
        except OSError:
            return
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                _unlink_at(dfd, name)
        except OSError:
            pass
        finally:
            os.close(dfd)

    def _shrink(self, room: int) -> None:
        """Drop least recent records until `room` more bytes fit. Caller holds the lock (or is __init__)."""
        while self._index and self.used_bytes + room > self.capacity_bytes:
            key, size = self._index.popitem(last=False)
            self.used_bytes -= size
            self.evictions += 1
            self._remove(key)

    def _fault(self, key: bytes, why: str, auth: bool = False) -> None:
        with self._lock:
            size = self._index.pop(key, None)
            if size is not None:
                self.used_bytes -= size
            self.faults += 1
            self.auth_faults += auth
        self._remove(key)
        logger.warning("hicache l2: record %s is a miss (%s); removed", key.hex()[:12], why)

    def clear(self) -> None:
        with self._lock:
            keys = list(self._index)
            self._index.clear()
            self.used_bytes = 0
        for key in keys:
            self._remove(key)

    def close(self) -> None:
        """Let another process (a restart) take this directory."""
        os.close(self._lock_file)

    # ------------------------------------------------------------------ checks
    def stats(self) -> dict:
        with self._lock:
            return {"records": len(self._index), "used_bytes": self.used_bytes,
                    "capacity_bytes": self.capacity_bytes, "faults": self.faults, "auth_faults": self.auth_faults,
                    "evictions": self.evictions}

    def _on_disk(self) -> dict[bytes, int]:
        """Record files of ours (regular, our name pattern, in real subdirectories) -> their sizes."""
        out = {}
        with os.scandir(self.dir) as top:
            subs = [e.path for e in top if SUBDIR.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
        for d in subs:
            with os.scandir(d) as entries:
                for e in entries:
                    if RECORD.fullmatch(e.name) and e.is_file(follow_symlinks=False):
                        out[bytes.fromhex(e.name[:-len(SUFFIX)])] = e.stat(follow_symlinks=False).st_size
        return out

    def check_integrity(self, deep: bool = False) -> None:
        """Index == files on disk with their sizes, used_bytes == their sum <= capacity; deep: every
        record also passes its checks."""
        with self._lock:
            index = dict(self._index)
            used = self.used_bytes
            on_disk = self._on_disk()
        if used != sum(index.values()) or used > self.capacity_bytes:
            raise AssertionError(f"l2: used {used} bytes, index sums to {sum(index.values())}, "
                                 f"capacity {self.capacity_bytes}")
        if on_disk != index:
            raise AssertionError(f"l2: {len(on_disk)} record files on disk, {len(index)} indexed (or sizes differ)")
        if deep:
            for key in index:
                self.codec.decode(key, self._read(key), self.record_bytes)


def _claim(directory: str, tries: int = 64) -> tuple[str, int]:
    """(dir, lock file descriptor): the first of directory, directory/replica-1, ... no other process holds.
    The lock file is opened without following a symlink and must be a regular file."""
    import fcntl

    for i in range(tries):
        d = directory if i == 0 else os.path.join(directory, f"replica-{i}")
        os.makedirs(d, mode=0o700, exist_ok=True)
        path = os.path.join(d, ".lock")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        except OSError as e:
            raise RuntimeError(f"hicache l2: cannot open {path} ({e}; a symlink is refused)") from e
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise RuntimeError(f"hicache l2: {path} is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return d, fd
        except OSError:
            os.close(fd)
    raise RuntimeError(f"hicache l2: {tries} processes already use {directory}")


def _unlink_at(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
