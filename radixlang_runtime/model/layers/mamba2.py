"""The Mamba2 mixer of hybrid models (Granite 4.0-H), over the state pool (mem/state_pool.py).

As transformers' torch path (GraniteMoeHybridMambaLayer): in_proj gives the gate z, the convolution's channels
xBC and dt per head; a causal depthwise conv1d (with bias) and SiLU over xBC, which splits into x [H, P], B and
C [G, N] (a group's B and C shared by H / G heads); dt = softplus(dt + dt_bias), A = -exp(A_log); the SSD
recurrence per head, state S [P, N]:

    S <- exp(dt A) S + dt x B^T,    y = S C + D x,

then RMSNorm per group of y * silu(z) (norm after the gate), and out_proj. A request keeps S (float32) and the
convolution's last K - 1 inputs in its state slot. Decode runs the recurrence one token per row over the
states at their slots; an extend runs the chunked (SSD) form of transformers' mamba2_chunk_scan over the
request's tokens, from its slot's state (zeros when fresh, a snapshot on a prefix-cache hit), and writes the
state after its last token back. Where states are saved and how a verify step keeps them is
recurrent_steps.py's, shared with the Gated DeltaNet. On CPU with the kernel library (use_cpu_kernel) the decode
rule is two C calls reading and writing the states in place at their slots: the convolution's update
(radixlang_kernels gdn_ops.gdn_conv_update, the Gated DeltaNet's, with the conv bias) and dt's softplus with the
recurrence and the D skip (mamba2_ops.mamba2_decode); else torch ops over gathered copies. The gated norm and the
projections are torch's either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_kernels import gdn_ops, mamba2_ops
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.layers.mamba2_spec import Mamba2Spec
from radixlang_runtime.model.layers.recurrent_steps import decode_saves, extend_requests


def segment_sum(x: torch.Tensor) -> torch.Tensor:
    """x [..., T] -> [..., T, T]: entry (i, j) is x[j + 1] + ... + x[i] for j <= i, -inf above the diagonal
    (transformers' segment_sum: masked cumulative sums, stabler than differences of one cumsum)."""
    T = x.size(-1)
    x = x[..., None].expand(*x.size(), T)
    x = x.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=-1), 0)
    out = torch.cumsum(x, dim=-2)
    return out.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=0), -torch.inf)


def chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               D: torch.Tensor, state: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence through the SSD recurrence in chunks of `chunk` tokens (mamba2_chunk_scan for one batch row):
    x [L, H, P], dt [L, H] (after softplus), B and C [L, H, N] (groups repeated to heads), all float32; A and
    D [H]; state [H, P, N], the state before the first token. Returns (y [L, H, P] with the D skip, the state
    after the last token)."""
    L, H, P = x.shape
    pad = (-L) % chunk
    skip = D[:, None] * x
    x = x * dt[..., None]
    A = A * dt  # [L, H]

    def chunks(t: torch.Tensor) -> torch.Tensor:  # [L, ...] -> [c, chunk, ...], zero-padded
        t = F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad))
        return t.reshape(-1, chunk, *t.shape[1:])

    x, A, B, C = chunks(x), chunks(A), chunks(B), chunks(C)
    A = A.permute(2, 0, 1)  # [H, c, l]
    A_cumsum = torch.cumsum(A, dim=-1)
    # within each chunk: attention-like weights C_l . B_s, decayed from s to l
    M = torch.einsum("clhn,cshn->clsh", C, B) * torch.exp(segment_sum(A)).permute(1, 2, 3, 0)
    y_diag = torch.einsum("clsh,cshp->clhp", M, x)
    # each chunk's own contribution to the state at its end
    B_decay = B * torch.exp(A_cumsum[..., -1:] - A_cumsum).permute(1, 2, 0)[..., None]
    states = torch.einsum("clhn,clhp->chpn", B_decay, x)
    # the states at the chunks' starts: the carried state, then chunk by chunk
    states = torch.cat([state[None].to(states.dtype), states], dim=0)  # [c + 1, H, P, N]
    decay_chunk = torch.exp(segment_sum(F.pad(A_cumsum[..., -1], (1, 0))))  # [H, c + 1, c + 1]
    states = torch.einsum("hij,jhpn->ihpn", decay_chunk, states)
    states, final = states[:-1], states[-1]
    # each chunk's start state read by its tokens
    y_off = torch.einsum("clhn,chpn->clhp", C, states) * torch.exp(A_cumsum).permute(1, 2, 0)[..., None]
    y = (y_diag + y_off).reshape(-1, H, P)[:L] + skip
    return y, final


def step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
         state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of n rows (mamba2_selective_state_update): x [n, H, P], dt [n, H] (after softplus), B and C
    [n, H, N], state [n, H, P, N], float32; A and D [H]. Returns (y [n, H, P], the new state)."""
    dt = dt[..., None, None]  # [n, H, 1, 1]
    state = state * torch.exp(dt * A[:, None, None]) + (dt * B[:, :, None, :]) * x[..., None]
    y = (state @ C[..., None]).squeeze(-1)
    return y + x * D[:, None], state


class GroupGatedRMSNorm(nn.Module):
    """weight * rms_norm(y * silu(z)), the norm per group of the inner width (transformers' RMSNormGated with
    norm_before_gate false)."""

    def __init__(self, dim: int, groups: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.groups, self.eps = groups, eps

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = y.dtype
        h = y.float() * F.silu(z.float())
        g = h.view(*h.shape[:-1], self.groups, -1)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * g.view(h.shape).to(dtype)


class Mamba2Mixer(nn.Module):
    """One Mamba2 layer. in_proj rows: z (inner), xBC (conv_dim), dt (num_heads), as the checkpoint's."""

    def __init__(self, spec: Mamba2Spec, hidden_size: int, eps: float, state_index: int):
        super().__init__()
        self.spec = spec
        self.state_index = state_index  # this layer's index in the state pool
        self.h, self.p, self.n, self.g = spec.num_heads, spec.head_dim, spec.state_size, spec.n_groups
        self.inner, self.conv_dim = spec.inner, spec.conv_dim
        self.in_proj = nn.Linear(hidden_size, self.inner + self.conv_dim + self.h, bias=spec.proj_bias)
        self.conv_weight = nn.Parameter(torch.empty(self.conv_dim, spec.conv_kernel))  # depthwise, [C, K]
        self.conv_bias = nn.Parameter(torch.empty(self.conv_dim)) if spec.conv_bias else None
        self.dt_bias = nn.Parameter(torch.ones(self.h))
        self.A_log = nn.Parameter(torch.zeros(self.h))
        self.D = nn.Parameter(torch.ones(self.h))
        self.norm = GroupGatedRMSNorm(self.inner, self.g, eps)
        self.out_proj = nn.Linear(self.inner, hidden_size, bias=spec.proj_bias)
        self.use_cpu_kernel = False  # decode through mamba2.c (enable_cpu_ops of the Mamba2 families)

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        T = x.shape[0]
        z, xbc, dt = self.in_proj(x).split([self.inner, self.conv_dim, self.h], dim=-1)
        pool = fb.state_pool
        ssm, conv = pool.ssm[self.state_index], pool.conv[self.state_index]  # [slots, ...] each

        def rule(rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
            return self._rule(xbc[rows], dt[rows], ssm, conv, slots)

        def extend(rows: slice, slot: int, fresh: bool) -> torch.Tensor:
            return self._extend_one(xbc[rows], dt[rows], ssm, conv, slot, fresh)

        if fb.is_decode:
            y = self._rule(xbc, dt, ssm, conv, fb.state_slots)
            decode_saves(fb, ssm, conv)
        else:
            y = extend_requests(fb, extend, rule, self.state_index, ssm, conv)
        out = self.norm(y.reshape(T, self.inner).to(x.dtype), z)
        return self.out_proj(out.to(x.dtype))

    def _ssm_inputs(self, xbc: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Convolved channels [n, C] and dt [n, H] -> x [n, H, P], dt after softplus [n, H], B and C [n, H, N]
        (each group's repeated to its heads), A [H], all float32."""
        n = xbc.shape[0]
        xs, B, C = xbc.float().split([self.inner, self.g * self.n, self.g * self.n], dim=-1)
        rep = self.h // self.g
        B = B.reshape(n, self.g, self.n).repeat_interleave(rep, dim=1)
        C = C.reshape(n, self.g, self.n).repeat_interleave(rep, dim=1)
        dt = F.softplus(dt + self.dt_bias).float()
        return xs.reshape(n, self.h, self.p), dt, B, C, -torch.exp(self.A_log.float())

    def _conv(self, seq: torch.Tensor) -> torch.Tensor:
        """[m, C, K - 1 + L] -> silu(depthwise causal conv) [m, C, L]."""
        return F.silu(F.conv1d(seq, self.conv_weight.unsqueeze(1), self.conv_bias, groups=self.conv_dim))

    def _rule(self, xbc: torch.Tensor, dt: torch.Tensor, ssm: torch.Tensor, conv: torch.Tensor,
              slots: torch.Tensor) -> torch.Tensor:
        """The decode rule: one token of each row [n, C] from the state at slots[b], written back in place.
        Returns y [n, H, P] float32."""
        if self.use_cpu_kernel:
            xbc = gdn_ops.gdn_conv_update(xbc, conv, self.conv_weight, slots, self.conv_bias)  # [n, C] float32
            return mamba2_ops.mamba2_decode(xbc, dt, self.dt_bias, -torch.exp(self.A_log.float()), self.D, ssm, slots,
                                            self.g)
        window = torch.cat([conv[slots], xbc.unsqueeze(-1)], dim=-1)  # [n, C, K]
        conv[slots] = window[..., 1:]
        x, dt, B, C, A = self._ssm_inputs(self._conv(window)[..., -1], dt)
        y, new = step(x, dt, A, B, C, self.D.float(), ssm[slots])
        ssm[slots] = new
        return y

    def _extend_one(self, xbc: torch.Tensor, dt: torch.Tensor, ssm: torch.Tensor, conv: torch.Tensor, slot: int,
                    fresh: bool) -> torch.Tensor:
        """One request's new tokens [L, C] from its slot's state (zeros when fresh); writes the state back."""
        K, L = self.spec.conv_kernel, xbc.shape[0]
        window = torch.zeros_like(conv[slot]) if fresh else conv[slot]
        seq = torch.cat([window.to(xbc.dtype), xbc.transpose(0, 1)], dim=-1)  # [C, K - 1 + L]
        conv[slot] = seq[:, -(K - 1):]
        x, dt, B, C, A = self._ssm_inputs(self._conv(seq.unsqueeze(0))[0].transpose(0, 1), dt)
        state = torch.zeros_like(ssm[slot]) if fresh else ssm[slot]
        y, ssm[slot] = chunk_scan(x, dt, A, B, C, self.D.float(), state, min(self.spec.chunk_size, L))
        return y
