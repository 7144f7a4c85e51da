#!/usr/bin/env bash
# GPU check for the Triton kernels: correctness at test sizes (compiled, not interpreted), then
# bench_kernels.py (decode GB/s vs HBM, extend TFLOP/s, each next to torch SDPA). Under 8 minutes on
# one H100/H200-class GPU. Without CUDA it says so and exits 0.
#
#   bash benchmarks/gpu_check.sh            # uses .venv if present, else python3
#   OUT=/some/dir bash benchmarks/gpu_check.sh   # also writes kernels.json there
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no CUDA GPU on this machine; nothing to check (exit 0)"
    exit 0
fi
nvidia-smi -L
if ! "$PY" -c "import torch, triton; assert torch.cuda.is_available()" 2>/dev/null; then
    echo "gpu_check: installing torch + triton for CUDA"
    "$PY" -m pip install -q torch triton pytest || exit 1
fi
unset TRITON_INTERPRET
status=0
timeout 300 "$PY" -m pytest -q tests/test_triton_kernels.py || status=1
timeout 300 "$PY" benchmarks/bench_kernels.py ${OUT:+--json "$OUT/kernels.json"} || status=1
exit $status
