"""Router variants of the DeepSeek family (DeepSeek V2 / V3, Kimi K2, GLM-4.5 MoE): scoring, grouped top-k,
the score-correction bias and the routed scaling, as transformers' DeepseekV2TopkRouter / DeepseekV3TopkRouter
compute them (float32 throughout: the router logits from a float32 copy of the input and of the weight).

- scoring "softmax" (V2) or "sigmoid" (V3, GLM-4.5) over every expert's router logit;
- topk_method "greedy": top-k of the scores; "group_limited_greedy" (V2): the experts split into n_group
  groups, a group scored by its best expert, the topk_group best groups kept, top-k among their experts
  (the others' scores set to 0); "noaux_tc" (V3): the choice reads scores + e_score_correction_bias, a group
  scored by the sum of its two best, the others' experts masked to -inf; the weights are the plain scores of
  the chosen experts;
- norm_topk_prob: the k weights renormalised (V3: over their sum + 1e-20);
- routed_scaling_factor: the weights multiplied by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

SCORING = ("softmax", "sigmoid")
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


@dataclass(frozen=True)
class RoutingSpec:
    scoring: str  # SCORING
    topk_method: str  # TOPK_METHODS
    n_group: int  # groups of experts (1: no grouping)
    topk_group: int  # groups kept per token
    routed_scaling_factor: float
    norm_topk_prob: bool
    correction_bias: bool  # e_score_correction_bias in the checkpoint (noaux_tc)


def check_routing(spec: RoutingSpec, num_experts: int, top_k: int, arch: str) -> None:
    """ValueError naming a routing field whose value this router does not implement."""
    if spec.scoring not in SCORING:
        raise ValueError(f"scoring_func {spec.scoring!r} is not supported ({arch}: {', '.join(SCORING)})")
    if spec.topk_method not in TOPK_METHODS:
        raise ValueError(f"topk_method {spec.topk_method!r} is not supported ({arch}: {', '.join(TOPK_METHODS)})")
    if spec.topk_method != "greedy":
        if spec.n_group < 1 or num_experts % spec.n_group:
            raise ValueError(f"n_group {spec.n_group} must divide the {num_experts} routed experts ({arch})")
        if not 1 <= spec.topk_group <= spec.n_group:
            raise ValueError(f"topk_group {spec.topk_group} must be between 1 and n_group {spec.n_group} ({arch})")
        if top_k > spec.topk_group * (num_experts // spec.n_group):
            raise ValueError(f"num_experts_per_tok {top_k} exceeds the experts of the topk_group {spec.topk_group} "
                             f"groups ({arch})")


def _group_mask(choice: torch.Tensor, spec: RoutingSpec, group_score: str) -> torch.Tensor:
    """[T, E] bool: the experts of each token's topk_group best groups."""
    T, E = choice.shape
    grouped = choice.view(T, spec.n_group, E // spec.n_group)
    if group_score == "max":
        scores = grouped.max(dim=-1).values
    else:  # the sum of the two best experts of the group
        scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
    idx = torch.topk(scores, k=spec.topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(scores).scatter_(1, idx, 1)
    return mask.unsqueeze(-1).expand(T, spec.n_group, E // spec.n_group).reshape(T, E).bool()


def route_grouped(x: torch.Tensor, router: torch.Tensor, bias: Optional[torch.Tensor], top_k: int,
                  spec: RoutingSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, hidden], router [E, hidden] (float32), bias [E] float32 or None -> (weights [T, k] float32,
    experts [T, k] int64)."""
    logits = F.linear(x.float(), router.float())  # [T, E]
    scores = logits.softmax(dim=-1) if spec.scoring == "softmax" else logits.sigmoid()
    if spec.topk_method == "greedy":
        weights, experts = torch.topk(scores, k=top_k, dim=-1, sorted=False)
    elif spec.topk_method == "group_limited_greedy":
        masked = scores.masked_fill(~_group_mask(scores, spec, "max"), 0.0)
        weights, experts = torch.topk(masked, k=top_k, dim=-1, sorted=False)
    else:  # noaux_tc
        choice = scores if bias is None else scores + bias
        choice = choice.masked_fill(~_group_mask(choice, spec, "top2"), float("-inf"))
        experts = torch.topk(choice, k=top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, experts)
    if spec.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * spec.routed_scaling_factor, experts
