"""A fake model runner for torch-free scheduler tests.

It keeps a dict slot -> (position, hash of the tokens 0..position) of everything the scheduler told
it to store, and its own copy of the request table, updated the way the real runner updates
req_to_token (rewrite_rows, then the new positions). On every step it checks that each request's
row points at slots holding exactly its token history at positions 0 .. kv_len - 1: slots shared
through the prefix cache pass (same tokens, same positions), foreign or stale ones fail. Its next
token depends only on the request's token history, so a request must get the same output whatever
else is batched with it, however often it was retracted or served from the cache.
A draft riding in a step (batch.draft_lens) is verified as the real runner does (model/sample_step.py):
draft[j] accepted while next_fn of the history up to it equals it.
"""

from __future__ import annotations

from typing import Callable

from radixlang_runtime.scheduler.batch import ScheduleBatch

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

    def forward(self, batch: ScheduleBatch) -> None:
        self.batches.append((batch.phase, batch.batch_size, batch.num_tokens))
        for i in batch.rewrite_rows:
            req, p = batch.reqs[i], batch.prefix_lens[i]
            self.rows.setdefault(req.table_idx, [])[:p] = req.kv_indices[:p]
        drafts = [r.draft if batch.draft_lens and batch.draft_lens[i] else [] for i, r in enumerate(batch.reqs)]
        assert all(len(d) == (batch.draft_lens[i] if batch.draft_lens else 0) for i, d in enumerate(drafts))
        for req, prefix, ids, locs, draft in zip(batch.reqs, batch.prefix_lens, batch.extend_ids, batch.out_locs,
                                                 drafts):
            assert len(ids) == len(locs) > 0
            fill = req.fill_ids + draft
            assert ids == fill[prefix : prefix + len(ids)], "step runs the wrong tokens"
            if batch.phase == "extend":
                self.cached_prefix_tokens += prefix
            row = self.rows.setdefault(req.table_idx, [])
            del row[prefix:]
            row.extend(locs)
            for j, s in enumerate(locs):
                self.slots[s] = (prefix + j, hash(tuple(fill[: prefix + j + 1])))
            assert row == req.kv_indices, "the runner's table row differs from the request's slots"
            for pos in range(prefix + len(ids)):
                assert self.slots[row[pos]] == (pos, hash(tuple(fill[: pos + 1]))), "KV slot holds foreign data"
        batch.next_token_ids = []
        for i, (r, s) in enumerate(zip(batch.reqs, batch.sample)):
            if not s:
                continue
            fill, draft, a = r.fill_ids, drafts[i], 0
            while a < len(draft) and self.next_fn(fill + draft[:a]) == draft[a]:
                a += 1
            if draft:
                batch.accepted[i] = a
            batch.next_token_ids.append(self.next_fn(fill + draft[:a]))


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
