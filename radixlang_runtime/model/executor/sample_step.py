"""One step's sampling: grammar masks, output logprobs, the sampler, and verification of
jump-forward drafts — the part of ModelRunner.forward after the logits.

Rows: sampled request k owns n_k = draft_len + 1 consecutive logits rows (its last extend positions).
Row j of a request with a draft is the distribution after draft[:j]: it is masked with the grammar
state at that point (SampleSpec.grammar_states[j]; SampleSpec.also_allowed keeps one more token: a
reasoning block's opening) and sampled like any row. Verification walks the rows:
draft[j] is accepted while the token sampled at row j equals it; the first row whose sample differs
(or the last row) gives the request's next token. So a request emits exactly what token-by-token
decoding would (greedy: the same tokens; sampling: the same distribution), and a draft the model
agrees with costs one forward pass instead of len(draft) + 1.
Output logprobs: the picked row's token, as for any sampled token; an n-gram draft (unconstrained request)
also gets its accepted tokens' logprobs, each from its own row (StepLogprobs.draft_vals / draft_top: what
decoding them one by one gives); jump-forward's accepted tokens (constrained) get none here.
allowed_token_ids hold on every row as on any. A request with bad_words samples row j with its own output
(the output before the step + draft[:j]: _row_output), so a draft never carries a banned word through (its
penalties, min_new_tokens and seeded noise see that output too).
Limits (stated, not hidden): otherwise penalties, min_new_tokens and a seeded request's noise see the output
as it was before the step on every row of its draft.
"""

from __future__ import annotations

import dataclasses

import torch

from radixlang_runtime.model.executor.logprobs import fill_output_logprobs
from radixlang_runtime.model.executor.sampler import Sampler
from radixlang_runtime.model.executor.step_io import ModelBatch, SampleSpec, StepLogprobs, StepResult


def sample_step(batch: ModelBatch, sample_idx: list[int], counts: list[int], logits: torch.Tensor,
                sampler: Sampler, result: StepResult) -> None:
    """logits [sum(counts), V] float32 (edited in place). Sets result.next_token_ids (one per sampled
    request), result.accepted (request index -> accepted draft tokens) and output logprobs."""
    row_pos = [j for n in counts for j in range(n)]  # position of each row inside its request's draft
    row_specs = [_row_output(batch.samples[i], j) for i, n in zip(sample_idx, counts) for j in range(n)]
    constrained = [r for r, spec in enumerate(row_specs) if spec.constrained]
    if constrained:  # one batched mask [C, V]; logprobs and every sampler see the masked distribution
        from radixlang_runtime.constrained.mask import mask_logits

        states = [row_specs[r].grammar_states[min(row_pos[r], len(row_specs[r].grammar_states) - 1)]
                  for r in constrained]
        extra = [(r, row_specs[r].also_allowed) for r in constrained if row_specs[r].also_allowed is not None]
        kept = logits[[r for r, _ in extra], [t for _, t in extra]].clone() if extra else None
        mask_logits(logits, constrained, states)
        if extra:  # a token the grammar does not allow but the request may take (a reasoning block's opening)
            logits[[r for r, _ in extra], [t for _, t in extra]] = kept
    want_rows = [r for r, spec in enumerate(row_specs) if spec.return_logprob]
    lsm_rows = torch.log_softmax(logits[want_rows], dim=-1) if want_rows else None  # before the sampler edits
    tokens = sampler.sample(logits, row_specs)
    picks, next_ids, starts, start = [], [], [], 0
    for i, n in zip(sample_idx, counts):
        a = 0
        draft = batch.samples[i].draft
        while a < n - 1 and tokens[start + a] == draft[a]:
            a += 1
        if n > 1:
            result.accepted[i] = a
        picks.append(start + a)
        starts.append(start)
        next_ids.append(tokens[start + a])
        start += n
    result.next_token_ids = next_ids
    want = [k for k, i in enumerate(sample_idx) if batch.samples[i].return_logprob]
    if want:
        where = {r: w for w, r in enumerate(want_rows)}
        lsm = lsm_rows[[where[picks[k]] for k in want]]
        fill_output_logprobs(result, batch, sample_idx, want, lsm, next_ids)
        _draft_logprobs(result, batch, sample_idx, want, starts, lsm_rows, where)


def _row_output(spec: SampleSpec, j: int) -> SampleSpec:
    """The spec row j of a request samples with: for bad_words past row 0, its output is the output before the
    step + draft[:j] (what decoding token by token would have seen there); else the request's own spec."""
    if j == 0 or not spec.sampling.bad_words_ids:
        return spec
    return dataclasses.replace(spec, output_ids=spec.output_ids + spec.draft[:j])


def _draft_logprobs(result: StepResult, batch: ModelBatch, sample_idx: list[int], want: list[int],
                    starts: list[int], lsm_rows: torch.Tensor, where: dict[int, int]) -> None:
    """For each logprob request with accepted n-gram draft tokens: logprob (and top) of draft[j] at row j."""
    for k in want:
        i = sample_idx[k]
        spec, a = batch.samples[i], result.accepted.get(i, 0)
        if not a or spec.constrained:
            continue
        rows = lsm_rows[[where[starts[k] + j] for j in range(a)]]  # [a, V]
        ids = torch.tensor(spec.draft[:a], dtype=torch.int64, device=rows.device)
        out = result.logprobs.setdefault(i, StepLogprobs())
        out.draft_vals = rows.gather(1, ids[:, None]).squeeze(1).tolist()
        if spec.top_logprobs_num:
            vals, top_ids = rows.topk(spec.top_logprobs_num, dim=-1)
            out.draft_top = [[[v, t] for v, t in zip(vr, ir)] for vr, ir in zip(vals.tolist(), top_ids.tolist())]
