"""Mixture-of-experts feed-forward (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, gpt-oss): the router, the experts as one
GEMM pair per active expert, the optional shared expert (the decoder that puts the block in its layers is
models/moe_decoder.py).

Experts run grouped: the step's T x k (token, expert) assignments are sorted by expert, each active expert
multiplies its contiguous run of gathered token rows (one gate_up and one down matmul), and the weighted
rows are summed back into their tokens with one index_add. No Python loop runs per token; the loop over
experts skips the ones no token chose.

Tensor parallel: the router and the combine are replicated (every rank sees the same input after the
attention's all-reduce, so every rank routes the same way); each expert's intermediate dimension (and the
shared expert's) is split across ranks as the dense MLP's columns are, and one all-reduce sums the block's
partial outputs after the down projections (the routing weights and the shared gate scale linearly, so the
sum of the ranks' partial outputs is the whole output).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.model.layers.mlp import MLP
from radixlang_runtime.model.layers.moe_routing import route_grouped
from radixlang_runtime.model.layers.moe_spec import MoESpec
from radixlang_runtime.model.executor.parallel import Reduce, Shard, split_even


def route(x: torch.Tensor, router: torch.Tensor, top_k: int, renormalise: bool,
          bias: Optional[torch.Tensor] = None, softmax_after_topk: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, hidden], router [E, hidden] (bias [E] or None) -> (weights [T, k], experts [T, k] int64).
    Default (TopKRouter): softmax in float32 over the logits (computed in x's dtype), top-k of the
    probabilities, optionally renormalised over the k; weights float32. softmax_after_topk (gpt-oss): top-k of
    the logits, softmax over those k in x's dtype."""
    logits = F.linear(x, router, bias)  # [T, E]
    if softmax_after_topk:
        top, experts = torch.topk(logits, top_k, dim=-1)
        return torch.softmax(top, dim=-1), experts
    probs = torch.softmax(logits.float(), dim=-1)  # [T, E]
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if renormalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """[n, 2I] gate then up -> silu(gate) * up [n, I]."""
    inter = gu.shape[1] // 2
    return F.silu(gu[:, :inter]) * gu[:, inter:]


def clamped_swiglu(limit: float, alpha: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """gpt-oss's expert activation on [n, 2I] gate then up -> [n, I]: g = gate.clamp(max=limit),
    (up.clamp(-limit, limit) + 1) * g * sigmoid(alpha g) (GptOssExperts._apply_gate)."""
    def act(gu: torch.Tensor) -> torch.Tensor:
        inter = gu.shape[1] // 2
        gate, up = gu[:, :inter].clamp(max=limit), gu[:, inter:].clamp(-limit, limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    return act


def grouped_experts(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, gate_up: Optional[torch.Tensor],
                    down: Optional[torch.Tensor], weights_float32: bool,
                    linears: Optional[Sequence[Sequence[nn.Module]]] = None,
                    act: Callable[[torch.Tensor], torch.Tensor] = silu_mul,
                    gate_up_bias: Optional[torch.Tensor] = None,
                    down_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """sum_j weights[t, j] * down_e(act(gate_up_e(x_t))) with e = experts[t, j], for every token t (act:
    silu(gate) * up, or gpt-oss's clamped_swiglu).

    x [T, hidden]; weights [T, k] float32; experts [T, k]; gate_up [E, 2I, hidden] (gate rows, then up rows);
    down [E, hidden, I]; or, instead of those two, linears[e] = (gate_up_e, down_e) modules computing the same
    products (SparseMoE.pack_experts: prepacked / tiled / int8; they carry the biases). gate_up_bias [E, 2I],
    down_bias [E, hidden] (gpt-oss; None: none) with the stacked weights. weights_float32: scale in float32 then round
    (Mixtral), else round the weights to x's dtype first. Returns [T, hidden] in x's dtype."""
    T, k = experts.shape
    num_experts = len(linears) if linears is not None else gate_up.shape[0]
    flat = experts.reshape(-1)  # [T k]: assignment a = t k + j
    order = torch.argsort(flat, stable=True)  # assignments grouped by expert, token order within each
    token = order // k  # [T k]: the token row of each sorted assignment
    counts = torch.bincount(flat, minlength=num_experts).tolist()  # the one host sync of the block
    rows = x[token]  # [T k, hidden]
    out = torch.empty_like(rows)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        if linears is None:
            gu_proj = partial(F.linear, weight=gate_up[e], bias=None if gate_up_bias is None else gate_up_bias[e])
            down_proj = partial(F.linear, weight=down[e], bias=None if down_bias is None else down_bias[e])
        else:
            gu_proj, down_proj = linears[e]
        gu = gu_proj(rows[start:start + n])  # [n, 2I]
        out[start:start + n] = down_proj(act(gu))  # [n, hidden]
        start += n
    w = weights.reshape(-1)[order].unsqueeze(1)  # [T k, 1]
    scaled = (out.float() * w).to(x.dtype) if weights_float32 else out * w.to(x.dtype)
    return torch.zeros_like(x).index_add_(0, token, scaled)


class SparseMoE(nn.Module):
    """One layer's MoE block: x [T, hidden] -> [T, hidden], summed over the ranks when `reduce` is set."""

    def __init__(self, cfg: ModelConfig, shard: Shard, reduce: Reduce):
        super().__init__()
        spec: MoESpec = cfg.moe
        self.spec = spec
        h, E = cfg.hidden_size, spec.num_experts
        self.inter_start, self.inter = split_even(spec.expert_intermediate_size, shard.size, shard.rank)
        if self.inter == 0:
            raise ValueError(f"tp_size {shard.size} exceeds the experts' intermediate size "
                             f"{spec.expert_intermediate_size}")
        # replicated on every rank (not an nn.Linear: the packing / int8 passes leave the routing exact)
        self.router = nn.Parameter(torch.empty(E, h))
        self.gate_up = nn.Parameter(torch.empty(E, 2 * self.inter, h))  # [E, 2 I_rank, hidden]: gate, then up
        self.down = nn.Parameter(torch.empty(E, h, self.inter))  # [E, hidden, I_rank]
        # gpt-oss: router and expert biases. The down bias is added by rank 0 only (the all-reduce sums the
        # ranks' partial outputs); the gate_up bias is split with its columns.
        self.router_bias = nn.Parameter(torch.empty(E)) if spec.router_bias else None
        self.gate_up_bias = nn.Parameter(torch.empty(E, 2 * self.inter)) if spec.expert_bias else None
        self.down_bias = nn.Parameter(torch.empty(E, h)) if spec.expert_bias and shard.rank == 0 else None
        self.act = silu_mul if spec.swiglu_limit is None else clamped_swiglu(spec.swiglu_limit, spec.swiglu_alpha)
        self.shared = None
        if spec.shared_intermediate_size:
            s0, sn = split_even(spec.shared_intermediate_size, shard.size, shard.rank)
            self.shared_start = s0  # this rank's shared-expert columns [s0, s0 + sn)
            self.shared = MLP(cfg, dataclasses.replace(shard, inter_start=s0, inter_count=sn), None)
            if spec.shared_gated:
                self.shared_gate = nn.Parameter(torch.empty(1, h))  # sigmoid(x . g) scales the shared expert
        self.routing = spec.routing  # DeepSeek-style router (model/layers/moe_routing.py); None: route()
        if spec.routing is not None and spec.routing.correction_bias:
            self.correction_bias = nn.Parameter(torch.empty(E))  # e_score_correction_bias
        # the router's weight in float32 as the checkpoint has it (set at load; the DeepSeek-style routers run
        # in float32 whatever the model dtype)
        self.router_float32: Optional[torch.Tensor] = None
        self.reduce = reduce
        # pack_experts: (gate_up_e, down_e) linears in place of the stacked parameters (then None)
        self.expert_linears: Optional[nn.ModuleList] = None

    def pack_experts(self, make: Callable[[torch.Tensor, Optional[torch.Tensor]], nn.Module]) -> int:
        """Each expert's gate_up [2I, hidden] and down [hidden, I] become make(weight, None): the same module the
        model's other projections become (oneDNN-prepacked with decode tiles, or int8). Unpacked, a bf16 expert
        reorders its weight for oneDNN on every call. The stacked parameters are dropped. Returns how many."""
        E = self.gate_up.shape[0]
        gub, db = self.gate_up_bias, self.down_bias
        self.expert_linears = nn.ModuleList(nn.ModuleList([make(self.gate_up[e], None if gub is None else gub[e]),
                                                           make(self.down[e], None if db is None else db[e])])
                                            for e in range(E))
        self.gate_up = None  # a registered parameter set to None: gone from the module and its state
        self.down = None
        self.gate_up_bias = None
        self.down_bias = None
        return 2 * E

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        if self.routing is None:
            weights, experts = route(x, self.router, spec.top_k, spec.norm_topk_prob, self.router_bias,
                                     spec.softmax_after_topk)
        else:
            router = self.router if self.router_float32 is None else self.router_float32
            bias = self.correction_bias.float() if self.routing.correction_bias else None
            weights, experts = route_grouped(x, router, bias, spec.top_k, self.routing)
        out = grouped_experts(x, weights, experts, self.gate_up, self.down, spec.weights_float32,
                              self.expert_linears, self.act, self.gate_up_bias, self.down_bias)
        if self.shared is not None:
            shared = self.shared(x)
            out = out + (torch.sigmoid(F.linear(x, self.shared_gate)) * shared if self.spec.shared_gated else shared)
        return out if self.reduce is None else self.reduce(out)
