"""Gemma 4's mixture-of-experts block (enable_moe_block: gemma-4-26B-A4B), beside each layer's dense MLP, as
transformers' Gemma4TextRouter and Gemma4TextExperts compute it:

- router: the layer's residual stream (before the feed-forward norms) RMS-normed without weight, times `scale`
  and hidden_size ** -0.5, projected to the experts; softmax in float32, top-k, renormalised over the k, each
  weight times its expert's `per_expert_scale`;
- experts: gelu_tanh(gate) * up then down, on pre_feedforward_layernorm_2 of the same stream, run grouped
  (model/layers/moe.py's grouped_experts: one GEMM pair per active expert).
Tensor parallel as model/layers/moe.py's SparseMoE: every rank routes the whole stream, each expert's
intermediate columns are split over the ranks, and one all-reduce sums the block's output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_runtime.model.executor.parallel import Shard, split_even
from radixlang_runtime.model.layers.moe import grouped_experts


def gelu_tanh_mul(gu: torch.Tensor) -> torch.Tensor:
    """[n, 2I] gate then up -> gelu_tanh(gate) * up [n, I]."""
    inter = gu.shape[1] // 2
    return F.gelu(gu[:, :inter], approximate="tanh") * gu[:, inter:]


class Gemma4MoE(nn.Module):
    def __init__(self, hidden: int, num_experts: int, top_k: int, inter: int, eps: float, shard: Shard,
                 reduce=None):
        super().__init__()
        self.top_k, self.eps, self.hidden, self.full_inter, self.reduce = top_k, eps, hidden, inter, reduce
        self.inter_start, inter = split_even(inter, shard.size, shard.rank)  # this rank's columns of each expert
        if inter == 0:
            raise ValueError(f"tp_size {shard.size} exceeds the experts' intermediate size {self.full_inter}")
        self.router_proj = nn.Linear(hidden, num_experts, bias=False)
        self.router_scale = nn.Parameter(torch.ones(hidden))
        self.per_expert_scale = nn.Parameter(torch.ones(num_experts))
        self.gate_up = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden))  # gate rows, then up rows
        self.down = nn.Parameter(torch.empty(num_experts, hidden, inter))

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [T, hidden] -> (weights [T, k] float32, experts [T, k])."""
        x = F.rms_norm(h.float(), (self.hidden,), None, self.eps).to(h.dtype)
        probs = torch.softmax(self.router_proj(x * self.router_scale * self.hidden ** -0.5), dim=-1,
                              dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[experts], experts

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """h: the stream the router reads; x: the experts' (normed) input. Returns [T, hidden]."""
        weights, experts = self.route(h)
        out = grouped_experts(x, weights.float(), experts, self.gate_up, self.down, True, act=gelu_tanh_mul)
        return out if self.reduce is None else self.reduce(out)

    def load(self, prefix: str, take, put, own: str) -> None:
        """The checkpoint's layers.i.router.* and layers.i.experts.* (prefix: model.layers.i.) into `own`."""
        put(own + "router_proj.weight", take(prefix + "router.proj.weight"))
        put(own + "router_scale", take(prefix + "router.scale"))
        put(own + "per_expert_scale", take(prefix + "router.per_expert_scale"))
        a, b, full = self.inter_start, self.inter_start + self.down.shape[2], self.full_inter
        gate_up = take(prefix + "experts.gate_up_proj")  # [E, 2I, hidden]: gate rows, then up rows
        put(own + "gate_up", torch.cat([gate_up[:, a:b], gate_up[:, full + a:full + b]], dim=1))
        put(own + "down", take(prefix + "experts.down_proj")[:, :, a:b])
