"""One step's sampling: grammar masks, output logprobs, the sampler, and verification of
jump-forward drafts — the part of ModelRunner.forward after the logits.

Rows: sampled request k owns n_k = draft_len + 1 consecutive logits rows (its last extend positions).
Row j of a request with a draft is the distribution after draft[:j]: it is masked with the grammar
state at that point (req.draft_states[j]) and sampled like any row. Verification walks the rows:
draft[j] is accepted while the token sampled at row j equals it; the first row whose sample differs
(or the last row) gives the request's next token. So a request emits exactly what token-by-token
decoding would (greedy: the same tokens; sampling: the same distribution), and a draft the model
agrees with costs one forward pass instead of len(draft) + 1.
Limits (stated, not hidden): penalties, min_new_tokens and a seeded request's noise see the output as
it was before the step on every row of its draft.
"""

from __future__ import annotations

import torch

from radixlang_runtime.model.logprobs import fill_output_logprobs
from radixlang_runtime.model.sampler import Sampler
from radixlang_runtime.scheduler.batch import ScheduleBatch


def sample_step(batch: ScheduleBatch, sample_idx: list[int], counts: list[int], logits: torch.Tensor,
                sampler: Sampler) -> None:
    """logits [sum(counts), V] float32 (edited in place). Sets batch.next_token_ids (one per sampled
    request), batch.accepted (request index -> accepted draft tokens) and output logprobs."""
    row_reqs = [batch.reqs[i] for i, n in zip(sample_idx, counts) for _ in range(n)]
    row_pos = [j for n in counts for j in range(n)]  # position of each row inside its request's draft
    constrained = [r for r, req in enumerate(row_reqs) if req.grammar is not None]
    if constrained:  # one batched mask [C, V]; logprobs and every sampler see the masked distribution
        from radixlang_runtime.constrained.mask import mask_logits

        states = [row_reqs[r].draft_states[row_pos[r]] if row_reqs[r].draft_states else row_reqs[r].grammar
                  for r in constrained]
        mask_logits(logits, constrained, states)
    want_rows = [r for r, req in enumerate(row_reqs) if req.return_logprob]
    lsm_rows = torch.log_softmax(logits[want_rows], dim=-1) if want_rows else None  # before the sampler edits
    tokens = sampler.sample(logits, row_reqs)
    picks, next_ids, start = [], [], 0
    for i, n in zip(sample_idx, counts):
        a = 0
        draft = batch.reqs[i].draft
        while a < n - 1 and tokens[start + a] == draft[a]:
            a += 1
        if n > 1:
            batch.accepted[i] = a
        picks.append(start + a)
        next_ids.append(tokens[start + a])
        start += n
    batch.next_token_ids = next_ids
    want = [k for k, i in enumerate(sample_idx) if batch.reqs[i].return_logprob]
    if want:
        where = {r: w for w, r in enumerate(want_rows)}
        lsm = lsm_rows[[where[picks[k]] for k in want]]
        fill_output_logprobs(batch, sample_idx, want, lsm, next_ids)
