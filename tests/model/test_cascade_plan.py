"""attention/cascade.plan_cascade against its contract, on random tables (hypothesis): every group's
members really hold the same slots on [0, P), P is within each member's shareable positions, no
request is in two groups, and each request's k_begin says where its own part starts."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlang_runtime.model.layers.attention.cascade import plan_cascade


@st.composite
def tables(draw):
    """Requests that copy a random-length run of one of a few prefixes, then own random slots."""
    n_prefix = draw(st.integers(1, 3))
    prefixes = [list(range(1000 * (i + 1), 1000 * (i + 1) + 200)) for i in range(n_prefix)]
    B = draw(st.integers(1, 8))
    rt = torch.zeros(B, 256, dtype=torch.int64)
    shareable, fresh = [], 100_000
    for b in range(B):
        p = draw(st.integers(0, n_prefix - 1))
        take = draw(st.integers(0, 200))
        total = draw(st.integers(take, 250))
        own = list(range(fresh, fresh + total - take))
        fresh += total - take
        rt[b, :total] = torch.tensor(prefixes[p][:take] + own, dtype=torch.int64)
        rt[b, total:] = draw(st.sampled_from([0, 1000]))  # stale entries past the request's own positions
        shareable.append(draw(st.integers(0, total)))
    return rt, shareable


@settings(max_examples=150, deadline=None)
@given(tables(), st.integers(1, 40))
def test_plan_groups_only_equal_slots(table, min_shared):
    rt, shareable = table
    B = rt.shape[0]
    rows = list(range(B))[::-1]
    rt = rt.flip(0)  # table row of request i is B - 1 - i
    counts = [1 + i % 3 for i in range(B)]
    starts = [sum(counts[:i]) for i in range(B)]
    plan = plan_cascade(rt, rows, shareable, starts, counts, min_shared=min_shared)
    if plan is None:
        return
    seen: set[int] = set()
    k_begin = [0] * B
    for g in range(plan.num_groups):
        P, row = int(plan.group_lens[g]), int(plan.group_rows[g])
        assert P >= min_shared
        q_rows = plan.q_index[plan.group_starts[g] : plan.group_starts[g + 1]].tolist()
        members = sorted({i for i in range(B) if set(range(starts[i], starts[i] + counts[i])) <= set(q_rows)})
        assert len(members) >= 2 and sum(counts[i] for i in members) == len(q_rows)
        for i in members:
            assert i not in seen and P <= shareable[i]
            assert torch.equal(rt[rows[i], :P], rt[row, :P])
            seen.add(i)
            k_begin[i] = P
    assert plan.k_begin.tolist() == k_begin
    assert plan.max_group_rows == max(int(b - a) for a, b in zip(plan.group_starts, plan.group_starts[1:]))


def test_the_longest_shared_run_wins_over_a_stray_member():
    """Three requests share 120 slots, a fourth only 20 of them: the group is the three, P = 120."""
    rt = torch.zeros(4, 200, dtype=torch.int64)
    shared = torch.arange(500, 620)
    for b in range(3):
        rt[b, :120] = shared
        rt[b, 120:150] = torch.arange(1000 + 100 * b, 1030 + 100 * b)
    rt[3, :20], rt[3, 20:150] = shared[:20], torch.arange(5000, 5130)
    plan = plan_cascade(rt, [3, 0, 1, 2], [149] * 4, [0, 1, 2, 3], [1] * 4, min_shared=16)
    assert plan.num_groups == 1 and plan.group_lens.tolist() == [120] and plan.k_begin.tolist() == [0, 120, 120, 120]
