"""return_hidden_states in the scheduler (SGLang's field and shape): a requesting request keeps the final norm's
output of each position it ran (Req.hidden_rows, row p = position p), from the rows each step's result carries
(model/executor/hidden_step.py); its first admission reads no cached prefix (kv_manager.match stops at the rows
it holds), so its prompt's rows are its own. Rows are kept by position: a retracted request's recomputation, a
chunk boundary or the overlap schedule's step in flight never duplicate one, and rows of draft tokens the model
rejected are dropped.

What meta_info.hidden_states holds (SGLang's: scheduler_output_processor_mixin): a list whose first entry is the
prompt's rows (one per prompt token, from the prefill), then one row per generated token that ran as a decode
input, i.e. each generated token but the last (no forward pass reads the last one)."""

from __future__ import annotations

from typing import Optional

from radixlang_runtime.model.executor.step_io import StepResult
from radixlang_runtime.scheduler.request import Req


def keep_hidden(req: Req, batch, i: int, result: StepResult) -> None:
    """Request i of `batch` (a ScheduleBatch): the rows of its tokens this step ran, but a rejected draft's."""
    rows = result.hidden[i]
    start = batch.prefix_lens[i]
    draft = batch.draft_lens[i] if batch.draft_lens else 0
    end = start + len(rows) - draft + result.accepted.get(i, 0)
    have = len(req.hidden_rows)
    if start <= have < end:  # start > have cannot be: its prefixes are computed, never read from the cache
        req.hidden_rows += rows[have - start:end - start]


def hidden_states_out(req: Req) -> Optional[list]:
    """The finished request's meta_info.hidden_states (None: not asked)."""
    if not req.return_hidden_states:
        return None
    rows = req.hidden_rows[:len(req.input_ids) + max(len(req.output_ids) - 1, 0)]
    return [rows[:len(req.input_ids)], *rows[len(req.input_ids):]]
