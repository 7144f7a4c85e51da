"""ZeroMQ endpoints of one server instance: ipc:// sockets in a private temporary directory.

Who binds: each receiver binds its PULL socket (scheduler_in, detokenizer_in, tokenizer_in); senders
connect PUSH sockets. The directory is created 0700 so no other user can talk to the runtime.
With data parallelism each replica's scheduler has its own input (`scheduler_in_of(i)`); the
detokenizer and the tokenizer manager are shared.
"""

from __future__ import annotations

import glob
import os
import tempfile
from dataclasses import dataclass, replace


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

    def scheduler_in_of(self, replica: int) -> str:
        """Replica `replica`'s scheduler input (replica 0: scheduler_in)."""
        return self.scheduler_in if replica == 0 else f"{self.scheduler_in}{replica}"

    def for_replica(self, replica: int) -> "IpcPaths":
        """These paths as replica `replica`'s scheduler process sees them."""
        return replace(self, scheduler_in=self.scheduler_in_of(replica))

    def cleanup(self) -> None:
        for path in glob.glob(os.path.join(self.root, "*")):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        try:
            os.rmdir(self.root)
        except OSError:
            pass
