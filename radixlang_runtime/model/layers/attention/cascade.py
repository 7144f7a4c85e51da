"""Shared-prefix (cascade) attention: the plan of one step, and the merge rule its kernels use.

When requests of a batch read the same leading KV slots (the radix cache gave them one prefix), a
plain kernel reads that prefix once per request; here it is read once per group:

  1. shared part: every query row of the group's members attends to positions [0, P_g) of the
     group (no causal mask: each member's new tokens sit at positions >= P_g), giving a normalised
     output o_s and its log-sum-exp lse_s per (row, head);
  2. own part: each request attends to positions [k_begin, L) as before (causal for extend);
  3. merge by log-sum-exp (the kernels of part 2 take part 1's result as a "prior"; the reference
     is kernels/reference.merge_states):
        m = max(lse_s, lse_o);  o = (o_s e^(lse_s - m) + o_o e^(lse_o - m)) / (e^(lse_s - m) + e^(lse_o - m))
     A row outside every group has lse_s = -inf, so its prior weighs nothing.

Grouping is decided from the slots themselves (req_to_token), so it needs no help from the
scheduler and is right by construction: equal slots hold the same K/V. Only positions already in
the pool before the step can be shared (`shareable`: the cached prefix in extend, all but the new
token in decode), and only runs of at least MIN_SHARED positions are worth a group.

Rounding: the merge changes the order of the softmax sums, so results differ from the one-pass
kernels in the last bits; the deterministic mode turns cascade off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

MIN_SHARED = 64  # positions a group must share; below this the extra pass costs more than it saves


@dataclass
class CascadePlan:
    """Groups of one step (Gn groups, E query rows in all). Tensors on the pool's device, int64."""

    group_rows: torch.Tensor  # [Gn] table row of one member: its first group_lens[g] slots are the shared K/V
    group_lens: torch.Tensor  # [Gn] P_g >= MIN_SHARED
    q_index: torch.Tensor  # [E] rows of q (token rows) of each group's members, group after group
    group_starts: torch.Tensor  # [Gn + 1] offsets into q_index
    group_counts: torch.Tensor  # [Gn] query rows of each group (group_starts' differences)
    k_begin: torch.Tensor  # [B] first position of each request's own part (P_g in a group, else 0)
    max_group_rows: int  # host: the most query rows in one group (sizes GPU grids without a sync)
    max_shared: int  # host: max P_g

    @property
    def num_groups(self) -> int:
        return int(self.group_rows.shape[0])


def plan_cascade(req_to_token: torch.Tensor, req_rows: list[int], shareable: list[int], token_starts: list[int],
                 token_counts: list[int], min_shared: int = MIN_SHARED) -> Optional[CascadePlan]:
    """Group requests by the slots they share. req_rows [B] table rows; shareable[i]: positions of
    request i that are in the pool before this step; request i's query rows are token_starts[i] ..
    + token_counts[i] - 1. Returns None when no two requests share >= min_shared positions.

    Requests with the same first slot are compared with a leader (runs of equal slots, never past a
    member's shareable length, so stale table entries don't count); the group is the k longest runs
    with P = the k-th longest, k chosen to save the most reads ((k - 1) * P); the others are grouped
    again among themselves. Two leaders are tried: the first member and the one sharing most with it.
    Host syncs on CUDA: one per comparison, plus one."""
    cand = [i for i, s in enumerate(shareable) if s >= min_shared]
    if len(cand) < 2:
        return None
    dev = req_to_token.device
    firsts = req_to_token[torch.tensor([req_rows[i] for i in cand], device=dev), 0].tolist()
    buckets: dict[int, list[int]] = {}
    for i, f in zip(cand, firsts):
        buckets.setdefault(f, []).append(i)
    groups: list[tuple[list[int], int]] = []
    def runs(members: list[int], lead: int) -> list[int]:
        """Per member: how many leading slots it shares with members[lead] (within both shareables)."""
        lim = shareable[members[lead]]
        rows = req_to_token[torch.tensor([req_rows[i] for i in members], device=dev), :lim]  # [m, lim]
        own = torch.tensor([shareable[i] for i in members], device=dev)
        valid = torch.arange(lim, device=dev)[None, :] < own[:, None]
        return ((rows == rows[lead]) & valid).to(torch.int32).cumprod(1).sum(1).tolist()

    def best(common: list[int]) -> tuple[int, list[int], int]:
        """The k longest runs with P = the k-th longest, k saving the most reads: (saving, order, k)."""
        order = sorted(range(len(common)), key=lambda j: -common[j])
        k = max(range(2, len(common) + 1), key=lambda n: (n - 1) * common[order[n - 1]])
        return (k - 1) * common[order[k - 1]], order, k

    for members in buckets.values():
        while len(members) >= 2:
            # lead with the first member, then with the one sharing most with it (the first may be a
            # stray that shares little with the rest); keep the better grouping
            first = runs(members, 0)
            other = runs(members, max(range(1, len(members)), key=lambda j: first[j]))
            (_, order, k), c = max(((best(r), r) for r in (first, other)), key=lambda x: x[0][0])
            p = c[order[k - 1]]
            if p < min_shared:
                members = members[1:]
                continue
            groups.append(([members[j] for j in order[:k]], p))
            members = [members[j] for j in order[k:]]
    if not groups:
        return None
    k_begin = [0] * len(shareable)
    q_index: list[int] = []
    starts = [0]
    for members, p in groups:
        for i in members:
            k_begin[i] = p
            q_index.extend(range(token_starts[i], token_starts[i] + token_counts[i]))
        starts.append(len(q_index))

    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int64, device=dev)

    return CascadePlan(t([req_rows[m[0]] for m, _ in groups]), t([p for _, p in groups]), t(q_index), t(starts),
                       t([b - a for a, b in zip(starts, starts[1:])]), t(k_begin),
                       max(b - a for a, b in zip(starts, starts[1:])), max(p for _, p in groups))
