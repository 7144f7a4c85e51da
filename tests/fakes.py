"""A fake model runner for torch-free scheduler tests.

It keeps a dict slot -> (rid, position, token) of everything the scheduler told it to store and,
on every step, checks that each request's slots hold exactly its own tokens at positions
0 .. kv_len - 1. Its next token depends only on the request's token history, so a request must get
the same output whatever else is batched with it, however often it was retracted.
"""

from __future__ import annotations

from radixlang_runtime.scheduler.batch import ScheduleBatch

VOCAB = 97


def next_token(fill: list[int]) -> int:
    return (sum(fill) * 31 + len(fill) * 7) % VOCAB


class FakeRunner:
    def __init__(self) -> None:
        self.slots: dict[int, tuple[str, int, int]] = {}
        self.batches: list[tuple[str, int, int]] = []  # (phase, batch size, tokens)

    def forward(self, batch: ScheduleBatch) -> None:
        self.batches.append((batch.phase, batch.batch_size, batch.num_tokens))
        for req, prefix, ids, locs in zip(batch.reqs, batch.prefix_lens, batch.extend_ids, batch.out_locs):
            assert len(ids) == len(locs) > 0
            fill = req.fill_ids
            assert ids == fill[prefix : prefix + len(ids)], "step runs the wrong tokens"
            for j, (t, s) in enumerate(zip(ids, locs)):
                self.slots[s] = (req.rid, prefix + j, t)
            for pos in range(prefix + len(ids)):
                assert self.slots[req.kv_indices[pos]] == (req.rid, pos, fill[pos]), "KV slot holds foreign data"
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
