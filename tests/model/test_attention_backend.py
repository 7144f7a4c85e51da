"""The torch attention backend against kernels/reference.py on ragged paged batches."""

from __future__ import annotations

import random

import pytest
import torch

from radixlang_kernels.reference import paged_attention_ref
from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.kv_pool import KVPool
from radixlang_kernels import cpu_ops
from radixlang_runtime.model.layers.attention.torch_backend import TorchAttentionBackend
from radixlang_runtime.model.executor.forward_batch import ForwardBatch


def run_case(H, hkv, D, page_size, prefix_lens, extend_lens, dtype=torch.float32, seed=0, kernels=False, window=0,
             soft_cap=0.0, rows_like_extend=False, sinks=None):
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    pool = KVPool(2048, 1, hkv, D, dtype, torch.device("cpu"), table_rows=8, context_len=512)
    pool.k_buffers[0].copy_(torch.randn(pool.k_buffers[0].shape, generator=g))  # stale data everywhere
    pool.v_buffers[0].copy_(torch.randn(pool.v_buffers[0].shape, generator=g))
    alloc = PageAllocator(2048, page_size)
    alloc.alloc_extend(-1, 0, page_size * rng.randrange(1, 5))  # slots do not start at 0
    rows = rng.sample(range(8), len(prefix_lens))
    out_loc = []
    for row, p, n in zip(rows, prefix_lens, extend_lens):
        slots = alloc.alloc_extend(-1, 0, p + n)
        pool.req_to_token[row, : p + n] = torch.tensor(slots)
        out_loc += slots[p:]
    T = sum(extend_lens)
    q = torch.randn(T, H, D, generator=g).to(dtype)
    k = torch.randn(T, hkv, D, generator=g).to(dtype)
    v = torch.randn(T, hkv, D, generator=g).to(dtype)
    seq = [p + n for p, n in zip(prefix_lens, extend_lens)]
    decode = all(n == 1 for n in extend_lens) and all(p > 0 for p in prefix_lens)
    fb = ForwardBatch(
        phase="decode" if decode else "extend", batch_size=len(rows), input_ids=torch.zeros(T, dtype=torch.long),
        positions=torch.cat([torch.arange(p, p + n) for p, n in zip(prefix_lens, extend_lens)]),
        out_loc=torch.tensor(out_loc), req_rows=torch.tensor(rows), seq_lens=torch.tensor(seq), seq_lens_cpu=seq,
        prefix_lens_cpu=list(prefix_lens), extend_lens_cpu=list(extend_lens), kv_pool=pool,
    )
    backend = TorchAttentionBackend(H, hkv, D, D ** -0.5)
    backend.set_layer_options((window,), soft_cap)
    backend.rows_like_extend = rows_like_extend  # the deterministic mode's decode rows (C kernels only)
    if sinks is not None:
        backend.set_sinks(0, sinks)
    if kernels:  # the C kernels where this CPU's plan chooses them (as the model runner configures it)
        backend.configure(cpu_ops.plan(torch.device("cpu"), dtype, D, H, hkv, packed_linears=False))
    backend.init_forward_metadata(fb)
    got = backend.forward(q, k, v, 0, fb).view(T, H, D).float()
    ref = paged_attention_ref(q, pool.k_buffers[0], pool.v_buffers[0], pool.req_to_token, rows,
                              list(prefix_lens), list(extend_lens), D ** -0.5, soft_cap=soft_cap, window=window,
                              sinks=sinks)
    return got, ref


CASES = [
    ([0, 0, 0], [7, 7, 7]),  # fresh prompts, equal lengths (one-call path)
    ([0, 0, 0, 0], [5, 1, 17, 3]),  # fresh, ragged
    ([4, 0, 31, 2], [3, 6, 1, 9]),  # cached prefixes (gathered) mixed with fresh prompts
    ([5, 40, 1, 17, 33], [1, 1, 1, 1, 1]),  # decode, ragged lengths (padding mask)
    ([12, 12], [1, 1]),  # decode, equal lengths (no mask)
]


@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (4, 4, 80), (8, 2, 96), (4, 1, 128), (6, 3, 13)])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kernels", [False, True])
def test_matches_reference(H, hkv, D, page_size, case, kernels):
    got, ref = run_case(H, hkv, D, page_size, *case, kernels=kernels)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kernels", [False, True])
def test_bfloat16_close_to_reference(case, kernels):
    got, ref = run_case(9, 3, 64, 1, *case, dtype=torch.bfloat16, kernels=kernels)
    torch.testing.assert_close(got, ref, rtol=3e-2, atol=3e-2)


WINDOW_CASES = [
    ([0, 0, 0], [21, 21, 21]),  # fresh prompts longer than the window, equal lengths
    ([0, 3, 40, 2], [30, 6, 9, 1]),  # prefixes longer and shorter than the window, ragged
    ([5, 40, 1, 17, 33], [1, 1, 1, 1, 1]),  # decode, ragged
    ([40, 40], [1, 1]),  # decode, equal lengths
]


@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 128), (6, 3, 13)])
@pytest.mark.parametrize("case", WINDOW_CASES)
@pytest.mark.parametrize("window", [1, 8, 16])
@pytest.mark.parametrize("mode", ["torch", "kernels", "rows"])
def test_sliding_window_matches_reference(H, hkv, D, case, window, mode):
    """A query at position p sees keys (p - window, p]: the torch path, the C kernels (decode from k_begin,
    extend masked in the kernel) and the deterministic mode's decode rows through the extend kernel."""
    got, ref = run_case(H, hkv, D, 16, *case, kernels=mode != "torch", window=window,
                        rows_like_extend=mode == "rows")
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CASES + WINDOW_CASES[1:2])
@pytest.mark.parametrize("kernels", [False, True])  # a soft-cap keeps the C kernels off: configure says so
def test_soft_cap_matches_reference(case, kernels):
    got, ref = run_case(8, 2, 64, 1, *case, kernels=kernels, window=8 if case in WINDOW_CASES else 0, soft_cap=5.0)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    plain, _ = run_case(8, 2, 64, 1, *case)
    assert not torch.allclose(got, plain, atol=1e-3)  # the cap changed the scores


def test_bf16_sliding_window_kernels_close_to_reference():
    for case in WINDOW_CASES:
        got, ref = run_case(8, 2, 64, 16, *case, dtype=torch.bfloat16, kernels=True, window=8)
        torch.testing.assert_close(got, ref, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("case", CASES + WINDOW_CASES)
@pytest.mark.parametrize("window", [0, 8])
@pytest.mark.parametrize("mode", ["torch", "kernels", "rows"])
def test_sinks_match_reference(case, window, mode):
    """Attention sinks (gpt-oss) on every path: torch (a column appended to the scores), the C kernels (a prior
    of value 0, cpu_ops.sink_prior), decode rows through the extend kernel (the deterministic mode)."""
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(7)) * 3
    got, ref = run_case(8, 2, 64, 16, *case, kernels=mode != "torch", window=window,
                        rows_like_extend=mode == "rows", sinks=sinks)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    _, plain = run_case(8, 2, 64, 16, *case, window=window)
    assert not torch.allclose(plain, ref, rtol=1e-4, atol=1e-4)  # the sinks change the output
