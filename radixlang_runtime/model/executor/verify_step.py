"""How a verify step's rows run: a request's last token + its draft (jump-forward's forced tokens, an n-gram
draft) verified in one forward pass (the sampler's side: model/executor/sample_step.py).

Attention-only models run such a step as decode rows (verify_as_decode). A hybrid model's linear-attention
layers cannot: all of a request's rows read one state slot, and a rejected draft token must not stay folded
into it. Its verifying requests are named in the step (state_verify_rows): their DeltaNet rows run position by
position with the decode rule, keeping the state after each (mem/verify_states.py), and the runner rolls each
slot back to the state after its last kept position once the sampler knows it (ModelRunner.keep_verified).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from radixlang_runtime.model.executor.step_io import ModelBatch

if TYPE_CHECKING:
    from radixlang_runtime.model.executor.runner import StepInputs


def verify_as_decode(step: "StepInputs", batch: ModelBatch, counts: list[int]) -> "StepInputs":
    """A step whose every request runs exactly its last token + its draft (n-gram or jump-forward
    verification, nothing to prefill, no input logprobs) as a decode step of T = sum(counts) rows: row j
    of request i is the decode of position prefix_i + j over the same table row. Each layer stores every
    row's K/V before any row attends (decode_layer.c, the backends' store-then-attend), so row j sees the
    draft tokens before it exactly as an extend's causal mask would, and the step runs the fused decode
    kernel (one C call per layer) instead of an extend: verifying k tokens costs about one decode step
    of k + 1 rows. The token order, slots and logit rows are unchanged (sample_step reads the same rows).
    Returns `step` itself when some request does more than that (a prefill, a chunk)."""
    if any(s is None for s in batch.samples) or counts != step.extend_lens or step.state_saves:
        return step
    req_rows = [r for r, n in zip(step.req_rows, counts) for _ in range(n)]
    prefix_lens = [p + j for p, n in zip(step.prefix_lens, counts) for j in range(n)]
    lora_ids = [a for a, n in zip(step.lora_ids, counts) for _ in range(n)]
    return dataclasses.replace(step, phase="decode", req_rows=req_rows, prefix_lens=prefix_lens,
                               extend_lens=[1] * len(req_rows), lora_ids=lora_ids)


def state_verify_rows(batch: ModelBatch, sample_idx: list[int], counts: list[int]) -> list[int]:
    """A hybrid model's step: the requests verifying a draft (counts: 1 + draft length of each sampled request).
    Each runs exactly its last token + its draft, the rows whose states the rollback chooses from."""
    verify = [i for i, n in zip(sample_idx, counts) if n > 1]
    for i in verify:
        if len(batch.extend_ids[i]) != 1 + len(batch.samples[i].draft):
            raise RuntimeError(f"request {batch.rids[i]}: a draft verified after {len(batch.extend_ids[i]) - 1} "
                               f"tokens where its state rolls back over 1 + {len(batch.samples[i].draft)}")
    return verify
