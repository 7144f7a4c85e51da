"""The torch attention backend against kernels/reference.py on ragged paged batches."""

from __future__ import annotations

import random

import pytest
import torch

from radixlang_runtime.kernels.reference import paged_attention_ref
from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.kv_pool import KVPool
from radixlang_runtime.model import cpu_kernels
from radixlang_runtime.model.attention.torch_backend import TorchAttentionBackend
from radixlang_runtime.model.forward_batch import ForwardBatch


def run_case(H, hkv, D, page_size, prefix_lens, extend_lens, dtype=torch.float32, seed=0, kernels=False):
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
    if kernels:  # the C kernels where this CPU's plan chooses them (as the model runner configures it)
        backend.configure(cpu_kernels.plan(torch.device("cpu"), dtype, D, H, hkv, packed_linears=False))
    backend.init_forward_metadata(fb)
    got = backend.forward(q, k, v, 0, fb).view(T, H, D).float()
    ref = paged_attention_ref(q, pool.k_buffers[0], pool.v_buffers[0], pool.req_to_token, rows,
                              list(prefix_lens), list(extend_lens), D ** -0.5)
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
