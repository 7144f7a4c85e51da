"""The C kernels called directly, against plain torch math (skipped where they cannot build)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlang_runtime.model import cpu_kernels

pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C compiler: torch fallback in use")


def test_add_rms_norm_and_silu_mul():
    g = torch.Generator().manual_seed(0)
    for T, H in [(7, 576), (3, 13)]:
        r = torch.randn(T, H, generator=g).bfloat16()
        x = torch.randn(T, H, generator=g).bfloat16()
        w = torch.randn(H, generator=g).bfloat16()
        want_r = r + x
        want = F.rms_norm(want_r.float(), (H,), w.float(), 1e-5)
        got = cpu_kernels.add_rms_norm(x, r, w, 1e-5)
        assert torch.equal(r, want_r)  # the residual is updated in place, rounded like torch's add
        torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)
        gu = torch.randn(T, 2 * H, generator=g).bfloat16()
        want = F.silu(gu[:, :H].float()) * gu[:, H:].float()
        torch.testing.assert_close(cpu_kernels.silu_mul(gu).float(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("lens", [[7, 7, 7], [5, 1, 40, 17], [300]])
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 128)])
def test_extend_causal_matches_sdpa(lens, H, hkv, D):
    g = torch.Generator().manual_seed(1)
    T = sum(lens)
    qkv = torch.randn(T, H + 2 * hkv, D, generator=g).bfloat16()  # strided views, as the model passes
    q, k, v = qkv[:, :H], qkv[:, H : H + hkv], qkv[:, H + hkv :]
    starts = torch.tensor([sum(lens[:i]) for i in range(len(lens))])
    got = cpu_kernels.extend_causal(q, k, v, starts, torch.tensor(lens), D ** -0.5)
    if got is None:
        pytest.skip("no AVX-512 BF16 on this CPU")
    for s, n in zip(starts.tolist(), lens):
        want = F.scaled_dot_product_attention(
            q[s : s + n].float().transpose(0, 1), k[s : s + n].float().transpose(0, 1),
            v[s : s + n].float().transpose(0, 1), is_causal=True, enable_gqa=True).transpose(0, 1)
        torch.testing.assert_close(got[s : s + n].view(n, H, D).float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("H,hkv,D", [(9, 3, 64), (8, 2, 128)])
def test_extend_with_paged_prefix_matches_reference(page_size, H, hkv, D):
    """Prefixes read in place through req_to_token (scattered slots), new tokens from q/k/v."""
    from kernels.reference import paged_attention_ref

    g = torch.Generator().manual_seed(2)
    prefix_lens, extend_lens = [0, 33, 1, 200, 16], [5, 1, 40, 17, 16]
    num_slots, rows = 1024, [3, 0, 4, 1, 2]
    kb = torch.randn(hkv, num_slots, D, generator=g).bfloat16()
    vb = torch.randn(hkv, num_slots, D, generator=g).bfloat16()
    rt = torch.zeros(5, 512, dtype=torch.int64)
    pages = torch.randperm(num_slots // page_size, generator=g).tolist()
    for row, p, n in zip(rows, prefix_lens, extend_lens):  # each request gets whole pages, shuffled
        npages = -(-(p + n) // page_size)
        mine = [pages.pop() for _ in range(npages)]
        rt[row, : p + n] = torch.tensor([mine[i // page_size] * page_size + i % page_size for i in range(p + n)])
    T = sum(extend_lens)
    qkv = torch.randn(T, H + 2 * hkv, D, generator=g).bfloat16()
    q, k, v = qkv[:, :H], qkv[:, H : H + hkv], qkv[:, H + hkv :]
    start = 0
    for row, p, n in zip(rows, prefix_lens, extend_lens):  # the new tokens' K/V are stored first, as the model does
        kb[:, rt[row, p : p + n]] = k[start : start + n].transpose(0, 1)
        vb[:, rt[row, p : p + n]] = v[start : start + n].transpose(0, 1)
        start += n
    starts = torch.tensor([sum(extend_lens[:i]) for i in range(5)])
    prefix = cpu_kernels.PagedPrefix(kb, vb, rt, torch.tensor(rows), torch.tensor(prefix_lens))
    got = cpu_kernels.extend_causal(q, k, v, starts, torch.tensor(extend_lens), D ** -0.5, prefix)
    if got is None:
        pytest.skip("no AVX-512 BF16 on this CPU")
    want = paged_attention_ref(q, kb, vb, rt, rows, prefix_lens, extend_lens, D ** -0.5)
    torch.testing.assert_close(got.view(T, H, D).float(), want, rtol=2e-2, atol=2e-2)
