"""The kernels' test fixtures: `isa` (each C kernel test once per instruction set of this CPU)."""

from __future__ import annotations

import os
import shutil

from radixlang_kernels.testing import isa  # noqa: F401

# Triton kernels run interpreted on machines without a GPU; it must be set before triton is imported.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
