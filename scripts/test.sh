#!/usr/bin/env bash
# Sets everything up, lints (ruff check ., configured in pyproject.toml: a finding fails the run
# before any test), then runs the whole test suite on the embedded model (CPU), then the tests that
# drive the model's kernels once more under the strongest capability mask (no AVX2/AVX-512, no C
# compiler: every torch fallback runs, whatever this CPU is): token-for-token parity with transformers,
# a cached prefix through the paged extend path, continuous batching, a fault in the forward, and the
# kernels' planner and capability tests. Every test has a time limit (pytest-timeout, pyproject.toml): a
# hang fails one test instead of freezing the run.
set -euo pipefail
cd "$(dirname "$0")/.."
# Property tests draw the same examples on every machine (tests/conftest.py); unset it to explore fresh ones.
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE-repeatable}"
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q --durations=25 tests kernels/tests "$@"
RADIXLANG_CPU_MASK=avx2,cc exec .venv/bin/python -m pytest -q "$@" \
    tests/model/test_model_parity.py \
    tests/mem/test_radix_e2e.py::test_bf16_cached_prefix_goes_through_the_paged_extend_kernel \
    tests/mem/test_radix_e2e.py::test_concurrent_requests_share_one_prefix_computation \
    tests/entrypoints/test_engine.py::test_single_and_batch_shapes \
    tests/entrypoints/test_engine.py::test_requests_arriving_mid_decode_match_their_solo_output \
    "tests/entrypoints/test_faults_engine.py::test_failed_request_errors_fast_and_others_finish[forward]" \
    kernels/tests/test_cpu_caps.py kernels/tests/test_cpu_plan.py
