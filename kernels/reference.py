"""Reference paged attention: a loop over requests, K/V gathered through req_to_token, softmax in
float32. Slow and obvious on purpose: kernels and backends are checked against it.

Shapes: q [T, H, D] (new tokens of all requests, flattened); k_buffer/v_buffer [Hkv, num_slots, D];
req_to_token [rows, context_len]; per request: row, prefix_len, extend_len. Returns [T, H, D] float32.
soft_cap c > 0 applies c * tanh(scores / c) to the scaled scores before the mask.
"""

from __future__ import annotations

import torch


def paged_attention_ref(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                        req_to_token: torch.Tensor, rows: list[int], prefix_lens: list[int],
                        extend_lens: list[int], scale: float, soft_cap: float = 0.0) -> torch.Tensor:
    H, hkv = q.shape[1], k_buffer.shape[0]
    out = torch.empty(q.shape, dtype=torch.float32)
    start = 0
    for row, p, n in zip(rows, prefix_lens, extend_lens):
        slots = req_to_token[row, : p + n]
        k = k_buffer[:, slots].float().repeat_interleave(H // hkv, dim=0)  # [H, L, D]
        v = v_buffer[:, slots].float().repeat_interleave(H // hkv, dim=0)
        qi = q[start : start + n].float().transpose(0, 1)  # [H, n, D]
        scores = qi @ k.transpose(1, 2) * scale  # [H, n, L]
        if soft_cap > 0:
            scores = soft_cap * torch.tanh(scores / soft_cap)
        causal = torch.arange(p + n)[None, :] <= torch.arange(p, p + n)[:, None]  # [n, L]
        scores = scores.masked_fill(~causal, float("-inf"))
        out[start : start + n] = (scores.softmax(-1) @ v).transpose(0, 1)
        start += n
    return out
