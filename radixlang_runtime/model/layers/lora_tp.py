"""LoRA under tensor parallelism: each rank keeps its part of an adapter, split the way the base projection is
(model/executor/parallel.py; SGLang's split).

Column-parallel projections (q / k / v, gate / up: each rank computes its own output columns): A [r, in] whole
on every rank, B [out, r] cut to the rank's output rows (its q / KV heads, its intermediate columns), so each
rank's delta fills its own slice of the output.

Row-parallel projections (o, down: each rank multiplies its slice of the input, an all-reduce sums the partial
outputs): A cut to the rank's input columns, B whole. Each rank's (x_rank @ A_rank^T) @ B^T is a partial delta,
added to the rank's partial output before the projection's all-reduce, which sums them into x @ A^T @ B^T.
"""

from __future__ import annotations

import torch

from radixlang_runtime.model.executor.parallel import Shard


def shard_lora(proj: str, a: torch.Tensor, b: torch.Tensor, shard: Shard, head_dim: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (A, B) of projection `proj` (A [r, in], B [out, r] of the whole model)."""
    if shard.size == 1:
        return a, b
    q = (shard.q_start * head_dim, (shard.q_start + shard.q_count) * head_dim)
    kv = (shard.kv_start * head_dim, (shard.kv_start + shard.kv_count) * head_dim)
    inter = (shard.inter_start, shard.inter_start + shard.inter_count)
    rows = {"q_proj": q, "k_proj": kv, "v_proj": kv, "gate_proj": inter, "up_proj": inter}.get(proj)
    if rows is not None:  # column-parallel
        return a, b[rows[0]:rows[1]].contiguous()
    cols = {"o_proj": q, "down_proj": inter}[proj]  # row-parallel
    return a[:, cols[0]:cols[1]].contiguous(), b
