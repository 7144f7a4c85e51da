"""The Triton LoRA segment kernels (radixlang_kernels/lora_sgmv.py) against torch (interpreted on CPU:
TRITON_INTERPRET=1 where there is no GPU: radixlang_kernels.testing)."""

from __future__ import annotations

import pytest
import torch

from radixlang_kernels.testing import interpret_triton_without_gpu  # noqa: E402

interpret_triton_without_gpu()  # before triton's import
triton = pytest.importorskip("triton")

from radixlang_kernels.lora_sgmv import sgmv_expand, sgmv_shrink  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=2e-2, atol=5e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shrink_and_expand_match_torch(dtype):
    """Three segments (interleaved rows, two on the same slot), slots of ranks 8, 16 and 5 (buffers of R 16),
    K and N not multiples of the blocks; rows of no segment are left alone."""
    g = torch.Generator().manual_seed(0)
    T, K, N, R = 40, 100, 70, 16
    ranks = torch.tensor([8, 16, 5])
    a_buf = (0.1 * torch.randn(3, R, K, generator=g)).to(dtype)  # t and the deltas of order 1 (bf16's eps)
    b_buf = (0.25 * torch.randn(3, N, R, generator=g)).to(dtype)
    perm = torch.randperm(T, generator=g)
    sizes = [3, 20, 1]
    rows = perm[: sum(sizes)].to(torch.int64)
    starts = torch.tensor([0, 3, 23, 24])
    seg_lora = torch.tensor([1, 2, 1])
    x = torch.randn(T, K, generator=g).to(dtype)
    y = torch.randn(T, N + 6, generator=g).to(dtype)[:, 3:N + 3]  # a strided view, as an output slice is
    want_y = y.float().clone()
    dev = [t.to(DEVICE) for t in (x, a_buf, b_buf, rows, starts, seg_lora, ranks)]
    t = sgmv_shrink(dev[0], dev[1], dev[3], dev[4], dev[5], dev[6])
    y_dev = y.to(DEVICE) if DEVICE == "cuda" else y
    sgmv_expand(t, dev[2], dev[3], dev[4], dev[5], dev[6], y_dev)
    for s in range(3):
        lo, hi, slot = starts[s].item(), starts[s + 1].item(), seg_lora[s].item()
        r = ranks[slot].item()
        rr = rows[lo:hi]
        want_t = x[rr].float() @ a_buf[slot, :r].float().t()
        torch.testing.assert_close(t[lo:hi, :r].cpu(), want_t, **TOL[torch.float32 if dtype == torch.float32
                                                                       else torch.bfloat16])
        assert not t[lo:hi, r:].any()
        want_y[rr] += t[lo:hi, :r].cpu().to(dtype).float() @ b_buf[slot, :, :r].float().t()
    torch.testing.assert_close(y_dev.cpu().float(), want_y, **TOL[dtype])
