"""A fake model runner for torch-free scheduler tests (the runner's contract: model/executor/step_io.py).

It keeps a dict slot -> (position, token, hash of the tokens 0..position) of everything the scheduler told
it to store, and its own copy of the request table, updated the way the real runner updates
req_to_token (the batch's rewrites, then the new positions). On every step it checks that each request's
row points at slots holding one consistent token history at positions 0 .. prefix - 1, and for a request
that draws a token that this history is exactly its prompt + output (+ draft): slots shared through the
prefix cache pass (same tokens, same positions), foreign or stale ones fail. Its next token depends only
on the request's token history, so a request must get the same output whatever else is batched with it,
however often it was retracted or served from the cache.
A draft riding in a step (SampleSpec.draft) is verified as the real runner does (model/executor/sample_step.py):
draft[j] accepted while next_fn of the history up to it equals it.
"""

from __future__ import annotations

from typing import Callable

from radixlang_runtime.model.executor.step_io import ModelBatch, StepResult

VOCAB = 97


def next_token(fill: list[int]) -> int:
    return (sum(fill) * 31 + len(fill) * 7) % VOCAB


def copy_token(fill: list[int], period: int = 7) -> int:
    """A copying model (n-gram drafts mostly accepted): repeats the token `period` back, except every
    fifth position (a rejection)."""
    if len(fill) < period or len(fill) % 5 == 0:
        return next_token(fill)
    return fill[-period]


class FakeRunner:
    def __init__(self, next_fn: Callable[[list[int]], int] = next_token) -> None:
        self.next_fn = next_fn
        self.slots: dict[int, tuple[int, int]] = {}
        self.rows: dict[int, list[int]] = {}  # table row -> slot per position (the runner's req_to_token)
        self.batches: list[tuple[str, int, int]] = []  # (phase, batch size, tokens)
        self.cached_prefix_tokens = 0  # prefix positions extend steps read instead of computing

    def forward(self, batch: ModelBatch) -> StepResult:
        self.batches.append((batch.phase, batch.batch_size, batch.num_tokens))
        for row, slots in batch.rewrites:
            self.rows.setdefault(row, [])[: len(slots)] = slots
        result = StepResult()
        for i, (table_row, prefix, ids, locs, spec) in enumerate(zip(batch.table_rows, batch.prefix_lens,
                                                                   batch.extend_ids, batch.out_locs, batch.samples)):
            assert len(ids) == len(locs) > 0
            if batch.phase == "extend":
                self.cached_prefix_tokens += prefix
            row = self.rows.setdefault(table_row, [])
            assert len(row) >= prefix, "the table row is shorter than the request's prefix"
            del row[prefix:]
            history = [self.slots.get(s, (None, None))[1] for s in row] + list(ids)
            if spec is not None:
                fill = spec.input_ids + spec.output_ids + spec.draft
                assert history == fill[: prefix + len(ids)], "step runs the wrong tokens"
                assert len(history) == len(fill), "a sampled request runs up to its last token"
            row.extend(locs)
            for j, s in enumerate(locs):
                pos = prefix + j
                self.slots[s] = (pos, history[pos], hash(tuple(history[: pos + 1])))
            for pos in range(prefix + len(ids)):
                assert self.slots[row[pos]] == (pos, history[pos], hash(tuple(history[: pos + 1]))), \
                    "KV slot holds foreign data"
            if spec is None:
                continue
            fill, draft, a = spec.input_ids + spec.output_ids, spec.draft, 0
            while a < len(draft) and self.next_fn(fill + draft[:a]) == draft[a]:
                a += 1
            if draft:
                result.accepted[i] = a
            forced = spec.forced  # a spent thinking budget's end marker (the Sampler's override)
            result.next_token_ids.append(forced if forced is not None else self.next_fn(fill + draft[:a]))
        return result


def expected_output(prompt: list[int], n: int, stop_ids: tuple[int, ...] = (),
                    next_fn: Callable[[list[int]], int] = next_token) -> list[int]:
    """What a request alone produces with FakeRunner (greedy by construction)."""
    fill, out = list(prompt), []
    for _ in range(n):
        t = next_fn(fill)
        out.append(t)
        fill.append(t)
        if t in stop_ids:
            break
    return out


class FakeStateRunner(FakeRunner):
    """FakeRunner with a hybrid model's recurrent state: state slot s (the request in table row s, or a
    prefix-cache snapshot) holds the tuple of tokens folded into it. Each step applies the batch's snapshot
    loads, then checks that a request continuing at prefix p > 0 has exactly its first p tokens in its slot
    (a stale, foreign or missing state fails), folds the step's tokens in, and saves the snapshots the batch
    asks for (the state after `offset` of its new tokens). A request verifying a draft keeps in its slot only
    its token and the accepted draft tokens (the real runner's rollback, mem/verify_states.py); a snapshot
    asked for inside a draft fails."""

    def __init__(self, next_fn: Callable[[list[int]], int] = next_token) -> None:
        super().__init__(next_fn)
        self.states: dict[int, tuple[int, ...]] = {}
        self.loads = self.saves = 0

    def forward(self, batch: ModelBatch) -> StepResult:
        for snapshot, slot in batch.state_loads:
            self.states[slot] = self.states[snapshot]
            self.loads += 1
        result = super().forward(batch)  # the rows now hold every position of this step
        saves = {i: (off, snap) for i, off, snap in batch.state_saves}
        for i, (table_row, prefix, ids) in enumerate(zip(batch.table_rows, batch.prefix_lens, batch.extend_ids)):
            tokens = tuple(self.slots[s][1] for s in self.rows[table_row][: prefix + len(ids)])
            if prefix:
                assert self.states.get(table_row) == tokens[:prefix], "a step continues from a wrong state"
            spec = batch.samples[i]
            drafted = len(spec.draft) if spec is not None else 0
            kept = len(ids) - drafted + result.accepted.get(i, 0)
            if i in saves:
                off, snap = saves[i]
                assert off <= len(ids) - drafted, "a snapshot holds a draft token"
                self.states[snap] = tokens[: prefix + off]
                self.saves += 1
            self.states[table_row] = tokens[: prefix + kept]
        return result
