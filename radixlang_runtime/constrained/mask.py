"""The allowed-token mask of one step, batched over the constrained rows (torch).

build_mask(states, width, device) -> bool [B_c, W], True = the token may be sampled, where B_c is
the number of constrained rows and W the logits width (the model's vocab_size, not len(tokenizer)).
No Python loop over the vocabulary: per row we look up a cached tensor of the state's allowed ids
(built once per (grammar, state, device)), then one index_put over all rows:
  dense rows (many allowed ids): a cached bool row [W] of the state, stacked;
  sparse rows: the concatenated ids with their row numbers (repeat_interleave), one scatter.
Finish ids (EOS + the request's stop ids) are written last: True in final states, False elsewhere
(a stop id that is also a text token must not end a match early).

apply_mask(logits, rows, mask): logits [B, W] float, rows = the constrained rows' positions in the
batch (len B_c); disallowed entries become -inf in place. Unconstrained rows are untouched.
A row that would allow nothing (must_finish with no finish ids; the scheduler finishes those before
sampling) allows the grammar's EOS instead, so softmax never sees an all -inf row; so does a row whose
grammar call went past its budget (step_guard.py): the scheduler then ends that request alone.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from radixlang_runtime.constrained.grammar import AllowedSet
from radixlang_runtime.constrained.state import GrammarState
from radixlang_runtime.constrained.step_guard import GrammarBudgetExceeded

DENSE_FRACTION = 16  # a state allowing more than W / DENSE_FRACTION ids caches a bool row instead
_EOS_ONLY = AllowedSet(np.zeros(0, dtype=np.int64), True)  # a row whose grammar is past its budget


def _device_key(device: torch.device) -> str:
    return str(device)


def _state_tensor(a: AllowedSet, width: int, device: torch.device) -> tuple[bool, torch.Tensor]:
    """(is_dense, tensor): bool [W] for dense states, int64 [n] ids otherwise; cached on the AllowedSet."""
    key = _device_key(device)
    hit = a.device_cache.get(key)
    if hit is None:
        ids = torch.from_numpy(a.ids)
        if len(a.ids) * DENSE_FRACTION > width:
            row = torch.zeros(width, dtype=torch.bool)
            row[ids] = True
            hit = (True, row.to(device))
        else:
            hit = (False, ids.to(device))
        a.device_cache[key] = hit
    return hit


def build_mask(states: Sequence[GrammarState], width: int, device: torch.device) -> torch.Tensor:
    """-> bool [len(states), width]; True where the row's grammar state allows the token."""
    b = len(states)
    mask = torch.zeros(b, width, dtype=torch.bool, device=device)  # [B_c, W]
    dense_rows: list[int] = []
    dense: list[torch.Tensor] = []
    sparse_rows: list[int] = []
    sparse: list[torch.Tensor] = []
    fin_rows: list[int] = []
    fin_cols: list[int] = []
    fin_vals: list[bool] = []
    for i, st in enumerate(states):
        try:
            a = st.allowed()
        except GrammarBudgetExceeded:  # the scheduler ends the request after this step (its next call raises too)
            a = _EOS_ONLY
        is_dense, t = _state_tensor(a, width, device)
        if is_dense:
            dense_rows.append(i)
            dense.append(t)
        elif len(t):
            sparse_rows.append(i)
            sparse.append(t)
        final = a.is_final and not st.terminated
        finish = st.finish_ids
        if a is _EOS_ONLY or (final and not finish and len(a.ids) == 0):
            finish = (st.grammar.vocab.eos_token_id,)
        for tok in finish:
            fin_rows.append(i)
            fin_cols.append(tok)
            fin_vals.append(final)
    if dense:
        mask[torch.tensor(dense_rows, device=device)] = torch.stack(dense)
    if sparse:
        counts = torch.tensor([len(t) for t in sparse], device=device)
        rows = torch.repeat_interleave(torch.tensor(sparse_rows, device=device), counts)
        mask[rows, torch.cat(sparse)] = True
    if fin_rows:
        mask[torch.tensor(fin_rows, device=device), torch.tensor(fin_cols, device=device)] = \
            torch.tensor(fin_vals, device=device)
    return mask


def apply_mask(logits: torch.Tensor, rows: Sequence[int], mask: torch.Tensor) -> None:
    """logits [B, W] (in place): -inf wherever mask [len(rows), W] is False, on the given rows."""
    assert mask.shape == (len(rows), logits.shape[1]), (mask.shape, len(rows), logits.shape)
    if len(rows) == logits.shape[0] and list(rows) == list(range(len(rows))):
        logits.masked_fill_(~mask, float("-inf"))
        return
    idx = torch.tensor(list(rows), device=logits.device)
    logits[idx] = logits[idx].masked_fill(~mask, float("-inf"))


def mask_logits(logits: torch.Tensor, rows: Sequence[int], states: Sequence[GrammarState]) -> None:
    """build_mask + apply_mask: the one call a sampler makes per step for its constrained rows."""
    if rows:
        apply_mask(logits, rows, build_mask(states, logits.shape[1], logits.device))
