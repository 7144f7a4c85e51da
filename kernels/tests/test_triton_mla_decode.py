"""The Triton MLA decode kernel (radixlang_kernels/mla_decode_triton.py) against reference.mla_decode_ref
(interpreted on CPU: TRITON_INTERPRET=1 where there is no GPU): ragged rows on shuffled pages, a row of one
token and rows longer than a split, head counts under and past one block of 16, odd widths, DeepSeek V3's
512 + 64 lanes; shapes outside the limits refused by name."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels.testing import interpret_triton_without_gpu  # noqa: E402

interpret_triton_without_gpu()  # before triton's import
triton = pytest.importorskip("triton")

from radixlang_kernels.mla_decode_triton import mla_decode  # noqa: E402
from radixlang_kernels.reference import mla_decode_ref  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def latent_pool(seq_lens: list[int], E: int, dtype: torch.dtype, page_size: int, seed: int):
    """A pool [N, E] of random entries and a table whose rows (shuffled) hold each request's positions on its
    own shuffled pages, as the allocator lays them out -> (pool, req_to_token, req_rows)."""
    g = torch.Generator().manual_seed(seed)
    pages_of = [-(-n // page_size) for n in seq_lens]
    total = sum(pages_of) + 3
    pool = torch.randn(total * page_size, E, generator=g).to(dtype)
    rows = torch.randperm(len(seq_lens), generator=g)
    table = torch.zeros(len(seq_lens), max(seq_lens) + 5, dtype=torch.int64)
    free = torch.randperm(total, generator=g).tolist()
    for r, n, k in zip(rows.tolist(), seq_lens, pages_of):
        mine = [free.pop() for _ in range(k)]
        table[r, :n] = torch.tensor([mine[i // page_size] * page_size + i % page_size for i in range(n)])
    return pool, table, rows


def run(H: int, C: int, R: int, seq_lens: list[int], dtype: torch.dtype, page_size: int, split_len: int):
    pool, table, rows = latent_pool(seq_lens, C + R, dtype, page_size, seed=H + C + R)
    q = torch.randn(len(seq_lens), H, C + R, generator=torch.Generator().manual_seed(3)).to(dtype)
    lens = torch.tensor(seq_lens)
    scale = (C + R) ** -0.5
    d = lambda x: x.to(DEVICE)  # noqa: E731
    got = mla_decode(d(q), d(pool), d(table), d(rows), d(lens), C, scale, split_len=split_len, block_n=16)
    want = mla_decode_ref(q, pool, table, rows, lens, C, scale)
    assert got.dtype == dtype and got.shape == (len(seq_lens), H, C)
    torch.testing.assert_close(got.float().cpu(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("H,C,R", [(4, 32, 8), (20, 64, 16), (3, 13, 6)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_matches_reference(H, C, R, dtype, page_size):
    """Rows of 1, 70 and 33 tokens with splits of 32: a row of one split, one of three (the last partial)."""
    run(H, C, R, [1, 70, 33], dtype, page_size, split_len=32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_deepseek_v3_lanes(dtype):
    """C = 512, R = 64 (576 lanes as 512 + 64), 17 heads (a block and one more), short rows."""
    run(17, 512, 64, [1, 5, 20], dtype, 16, split_len=16)


def test_one_split_per_row_and_a_larger_grid():
    """max_seq_len above every row: the grid's extra splits hold no keys and weigh nothing."""
    pool, table, rows = latent_pool([3, 9], 40, torch.float32, 4, seed=0)
    q = torch.randn(2, 5, 40)
    lens = torch.tensor([3, 9])
    got = mla_decode(q, pool, table, rows, lens, 32, 0.2, max_seq_len=64, split_len=8)
    torch.testing.assert_close(got, mla_decode_ref(q, pool, table, rows, lens, 32, 0.2), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("q_lanes,pool_lanes,C,needle", [(700, 700, 640, "latent_dim 640"),
                                                            (40, 48, 32, "kv_pool must be"),
                                                            (40, 40, 40, "rope lanes 0")])
def test_shapes_outside_the_limits_are_refused(q_lanes, pool_lanes, C, needle):
    with pytest.raises(ValueError, match=needle):
        mla_decode(torch.randn(1, 2, q_lanes), torch.randn(8, pool_lanes), torch.zeros(1, 8, dtype=torch.int64),
                   torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64), C, 0.1)
