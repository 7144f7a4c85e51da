"""Gated DeltaNet (Qwen3-Next, Qwen3.5 linear-attention layers) over the state pool (mem/state_pool.py).

Per token: a causal depthwise convolution (width K) over the q/k/v channels, SiLU, q and k L2-normalised, then
the gated delta rule on a per-head matrix S [Dk, Dv]:
    S <- exp(g_t) S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t / sqrt(Dk)
with g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b); the output goes through an RMSNorm gated by
SiLU(z) and the output projection. A request's state between steps is S (float32) and the convolution's window
(the last K - 1 inputs), both in its state slot.

Prefill (extend) runs the chunk-parallel form (chunks of 64 tokens: a triangular solve inside each chunk, the
state carried between chunks), one request at a time from its slot's state (zeros at position 0), or on CPU with
the kernel library the recurrent form token after token in C (gdn_ops.gdn_prefill, faster there); decode runs
the recurrent form for the whole batch at once: on CPU with the kernel library, the convolution's update and the
delta rule in two C calls reading and writing the states in place at their slots (radixlang_kernels cpu_ops
gdn_conv_update / gdn_decode), with --attention-backend triton the Triton kernels (radixlang_kernels/gated_deltanet.py:
the convolution and the recurrent rule over segments of rows, decode and prefill alike, states in place), else
torch ops over gathered copies. A verify step's request (its last token + a draft: jump-forward, n-gram) runs
its k + 1 tokens position by position with the decode rule instead, keeping the state after each position in
scratch (mem/verify_states.py) until the sampler knows how many the model accepted. The arithmetic is
transformers' torch reference (torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule, the causal conv1d
fallback) in float32.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_kernels import gdn_ops
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.layers.linear_attn_spec import LinearAttnSpec
from radixlang_runtime.model.layers.recurrent_steps import decode_saves, extend_requests

CHUNK = 64


def triton_gdn():
    """radixlang_kernels.gated_deltanet (imported on first use: Triton is optional)."""
    from radixlang_kernels import gated_deltanet

    return gated_deltanet


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q, k [H, L, Dk] and v [H, L, Dv] float32 (q, k normalised, q scaled); g, beta [H, L];
    state [H, Dk, Dv]. Returns (o [H, L, Dv], the state after the last token)."""
    H, L, _ = k.shape
    pad = (-L) % CHUNK
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    v_beta, k_beta = v * beta.unsqueeze(-1), k * beta.unsqueeze(-1)
    q, k, k_beta, v_beta = (x.reshape(H, -1, CHUNK, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.reshape(H, -1, CHUNK)
    upper = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).triu(1)
    cum = g.cumsum(dim=-1)
    pair = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()
    ut = (k_beta @ k.transpose(-1, -2)) * pair
    intra = (q @ k.transpose(-1, -2)) * pair
    decayed_k_beta = k_beta * cum.exp().unsqueeze(-1)
    new_v = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)
    k_cum = torch.linalg.solve_triangular(ut, decayed_k_beta, upper=False, unitriangular=True)
    q = q * cum.exp().unsqueeze(-1)
    k = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()[..., None, None]
    out = torch.zeros_like(new_v)
    for i in range(new_v.shape[1]):
        v_new = new_v[:, i] - k_cum[:, i] @ state
        out[:, i] = q[:, i] @ state + intra[:, i] @ v_new
        state = state * chunk_decay[:, i] + k[:, i].transpose(-1, -2) @ v_new
    return out.reshape(H, -1, out.shape[-1])[:, :L], state


def recurrent_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of B sequences: q, k [B, H, Dk], v [B, H, Dv] float32 (normalised, q scaled); g, beta [B, H];
    state [B, H, Dk, Dv]. Returns (o [B, H, Dv], the new state)."""
    state = state * g.exp()[..., None, None]
    kv_mem = (state * k.unsqueeze(-1)).sum(dim=-2)
    delta = (v - kv_mem) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return (state * q.unsqueeze(-1)).sum(dim=-2), state


class GatedRMSNorm(nn.Module):
    """weight * rms_norm(x) * silu(z), per value head (transformers' RMSNormGated)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = self.weight * x.to(dtype)
        return (x * F.silu(z.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    """One linear-attention layer. in_proj: the q/k/v channels, z, b and a projections in one matmul (rows in
    that order; Qwen3-Next's grouped qkvz / ba rows are reordered to it at load). Tensor parallel: each rank
    holds its key heads and their value heads (column-parallel in_proj, their conv channels, A_log, dt_bias,
    their state in the state pool) and out_proj is row-parallel."""

    def __init__(self, spec: LinearAttnSpec, hidden_size: int, eps: float, state_index: int,
                 reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        """spec: this rank's share (LinearAttnSpec.split) with tensor parallelism, whose `reduce` sums out_proj's
        row-parallel output over the ranks."""
        super().__init__()
        self.reduce = reduce
        self.spec = spec
        self.state_index = state_index  # this layer's index in the state pool
        self.hk, self.hv, self.dk, self.dv = spec.num_k_heads, spec.num_v_heads, spec.k_head_dim, spec.v_head_dim
        self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
        self.conv_dim = spec.conv_dim
        self.in_proj = nn.Linear(hidden_size, self.conv_dim + self.value_dim + 2 * self.hv, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(self.conv_dim, spec.conv_kernel))  # depthwise, [C, K]
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, eps)
        self.out_proj = nn.Linear(self.value_dim, hidden_size, bias=False)
        self.use_cpu_kernel = False  # decode through gated_deltanet.c (HybridForCausalLM.enable_cpu_ops)
        # --enable-deterministic-inference (with use_cpu_kernel): gates, conv, rule and gated norm in C, each token's
        # row alone and the same arithmetic for prefill and decode (HybridForCausalLM.enable_deterministic)
        self.deterministic = False
        self.use_triton = False  # the Triton kernels (radixlang_kernels/gated_deltanet.py): --attention-backend triton

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        T = x.shape[0]
        proj = self.in_proj(x)
        mixed, z, b, a = proj.split([self.conv_dim, self.value_dim, self.hv, self.hv], dim=-1)
        if self.deterministic:
            g, beta = gdn_ops.gdn_gates(a, b, self.A_log, self.dt_bias)
        else:
            beta = b.sigmoid()
            g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        pool = fb.state_pool
        ssm, conv = pool.ssm[self.state_index], pool.conv[self.state_index]  # [slots, ...] each

        def rule(rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
            return self._rule(mixed[rows], g[rows], beta[rows], ssm, conv, slots)

        def extend(rows: slice, slot: int, fresh: bool) -> torch.Tensor:
            return self._extend_one(mixed[rows], g[rows], beta[rows], ssm, conv, slot, fresh)

        if fb.is_decode:  # one token of each request from its slot's state; page-boundary rows save theirs
            o = self._rule(mixed, g, beta, ssm, conv, fb.state_slots)
            decode_saves(fb, ssm, conv)
        else:  # [T, H, Dv]: saves and verify steps as recurrent_steps.py walks them
            o = extend_requests(fb, extend, rule, self.state_index, ssm, conv)
        if self.deterministic:
            o = gdn_ops.gdn_gated_norm(o.reshape(-1, self.dv), z.reshape(-1, self.dv), self.norm.weight,
                                       self.norm.eps).to(x.dtype)
        else:
            o = self.norm(o.to(x.dtype).reshape(-1, self.dv), z.reshape(-1, self.dv))
        out = self.out_proj(o.reshape(T, self.value_dim))
        return out if self.reduce is None else self.reduce(out)

    def _rule(self, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, ssm: torch.Tensor, conv: torch.Tensor,
              slots: torch.Tensor) -> torch.Tensor:
        """The decode rule: one token of each row [B, C] from the state at slots[b], written back in place."""
        if self.use_triton:
            one, rows = torch.ones_like(slots), torch.arange(slots.shape[0], device=slots.device)
            mixed = triton_gdn().gdn_conv(mixed, conv, self.conv_weight, slots, rows, one)
            o = triton_gdn().gdn_rule(mixed, g, beta.float(), ssm, slots, rows, one, self.hk)
        elif self.use_cpu_kernel:
            mixed = gdn_ops.gdn_conv_update(mixed, conv, self.conv_weight, slots)  # [B, C] float32
            o = gdn_ops.gdn_decode(mixed, g, beta.float(), ssm, slots, self.hk, self.dk)
        else:
            window = torch.cat([conv[slots], mixed.unsqueeze(-1)], dim=-1)  # [B, C, K]
            conv[slots] = window[..., 1:]
            mixed = F.silu(F.conv1d(window, self.conv_weight.unsqueeze(1), groups=self.conv_dim))[..., -1]
            q, k, v = self._qkv(mixed)  # [B, H, D]
            o, new = recurrent_step(q / self.dk ** 0.5, k, v, g, beta.float(), ssm[slots])
            ssm[slots] = new
        return o

    def _qkv(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Convolved channels [N, C] -> q, k [N, Hv, Dk] (normalised, heads repeated to Hv), v [N, Hv, Dv], all
        float32. q is scaled by the caller (the two references round it differently: a product, a quotient)."""
        N = mixed.shape[0]
        q, k, v = mixed.float().split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        rep = self.hv // self.hk
        q = q.reshape(N, self.hk, self.dk).repeat_interleave(rep, dim=1)
        k = k.reshape(N, self.hk, self.dk).repeat_interleave(rep, dim=1)
        q, k = l2norm(q), l2norm(k)
        return q, k, v.reshape(N, self.hv, self.dv)

    def _extend_one(self, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, ssm: torch.Tensor,
                    conv: torch.Tensor, slot: int, fresh: bool) -> torch.Tensor:
        """One request's new tokens [L, C] from its slot's state (zeros when fresh); writes the state back."""
        if self.use_triton:  # the decode step's kernels over the request's rows as one segment
            if fresh:
                conv[slot].zero_()
                ssm[slot].zero_()
            at = torch.tensor([slot], device=mixed.device)
            n, zero = torch.full_like(at, mixed.shape[0]), torch.zeros_like(at)
            out = triton_gdn().gdn_conv(mixed, conv, self.conv_weight, at, zero, n)
            return triton_gdn().gdn_rule(out, g, beta.float(), ssm, at, zero, n, self.hk)
        if self.deterministic:  # gdn_conv_update's arithmetic token after token, then the rule below
            if fresh:
                conv[slot].zero_()
            at, n = torch.tensor([slot]), torch.tensor([mixed.shape[0]])
            out = gdn_ops.gdn_conv_prefill(mixed, conv, self.conv_weight, at, torch.zeros_like(at), n)
            if fresh:
                ssm[slot].zero_()
            return gdn_ops.gdn_prefill(out, g, beta.float(), ssm, at, torch.zeros_like(at), n, self.hk, self.dk)
        K = self.spec.conv_kernel
        window = torch.zeros_like(conv[slot]) if fresh else conv[slot]
        seq = torch.cat([window.to(mixed.dtype), mixed.transpose(0, 1)], dim=-1)  # [C, K - 1 + L]
        conv[slot] = seq[:, -(K - 1):]
        out = F.silu(F.conv1d(seq.unsqueeze(0), self.conv_weight.unsqueeze(1), groups=self.conv_dim))[0]  # [C, L]
        if self.use_cpu_kernel:  # the rule token after token, the state in place (faster than the chunks on CPU)
            if fresh:
                ssm[slot].zero_()
            at, n = torch.tensor([slot]), torch.tensor([mixed.shape[0]])
            return gdn_ops.gdn_prefill(out.transpose(0, 1).float(), g, beta.float(), ssm, at, torch.zeros_like(at), n,
                                       self.hk, self.dk)
        q, k, v = self._qkv(out.transpose(0, 1))
        state = torch.zeros_like(ssm[slot]) if fresh else ssm[slot]
        q = q * self.dk ** -0.5
        o, state = chunk_rule(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), g.transpose(0, 1),
                              beta.float().transpose(0, 1), state)
        ssm[slot] = state
        return o.transpose(0, 1)
