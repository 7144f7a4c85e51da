"""The MAC keys that seal KV records (record.py), torch-free.

With a deployment secret (--hicache-secret / --hicache-secret-file) every tier's key is derived from it, so
every replica that shares the secret reads what the others wrote, and nobody without it can write a record
they accept. Without one, an L2 directory gets a random key of its own, `<dir>/.mac_key` (32 random bytes,
mode 0600, created by this process's user). It is read without following a symlink, and refused unless it
is a regular file of this user that no one else may read or write: another user who can write the directory
cannot plant records this server accepts, nor swap the key for one of their own. It does not protect
against this same user (who can read the key) or root. L3 (Redis, shared by strangers) requires a secret.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat

KEY_FILE = ".mac_key"
KEY_LEN = 32


def mac_key_from_secret(secret: bytes) -> bytes:
    """A 32-byte MAC key derived from a deployment secret of any length (> 0)."""
    if not secret:
        raise ValueError("the hicache secret is empty")
    return hashlib.blake2b(secret, digest_size=KEY_LEN, person=b"radixlang-mac").digest()


def directory_mac_key(directory: str) -> bytes:
    """The random key of an L2 directory (made on first use). RuntimeError naming the file when it is a
    symlink, not a regular file, not this user's, readable or writable by others, or not 32 bytes."""
    path = os.path.join(directory, KEY_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_key(path)
    try:
        os.write(fd, secrets.token_bytes(KEY_LEN))
    finally:
        os.close(fd)
    return _read_key(path)


def _read_key(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise RuntimeError(f"hicache l2: cannot open the directory's MAC key {path} ({e}; a symlink is "
                           "refused): remove it or give --hicache-secret") from e
    try:
        st = os.fstat(fd)
        problem = ("is not a regular file" if not stat.S_ISREG(st.st_mode) else
                   "belongs to another user" if st.st_uid != os.geteuid() else
                   "may be read or written by others (needs mode 0600)" if st.st_mode & 0o077 else
                   f"holds {st.st_size} bytes, not {KEY_LEN}" if st.st_size != KEY_LEN else None)
        if problem is not None:
            raise RuntimeError(f"hicache l2: the directory's MAC key {path} {problem}: remove it (its records "
                               "become misses) or give --hicache-secret")
        return os.read(fd, KEY_LEN)
    finally:
        os.close(fd)
