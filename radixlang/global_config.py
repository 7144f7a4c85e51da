"""Process-wide frontend settings (SGLang's `global_config`, plus the bounds on every wait).

Invariant: every blocking wait in the frontend is bounded by one of the timeouts below (or by a
backend's own request timeout), so a lost server or a stuck worker surfaces as an exception.
"""

from __future__ import annotations

from typing import Any, Optional


class GlobalConfig:
    def __init__(self) -> None:
        self.verbosity = 0
        self.default_backend: Optional[Any] = None
        self.skip_special_tokens_in_output = True
        self.spaces_between_special_tokens_in_out = True
        self.enable_precache_with_tracing = True
        self.enable_parallel_encoding = True
        # bounds (seconds)
        self.wait_timeout = 600.0  # s[v], text(), sync(), join(): the longest a program waits on its own work
        self.request_timeout = 600.0  # one backend call (HTTP read, ZMQ reply, Engine result)
        self.precache_min_chars = 64  # run_batch pre-fills a traced prefix longer than this


global_config = GlobalConfig()

__all__ = ["GlobalConfig", "global_config"]
