"""Shared fixtures. The real-model fixtures load the embedded SmolLM2 once per test run."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import settings

from radixlang_kernels.testing import interpret_triton_without_gpu, isas, use_isa_library

# Triton kernels run interpreted on machines without a GPU; it must be set before triton is imported.
interpret_triton_without_gpu()

# NGRAM's keep-or-drop rule measures step costs online (speculative/spec_cost.py); on a loaded CI machine that
# would make which drafts run (and so "some draft was accepted" assertions) depend on timing. The suite pins it
# to the prior; tests/speculative/test_spec_cost.py checks the measured mode with synthetic timings.
os.environ.setdefault("RADIXLANG_SPEC_STEP_COST", "fixed")

# Property tests: scripts/test.sh (and so CI) runs the "repeatable" profile, each test's examples drawn from a seed
# fixed by the test itself, so a run that passed here passes there; a plain pytest run draws fresh examples (the
# default profile), which is how new failing cases are found (`--hypothesis-seed N` repeats one such run).
settings.register_profile("repeatable", derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "default")


def wait_idle(engine, timeout: float = 30.0) -> None:
    """Aborts are asynchronous: wait until the scheduler holds no request."""
    deadline = time.time() + timeout
    while not engine.scheduler.is_idle:
        if time.time() > deadline:
            raise AssertionError("scheduler did not go idle")
        time.sleep(0.01)


def assert_whole(engine) -> None:
    """Once idle: every KV page is free or in the radix cache (none locked), every table row free."""
    wait_idle(engine)
    engine.check_integrity()  # each page free, cached or held by exactly one live request
    st = engine.get_stats()
    assert st["free_slots"] + st["cached_slots"] == st["total_slots"], f"KV slots leaked: {st}"
    assert st["evictable_slots"] == st["cached_slots"], f"cache entries still locked: {st}"
    assert engine.scheduler.table.available == engine.scheduler.table.num_rows, "table rows leaked"


@pytest.fixture(scope="session", autouse=True)
def _shared_servers():
    """Stops server_utils.shared_server's servers when the session ends (none started: nothing to do)."""
    yield
    from server_utils import stop_shared_servers

    bad = stop_shared_servers()
    assert not bad, "\n".join(bad)


def running_engine(**kw):
    """A fixture's body: an Engine with these ServerArgs, shut down after (`yield from running_engine(...)`)."""
    from radixlang_runtime import Engine

    eng = Engine(**kw)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def engine_fp32():
    yield from running_engine(dtype="float32", max_total_tokens=8192, debug_check_integrity=True)


@pytest.fixture(scope="session")
def engine_bf16():
    """The CPU default path: bf16, page size 16, packed linears and the C kernels."""
    from radixlang_runtime import Engine

    eng = Engine(dtype="bfloat16", max_total_tokens=8192, debug_check_integrity=True)
    yield eng
    eng.shutdown()


@pytest.fixture
def engine(engine_fp32):
    """The session engine, checked whole after every test that uses it."""
    yield engine_fp32
    assert_whole(engine_fp32)


@pytest.fixture(scope="session")
def hf_model(engine_fp32):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(engine_fp32.model_dir, dtype=torch.float32)
    return model.eval()


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "The three primary colors are",
    "import numpy as np\nx = np.",
    "Water boils at a temperature of",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox",
    "In 1969, the first human",
]


@pytest.fixture(scope="session")
def hf_greedy(hf_model, engine_fp32):
    """transformers' greedy continuation of a token list (batch 1, no padding), memoised."""
    import torch

    cache: dict[tuple, list[int]] = {}

    def run(ids: list[int], n: int) -> list[int]:
        key = (tuple(ids), n)
        if key not in cache:
            with torch.no_grad():
                out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                        max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                        eos_token_id=2, pad_token_id=2)
            cache[key] = out[0, len(ids):].tolist()
        return cache[key]

    return run


@pytest.fixture(params=isas())
def isa(request, monkeypatch):
    """Each C kernel test once per instruction set of this CPU (radixlang_kernels.testing)."""
    return use_isa_library(request.param, monkeypatch)
