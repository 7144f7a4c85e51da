#!/usr/bin/env bash
# Sets everything up, lints (ruff check ., configured in pyproject.toml: a finding fails the run
# before any test), then runs the whole test suite on the embedded model (CPU), then the bf16
# engine and fault tests once more under the strongest capability mask (no AVX2/AVX-512, no C
# compiler: every torch fallback runs, whatever this CPU is; the kernels' planner and capability tests
# run there too). Every test has a time limit (pytest-timeout, pyproject.toml): a hang fails one test
# instead of freezing the run.
set -euo pipefail
cd "$(dirname "$0")/.."
# Property tests draw the same examples on every machine (tests/conftest.py); unset it to explore fresh ones.
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE-repeatable}"
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q --durations=25 tests kernels/tests "$@"
RADIXLANG_CPU_MASK=avx2,cc exec .venv/bin/python -m pytest -q "$@" \
    tests/model/test_model_parity.py tests/mem/test_radix_e2e.py tests/entrypoints/test_faults_engine.py tests/entrypoints/test_engine.py \
    kernels/tests/test_cpu_caps.py kernels/tests/test_cpu_plan.py
