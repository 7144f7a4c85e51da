"""The compile process: `python -m radixlang_runtime.constrained.worker_child MEMORY_BYTES [PARENT_PID [BACKEND]]`
(backends.py names BACKEND; default outlines).

Imports the backend's library (outlines-core by default), msgpack and the torch-free compile modules
only. Runs under RLIMIT_AS = MEMORY_BYTES (0: no cap) plus, for xgrammar (which loads torch) and
llguidance, the address space in use once the library is imported, so a hostile grammar ends this
process (Rust / C++ abort on a failed allocation), never the server. The parent kills it past the
time limit; it dies with its parent PARENT_PID (child_process.py), even a SIGKILLed one.

Protocol (framing.py frames; requests on stdin, replies on a private dup of stdout, whose fd 1 is
pointed at stderr so stray prints cannot corrupt the channel):
  {"op": "vocab", "tid", "eos", "sentinel", "tokens": [[bytes, [ids]], ...]} -> {"op": "vocab", "ok": True}
  {"op": "compile", "job", "tid", "kind", "text", "disk": dir | None}
      -> {"op": "compile", "job", "ok": True, "index": pickled Index, "seconds", "from_disk"}
       | {"op": "compile", "job", "ok": False, "error": message}
Disk cache: <disk>/<tid>/<sha256 of kind + text>.idx, written atomically (tmp + rename), entries
over DISK_MAX_BYTES not written; an unreadable entry is deleted and recompiled.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import time
from typing import Any, Optional

DISK_MAX_BYTES = 256 << 20


def disk_path(disk: Optional[str], tid: str, kind: str, text: str, backend: str = "outlines") -> Optional[str]:
    if not disk:
        return None
    key = f"{kind}\x00{text}" if backend == "outlines" else f"{backend}\x00{kind}\x00{text}"
    h = hashlib.sha256(key.encode("utf-8")).hexdigest()
    return os.path.join(disk, tid, h + ".idx")


def _from_disk(path: Optional[str]) -> Optional[bytes]:
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
        pickle.loads(data)  # validate: a truncated or foreign file is recompiled
        return data
    except Exception:  # noqa: BLE001 - any unreadable entry is replaced
        try:
            os.unlink(path)
        except OSError:
            pass
        return None


def _to_disk(path: Optional[str], data: bytes) -> None:
    if path is None or len(data) > DISK_MAX_BYTES:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass  # the disk cache is an optimisation


def handle(msg: dict[str, Any], vocabs: dict[str, Any], backend: str = "outlines") -> dict[str, Any]:
    from radixlang_runtime.constrained.backends import compile_payload, vocab_object

    if msg["op"] == "vocab":
        byte_map = {bytes(b): list(ids) for b, ids in msg["tokens"]}
        vocabs[msg["tid"]] = vocab_object(backend, msg["eos"], msg["sentinel"], byte_map)
        return {"op": "vocab", "ok": True}
    job = msg["job"]
    t0 = time.perf_counter()
    path = disk_path(msg.get("disk"), msg["tid"], msg["kind"], msg["text"], backend)
    data = _from_disk(path)
    if data is not None:
        return {"op": "compile", "job": job, "ok": True, "index": data,
                "seconds": time.perf_counter() - t0, "from_disk": True}
    entry = vocabs.get(msg["tid"])
    if entry is None:
        return {"op": "compile", "job": job, "ok": False, "error": f"no vocabulary {msg['tid']} in the worker"}
    try:
        index = compile_payload(backend, msg["kind"], msg["text"], entry)
    except ValueError as e:
        return {"op": "compile", "job": job, "ok": False, "error": str(e)}
    seconds = time.perf_counter() - t0
    data = pickle.dumps(index)
    del index
    _to_disk(path, data)
    return {"op": "compile", "job": job, "ok": True, "index": data, "seconds": seconds, "from_disk": False}


def _address_space() -> int:
    """VmSize of this process in bytes (torch, loaded by xgrammar, maps several GiB it never touches)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    import resource

    from radixlang_runtime.utils.child_process import bind_to_parent
    from radixlang_runtime.constrained.framing import FrameReader, read_frame_blocking, write_frame

    if len(sys.argv) > 2:
        bind_to_parent(int(sys.argv[2]))
    os.nice(10)  # compiles are background work: the forward's threads take the cores first
    mem = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    backend = sys.argv[3] if len(sys.argv) > 3 else "outlines"
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from radixlang_runtime.constrained.backends import import_backend

    import_backend(backend)  # loaded before the cap, so the cap measures the compile
    if mem > 0:
        cap = mem if backend == "outlines" else mem + _address_space()
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    vocabs: dict[str, Any] = {}
    reader, pending = FrameReader(), []
    while True:
        msg = read_frame_blocking(0, reader, pending)
        if msg is None:
            return
        try:
            reply = handle(msg, vocabs, backend)
        except MemoryError:
            reply = {"op": msg.get("op"), "job": msg.get("job", -1), "ok": False, "error": "memory"}
        write_frame(out_fd, reply)


if __name__ == "__main__":
    main()
