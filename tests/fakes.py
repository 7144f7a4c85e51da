"""A fake model runner for torch-free scheduler tests.

It keeps a dict slot -> (position, hash of the tokens 0..position) of everything the scheduler told
it to store, and its own copy of the request table, updated the way the real runner updates
req_to_token (rewrite_rows, then the new positions). On every step it checks that each request's
row points at slots holding exactly its token history at positions 0 .. kv_len - 1: slots shared
through the prefix cache pass (same tokens, same positions), foreign or stale ones fail. Its next
token depends only on the request's token history, so a request must get the same output whatever
else is batched with it, however often it was retracted or served from the cache.
"""

from __future__ import annotations

from radixlang_runtime.scheduler.batch import ScheduleBatch

VOCAB = 97


def next_token(fill: list[int]) -> int:
    return (sum(fill) * 31 + len(fill) * 7) % VOCAB


class FakeRunner:
    def __init__(self) -> None:
        self.slots: dict[int, tuple[int, int]] = {}
        self.rows: dict[int, list[int]] = {}  # table row -> slot per position (the runner's req_to_token)
        self.batches: list[tuple[str, int, int]] = []  # (phase, batch size, tokens)
        self.cached_prefix_tokens = 0  # prefix positions extend steps read instead of computing

    def forward(self, batch: ScheduleBatch) -> None:
        self.batches.append((batch.phase, batch.batch_size, batch.num_tokens))
        for i in batch.rewrite_rows:
            req, p = batch.reqs[i], batch.prefix_lens[i]
            self.rows.setdefault(req.table_idx, [])[:p] = req.kv_indices[:p]
        for req, prefix, ids, locs in zip(batch.reqs, batch.prefix_lens, batch.extend_ids, batch.out_locs):
            assert len(ids) == len(locs) > 0
            fill = req.fill_ids
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
        batch.next_token_ids = [next_token(r.fill_ids) for r, s in zip(batch.reqs, batch.sample) if s]


def expected_output(prompt: list[int], n: int, stop_ids: tuple[int, ...] = ()) -> list[int]:
    """What a request alone produces with FakeRunner (greedy by construction)."""
    fill, out = list(prompt), []
    for _ in range(n):
        t = next_token(fill)
        out.append(t)
        fill.append(t)
        if t in stop_ids:
            break
    return out
