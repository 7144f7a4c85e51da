"""The weights' identity: a streaming content hash of a model's weight files (torch-free).

KV depends on every weight, so the hierarchical cache's fingerprint (keys.py) names the weights by their
bytes, not by file names and sizes: a fine-tune or an in-place update of the same shapes is another model.
`file_digest(path)` hashes a file once (SHA-256, 1 MiB reads) and keeps the digest in a sidecar,
`<file>.rldigest` beside it, or under `fallback_dir` when that directory is not writable. A sidecar is
trusted only while the file's (size, mtime_ns, ctime_ns, inode) are the ones it names: any write to the file,
or a `touch` that restores the mtime, changes the ctime and the file is hashed again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Optional

logger = logging.getLogger(__name__)
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth")
SIDECAR = ".rldigest"
ALGO = "sha256"
CHUNK = 1 << 20


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _sidecars(path: str, fallback_dir: Optional[str]) -> list[str]:
    out = [path + SIDECAR]
    if fallback_dir:
        name = hashlib.blake2b(os.path.abspath(path).encode(), digest_size=16).hexdigest()
        out.append(os.path.join(fallback_dir, "weight-digests", name + SIDECAR))
    return out


def _read_sidecar(sidecar: str, stamp: list[int]) -> Optional[str]:
    try:
        with open(sidecar, "rb") as f:
            saved = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    if isinstance(saved, dict) and saved.get("algo") == ALGO and saved.get("stamp") == stamp:
        digest = saved.get("digest")
        return digest if isinstance(digest, str) else None
    return None


def hash_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_digest(path: str, fallback_dir: Optional[str] = None) -> str:
    """The content hash of path (hex), from its sidecar when the file has not changed since, else computed
    and saved (best effort: an unwritable place only means hashing again next time)."""
    stamp = _stamp(os.stat(path))
    places = _sidecars(path, fallback_dir)
    for sidecar in places:
        if (digest := _read_sidecar(sidecar, stamp)) is not None:
            return digest
    digest = hash_file(path)
    if _stamp(os.stat(path)) != stamp:  # written while hashed: use it now, keep nothing
        return digest
    text = json.dumps({"algo": ALGO, "stamp": stamp, "digest": digest})
    for sidecar in places:
        try:
            os.makedirs(os.path.dirname(sidecar) or ".", exist_ok=True)
            tmp = f"{sidecar}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, sidecar)
            break
        except OSError:
            continue
    return digest


def weight_files(model_path: str) -> list[str]:
    """The weight files of a model directory (sorted), or the file itself (a .gguf)."""
    if os.path.isfile(model_path):
        return [model_path]
    if not os.path.isdir(model_path):
        return []
    return [os.path.join(model_path, n) for n in sorted(os.listdir(model_path)) if n.endswith(WEIGHT_SUFFIXES)
            and os.path.isfile(os.path.join(model_path, n))]


def weights_digest(model_path: str, fallback_dir: Optional[str] = None) -> str:
    """One digest over every weight file's name and content hash (hex); "" when there are none."""
    files = weight_files(model_path)
    if not files:
        return ""
    single = os.path.isfile(model_path)  # a .gguf: its content only (a renamed copy is the same model)
    h = hashlib.blake2b(digest_size=32)
    for path in files:
        h.update(f"{'' if single else os.path.basename(path)}:{file_digest(path, fallback_dir)}\n".encode())
    return h.hexdigest()
