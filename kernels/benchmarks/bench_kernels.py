"""Triton attention kernels on a CUDA GPU against torch SDPA on gathered K/V (one table, < 8 minutes).

Decode (kernels/decode_attention.py): batch 1-256 x context 1k-32k, Llama-3-8B heads (32 / 8, D 128,
bf16), pages of 1 slot scattered over the pool. Reported: time, achieved GB/s of K/V read (B x ctx x
Hkv x D x 2 tensors x 2 bytes / time) and its share of the GPU's HBM bandwidth, SDPA time, and the
largest difference from SDPA. Extend (kernels/extend_attention.py): one prompt of 512-8k tokens
without prefix, and the same with half of it as a cached prefix; TFLOP/s (causal: 2 x 2 x H x D x
useful query-key pairs) next to SDPA is_causal.

    python benchmarks/bench_kernels.py [--quick] [--json out.json]
Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys

HBM_TB_S = {"H200": 4.8, "H100": 3.35, "A100": 2.0, "L40S": 0.864, "A10": 0.6, "4090": 1.0}


def hbm_bandwidth(name: str) -> float | None:
    for key, tb in HBM_TB_S.items():
        if key in name:
            return tb * 1e12
    return None


def bench_decode(quick: bool) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    from radixlang_kernels.decode_attention import decode_attention

    H, hkv, D, dt = 32, 8, 128, torch.bfloat16
    bw = hbm_bandwidth(torch.cuda.get_device_name())
    rows = []
    batches = [1, 16, 64, 256] if not quick else [1, 64]
    contexts = [1024, 4096, 16384, 32768] if not quick else [1024, 8192]
    for B in batches:
        for ctx in contexts:
            if B * ctx > 4 * 1024 * 1024:  # keep pool + gathered copy well inside memory and time
                continue
            N = B * ctx + 16
            kb = torch.randn(hkv, N, D, dtype=dt, device="cuda")
            vb = torch.randn_like(kb)
            rt = torch.randperm(N - 16, device="cuda")[: B * ctx].view(B, ctx).contiguous()
            rows_t = torch.arange(B, device="cuda")
            lens = torch.full((B,), ctx, dtype=torch.int64, device="cuda")
            q = torch.randn(B, H, D, dtype=dt, device="cuda")
            split = 256 if ctx * B < 65536 else 1024
            f = lambda: decode_attention(q, kb, vb, rt, rows_t, lens, D ** -0.5, max_seq_len=ctx, split_len=split)  # noqa: E731
            ms = do_bench(f, warmup=5, rep=30)
            k = kb[:, rt].permute(1, 0, 2, 3)  # [B, Hkv, ctx, D] gathered once, outside the timing
            v = vb[:, rt].permute(1, 0, 2, 3)
            g = lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, scale=D ** -0.5, enable_gqa=True)  # noqa: E731
            ms_sdpa = do_bench(g, warmup=5, rep=30)
            diff = (f().float() - g()[:, :, 0].float()).abs().max().item()
            gbs = B * ctx * hkv * D * 2 * 2 / (ms * 1e-3) / 1e9
            rows.append({"kernel": "decode", "batch": B, "context": ctx, "ms": ms, "GB/s": gbs,
                         "hbm_share": gbs * 1e9 / bw if bw else None, "sdpa_ms": ms_sdpa, "max_diff": diff})
            kb = vb = k = v = None  # free before the next, larger case
            torch.cuda.empty_cache()
    return rows


def bench_extend(quick: bool) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    from radixlang_kernels.extend_attention import extend_attention

    H, hkv, D, dt = 32, 8, 128, torch.bfloat16
    rows = []
    for L in ([512, 2048, 8192] if not quick else [512, 2048]):
        for prefix in (0, L // 2):
            n = L - prefix
            N = L + 16
            kb = torch.randn(hkv, N, D, dtype=dt, device="cuda")
            vb = torch.randn_like(kb)
            rt = torch.randperm(N - 16, device="cuda")[:L].view(1, L).contiguous()
            q = torch.randn(n, H, D, dtype=dt, device="cuda")
            k = kb[:, rt[0, prefix:]].transpose(0, 1).contiguous()  # the new tokens' K/V (also in the pool)
            v = vb[:, rt[0, prefix:]].transpose(0, 1).contiguous()
            t = lambda x: torch.tensor([x], dtype=torch.int64, device="cuda")  # noqa: E731
            f = lambda: extend_attention(q, k, v, kb, vb, rt, t(0), t(prefix), t(n), t(0), D ** -0.5,  # noqa: E731
                                         max_extend_len=n, block_m=64, block_n=64)
            ms = do_bench(f, warmup=5, rep=30)
            kf = kb[:, rt[0]][None]  # [1, Hkv, L, D]
            vf = vb[:, rt[0]][None]
            qf = q.transpose(0, 1)[None]  # [1, H, n, D]
            mask = torch.arange(L, device="cuda")[None, :] <= torch.arange(prefix, L, device="cuda")[:, None]
            g = lambda: F.scaled_dot_product_attention(qf, kf, vf, attn_mask=None if prefix == 0 else mask,  # noqa: E731
                                                       is_causal=prefix == 0, scale=D ** -0.5, enable_gqa=True)
            ms_sdpa = do_bench(g, warmup=5, rep=30)
            diff = (f().float() - g()[0].transpose(0, 1).float()).abs().max().item()
            pairs = n * prefix + n * (n + 1) / 2
            tflops = 4 * H * D * pairs / (ms * 1e-3) / 1e12
            rows.append({"kernel": "extend", "prompt": L, "prefix": prefix, "ms": ms, "TFLOP/s": tflops,
                         "sdpa_ms": ms_sdpa, "sdpa_TFLOP/s": 4 * H * D * pairs / (ms_sdpa * 1e-3) / 1e12,
                         "max_diff": diff})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--kernels", default="decode,extend", help="comma list of decode, extend")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("bench_kernels: torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("bench_kernels: no CUDA device here; the Triton kernels are benchmarked on a GPU only (exit 0)")
        return 0
    sys.path.insert(0, ".")
    print(f"device: {torch.cuda.get_device_name()}  "
          f"(HBM {hbm_bandwidth(torch.cuda.get_device_name()) or 'unknown'} B/s)")
    kernels = set(args.kernels.split(","))
    if not kernels <= {"decode", "extend"}:
        ap.error(f"--kernels: unknown {sorted(kernels - {'decode', 'extend'})}; choose from decode, extend")
    dec = bench_decode(args.quick) if "decode" in kernels else []
    print(f"{'decode':8} {'batch':>5} {'ctx':>6} {'ms':>8} {'GB/s':>8} {'HBM%':>6} {'SDPA ms':>8} {'max diff':>9}")
    for r in dec:
        share = f"{100 * r['hbm_share']:5.1f}%" if r["hbm_share"] else "   n/a"
        print(f"{'':8} {r['batch']:>5} {r['context']:>6} {r['ms']:8.3f} {r['GB/s']:8.0f} {share:>6} "
              f"{r['sdpa_ms']:8.3f} {r['max_diff']:9.2e}")
    ext = bench_extend(args.quick) if "extend" in kernels else []
    print(f"{'extend':8} {'prompt':>6} {'prefix':>6} {'ms':>8} {'TFLOP/s':>8} {'SDPA ms':>8} {'SDPA TF/s':>9} "
          f"{'max diff':>9}")
    for r in ext:
        print(f"{'':8} {r['prompt']:>6} {r['prefix']:>6} {r['ms']:8.3f} {r['TFLOP/s']:8.1f} {r['sdpa_ms']:8.3f} "
              f"{r['sdpa_TFLOP/s']:9.1f} {r['max_diff']:9.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"decode": dec, "extend": ext}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
