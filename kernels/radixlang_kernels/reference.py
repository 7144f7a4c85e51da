"""Reference paged attention: a loop over requests, K/V gathered through req_to_token, softmax in
float32. Slow and obvious on purpose: kernels and backends are checked against it.

Shapes: q [T, H, D] (new tokens of all requests, flattened); k_buffer/v_buffer [Hkv, num_slots, D];
req_to_token [rows, context_len]; per request: row, prefix_len, extend_len. Returns [T, H, D] float32.
soft_cap c > 0 applies c * tanh(scores / c) to the scaled scores before the mask; window w > 0 (sliding-
window attention, transformers' convention): the query at position p sees only positions (p - w, p];
chunk c > 0 (chunked local attention, Llama 4): only positions [p - p % c, p].
sinks [H] (attention sinks, gpt-oss): each head's logit joins every row's softmax and weighs no value.
prefix_attention_ref: the shared part of cascade attention (kernels/prefix_attention.py).
gdn_decode_ref: a Gated DeltaNet decode step (csrc/cpu/gated_deltanet.c).
mamba2_decode_ref: a Mamba2 decode step (csrc/cpu/mamba2.c).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def paged_attention_ref(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                        req_to_token: torch.Tensor, rows: list[int], prefix_lens: list[int],
                        extend_lens: list[int], scale: float, soft_cap: float = 0.0, window: int = 0,
                        sinks: torch.Tensor | None = None, chunk: int = 0) -> torch.Tensor:
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
        if window > 0:
            causal &= torch.arange(p + n)[None, :] > torch.arange(p, p + n)[:, None] - window
        if chunk > 0:  # chunked local attention: the query at position q sees keys at [q - q % chunk, q]
            q_pos = torch.arange(p, p + n)[:, None]
            causal &= torch.arange(p + n)[None, :] >= q_pos - q_pos % chunk
        scores = scores.masked_fill(~causal, float("-inf"))
        if sinks is not None:  # one more column per head, dropped after the softmax
            scores = torch.cat([scores, sinks.float().view(H, 1, 1).expand(H, n, 1)], dim=-1)
            out[start : start + n] = (scores.softmax(-1)[..., :-1] @ v).transpose(0, 1)
        else:
            out[start : start + n] = (scores.softmax(-1) @ v).transpose(0, 1)
        start += n
    return out


def prefix_attention_ref(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                         req_to_token: torch.Tensor, group_rows: list[int], group_lens: list[int],
                         q_index: list[int], group_starts: list[int], scale: float,
                         soft_cap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows q_index[group_starts[g] : group_starts[g + 1]] of q [T, H, D] attend to positions
    0 .. group_lens[g] - 1 of table row group_rows[g], unmasked. Returns o [T, H, D] float32 (zeros
    in rows of no group) and lse [T, H] float32 of the scaled (soft-capped) scores (-inf there)."""
    T, H, _ = q.shape
    hkv = k_buffer.shape[0]
    o = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full((T, H), float("-inf"))
    for g, (row, p) in enumerate(zip(group_rows, group_lens)):
        slots = req_to_token[row, :p]
        k = k_buffer[:, slots].float().repeat_interleave(H // hkv, dim=0)  # [H, p, D]
        v = v_buffer[:, slots].float().repeat_interleave(H // hkv, dim=0)
        idx = torch.tensor(q_index[group_starts[g] : group_starts[g + 1]], dtype=torch.int64)
        scores = q[idx].float().transpose(0, 1) @ k.transpose(1, 2) * scale  # [H, n, p]
        if soft_cap > 0:
            scores = soft_cap * torch.tanh(scores / soft_cap)
        o[idx] = (scores.softmax(-1) @ v).transpose(0, 1)
        lse[idx] = scores.logsumexp(-1).transpose(0, 1)
    return o, lse


def merge_states(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Cascade attention's merge (radixlang_runtime/model/layers/attention/cascade.py): two normalised
    outputs o [T, H, D] over disjoint keys with their log-sum-exp lse [T, H] (-inf: no keys) ->
    the output over all keys, float32. The kernels merge in place of this."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    wa, wb = torch.exp(lse_a - m), torch.exp(lse_b - m)
    return (o_a.float() * wa[..., None] + o_b.float() * wb[..., None]) / (wa + wb)[..., None]


def mla_decode_ref(q: torch.Tensor, pool: torch.Tensor, req_to_token: torch.Tensor, req_rows: torch.Tensor,
                   seq_lens: torch.Tensor, latent_dim: int, scale: float) -> torch.Tensor:
    """cpu_ops.mla_decode in float32 torch: q [B, H, C + R], pool [N, C + R] -> [B, H, C] in q's dtype; row b
    attends its first seq_lens[b] positions (slots req_to_token[req_rows[b]]), the values being the latents."""
    out = []
    for b in range(q.shape[0]):
        entries = pool[req_to_token[req_rows[b], : int(seq_lens[b])]].float()  # [L, C + R]
        p = torch.softmax(q[b].float() @ entries.T * scale, dim=-1)  # [H, L]
        out.append(p @ entries[:, :latent_dim])
    return torch.stack(out).to(q.dtype)


def gdn_rule_ref(mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, s: torch.Tensor,
                 num_k_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the gated delta rule, as transformers' torch_recurrent_gated_delta_rule: mixed [B, C] float32
    (the convolved q, k, v channels), g / beta [B, Hv] float32, s [B, Hv, Dk, Dv] -> (o [B, Hv, Dv], new s)."""
    B = mixed.shape[0]
    _, Hv, Dk, Dv = s.shape
    kd = num_k_heads * Dk
    q, k, v = mixed.split([kd, kd, Hv * Dv], dim=-1)
    rep = Hv // num_k_heads
    q = q.reshape(B, num_k_heads, Dk).repeat_interleave(rep, dim=1)
    k = k.reshape(B, num_k_heads, Dk).repeat_interleave(rep, dim=1)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / Dk ** 0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    s = s * g.exp()[..., None, None]
    delta = (v.reshape(B, Hv, Dv) - (s * k.unsqueeze(-1)).sum(dim=-2)) * beta.unsqueeze(-1)
    s = s + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return (s * q.unsqueeze(-1)).sum(dim=-2), s


def gdn_decode_ref(x: torch.Tensor, conv: torch.Tensor, weight: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   state: torch.Tensor, slots: torch.Tensor, num_k_heads: int) -> torch.Tensor:
    """Gated DeltaNet decode in torch ops, as transformers' causal conv1d update and torch_recurrent_gated_delta_rule
    compute it: x [B, C] (q, k, v channels), conv [N, C, K - 1], weight [C, K] (one dtype); g, beta [B, Hv]
    float32, state [N, Hv, Dk, Dv] float32; conv and state updated in place at slots -> o [B, Hv, Dv] float32."""
    C = x.shape[1]
    window = torch.cat([conv[slots], x.unsqueeze(-1)], dim=-1)  # [B, C, K]
    conv[slots] = window[..., 1:]
    mixed = F.silu(F.conv1d(window, weight.unsqueeze(1), groups=C))[..., -1].float()
    o, state[slots] = gdn_rule_ref(mixed, g, beta, state[slots], num_k_heads)
    return o


def mamba2_decode_ref(x: torch.Tensor, conv: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      dt: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, state: torch.Tensor,
                      slots: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Mamba2 decode in torch ops, as the runtime's torch path (model/layers/mamba2.py: transformers' causal conv1d
    update and mamba2 selective state update) computes it: x [B, C] (x, B, C channels), conv [N, C, K - 1], weight
    [C, K], bias [C] or None (one dtype); dt [B, H], dt_bias [H] raw; A, D [H] float32; state [N, H, P, Nst] float32;
    conv and state updated in place at slots -> y [B, H, P] float32."""
    B, C = x.shape
    _, H, P, Nst = state.shape
    window = torch.cat([conv[slots], x.unsqueeze(-1)], dim=-1)  # [B, C, K]
    conv[slots] = window[..., 1:]
    xbc = F.silu(F.conv1d(window, weight.unsqueeze(1), bias, groups=C))[..., -1].float()
    xs, Bm, Cm = xbc.split([H * P, n_groups * Nst, n_groups * Nst], dim=-1)
    Bm = Bm.reshape(B, n_groups, Nst).repeat_interleave(H // n_groups, dim=1)
    Cm = Cm.reshape(B, n_groups, Nst).repeat_interleave(H // n_groups, dim=1)
    xs = xs.reshape(B, H, P)
    d = F.softplus(dt + dt_bias).float()[..., None, None]  # [B, H, 1, 1]
    s = state[slots] * torch.exp(d * A[:, None, None]) + (d * Bm[:, :, None, :]) * xs[..., None]
    state[slots] = s
    return (s @ Cm[..., None]).squeeze(-1) + xs * D[:, None]
