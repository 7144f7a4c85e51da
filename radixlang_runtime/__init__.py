"""radixlang_runtime: the serving runtime (scheduler, paged KV cache, model runner, server)."""

from typing import Any

from radixlang_kernels.cpu_caps import apply_mask_to_environment

apply_mask_to_environment()  # RADIXLANG_CPU_MASK also caps oneDNN; must precede torch's first GEMM

__all__ = ["Engine", "ServerArgs"]
from radixlang_runtime.version import __version__  # noqa: E402, F401 (the package's version)


def __getattr__(name: str) -> Any:  # lazy: importing the package must not import torch
    if name == "Engine":
        from radixlang_runtime.entrypoints.engine import Engine

        return Engine
    if name == "ServerArgs":
        from radixlang_runtime.server_args import ServerArgs

        return ServerArgs
    raise AttributeError(name)
