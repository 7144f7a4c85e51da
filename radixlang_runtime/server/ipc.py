"""ZeroMQ endpoints of one server instance: ipc:// sockets in a private temporary directory.

Who binds: each receiver binds its PULL socket (scheduler_in, detokenizer_in, tokenizer_in); senders
connect PUSH sockets. The directory is created 0700 so no other user can talk to the runtime.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class IpcPaths:
    root: str
    scheduler_in: str  # tokenizer manager -> scheduler
    detokenizer_in: str  # scheduler -> detokenizer
    tokenizer_in: str  # detokenizer and scheduler -> tokenizer manager

    @classmethod
    def create(cls) -> "IpcPaths":
        root = tempfile.mkdtemp(prefix="radixlang-")
        os.chmod(root, 0o700)
        return cls(root, f"ipc://{root}/scheduler", f"ipc://{root}/detokenizer", f"ipc://{root}/tokenizer")

    def cleanup(self) -> None:
        for name in ("scheduler", "detokenizer", "tokenizer"):
            try:
                os.unlink(os.path.join(self.root, name))
            except FileNotFoundError:
                pass
        try:
            os.rmdir(self.root)
        except OSError:
            pass
