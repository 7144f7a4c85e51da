"""Prefill admission (torch-free): which waiting requests join the next prefill batch.

PrefillAdder admits requests in queue order while every budget holds:
- rem_total_tokens: free KV slots minus what running requests are expected to still decode
  (remaining new tokens x new_token_ratio, clipped), so admitting a request does not starve them;
- rem_input_tokens: prefill tokens per batch (--max-prefill-tokens);
- rem_chunk_tokens: the most one request may prefill in one step (--chunked-prefill-size); a longer
  prompt is truncated to a chunk and continues next step (at most one chunked request at a time);
- free request-table rows and --max-running-requests.
order_waiting sorts the queue first (--schedule-policy; under --enable-priority-scheduling, by
preemption.PriorityRule.rank before the policy's order).
"""

from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Union

from radixlang_runtime.mem.allocator import slots_spanned
from radixlang_runtime.mem.null_cache import NullPrefixCache
from radixlang_runtime.mem.radix_cache import RadixCache, TreeNode
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.scheduling_args import SCHEDULE_POLICIES

if TYPE_CHECKING:
    from radixlang_runtime.scheduler.preemption import PriorityRule

CLIP_MAX_NEW_TOKENS = 4096  # a request's decode reservation never counts more than this
LPM_MAX_QUEUE = 128  # past this many waiting requests, cache-aware ordering costs more than it saves: fcfs


class AddResult(enum.Enum):
    CONTINUE = "continue"  # admitted; try the next one
    NO_TOKEN = "no_token"  # out of KV or input budget: stop this round
    OTHER = "other"  # out of rows / request slots: stop this round


def decode_reservation(req: Req, new_token_ratio: float) -> int:
    return int(min(req.remaining_new_tokens, CLIP_MAX_NEW_TOKENS) * new_token_ratio)


def prefill_target_len(req: Req) -> int:
    """Positions that must be in the KV pool before the request can decode.

    A fresh request prefills its prompt and samples its first token. A retracted one already has
    outputs: it recomputes everything but its last token, which is its next decode input.
    """
    return req.seq_len - 1 if req.output_ids else req.seq_len


def order_waiting(waiting: list[Req], policy: str, radix: Union[RadixCache, NullPrefixCache],
                  priority: Optional[PriorityRule] = None) -> list[Req]:
    """The queue in the order admission tries it: by priority first when a rule is given (a stable sort, so
    the policy's order holds among equals), then the policy's."""
    ordered = _policy_order(waiting, policy, radix)
    return sorted(ordered, key=priority.rank) if priority is not None else ordered


def _policy_order(waiting: list[Req], policy: str, radix: Union[RadixCache, NullPrefixCache]) -> list[Req]:
    """The queue in the policy's order.

    fcfs: arrival order. lpm: longest cached prefix first (stable, so ties stay fcfs); shared
    prefixes are then reused before LRU eviction can take them. dfs-weight: requests grouped by the
    cache node their prefix ends at, visiting heavier subtrees (more waiting requests) first and a
    node's subtree before the requests ending at the node, so a shared subtree is prefilled together.
    Cache-aware policies fall back to fcfs without a cache or past LPM_MAX_QUEUE waiting requests.
    Retracted requests (they hold outputs) stay in front.
    """
    if policy == "fcfs" or not radix.shares or len(waiting) > LPM_MAX_QUEUE:
        return waiting
    nodes: dict[int, TreeNode] = {}
    lens: dict[int, int] = {}
    for r in waiting:
        m = radix.match_prefix(r.cache_ids[: prefill_target_len(r) - 1])
        nodes[id(r)], lens[id(r)] = m.last_node, m.length
    if policy == "lpm":
        ordered = sorted(waiting, key=lambda r: -lens[id(r)])
    elif policy == "dfs-weight":
        ordered = _dfs_weight(waiting, nodes, radix.root)
    else:
        raise ValueError(f"unknown schedule policy {policy!r}; expected one of {SCHEDULE_POLICIES}")
    retracted = [r for r in waiting if r.output_ids]
    return retracted + [r for r in ordered if not r.output_ids]


def _dfs_weight(waiting: list[Req], nodes: dict[int, TreeNode], root: TreeNode) -> list[Req]:
    at_node: dict[int, list[Req]] = defaultdict(list)
    weight: dict[int, int] = defaultdict(int)
    for r in waiting:
        node: Optional[TreeNode] = nodes[id(r)]
        at_node[id(node)].append(r)
        while node is not None:
            weight[id(node)] += 1
            node = node.parent
    out: list[Req] = []
    stack: list[tuple[TreeNode, bool]] = [(root, False)]
    while stack:  # post-order, as SGLang: a subtree's requests before the requests ending at its root
        node, expanded = stack.pop()
        if expanded:
            out.extend(at_node.get(id(node), ()))
            continue
        stack.append((node, True))
        kids = sorted((c for c in node.children.values() if weight[id(c)]), key=lambda c: weight[id(c)])
        stack.extend((c, False) for c in kids)  # heaviest last: popped first
    return out


@dataclass
class Admission:
    req: Req
    extend_len: int
    is_last_chunk: bool


@dataclass
class PrefillAdder:
    page_size: int
    rem_total_tokens: int
    rem_input_tokens: int
    rem_chunk_tokens: int  # -1: no chunking
    rem_rows: int
    rem_running: int
    new_token_ratio: float
    running_empty: bool  # nothing decoding: admit the first request even if its reservation won't fit
    admitted: list[Admission] = field(default_factory=list)
    whole_only: bool = False  # refuse a request that would have to be cut into chunks
    # Why admission stopped: "rows" | "max_running" | "input_tokens" | "kv_tokens" | "chunked" (a request
    # was cut to a chunk: nothing may follow it) | None (the queue ran out first).
    stop_reason: Optional[str] = None

    def _stop(self, reason: str, result: AddResult) -> AddResult:
        self.stop_reason = reason
        return result

    def add_one(self, req: Req, holds_row: bool) -> AddResult:
        if not holds_row and self.rem_rows <= 0:
            return self._stop("rows", AddResult.OTHER)
        if not holds_row and self.rem_running <= 0:
            return self._stop("max_running", AddResult.OTHER)
        remaining = prefill_target_len(req) - req.kv_len
        extend = remaining
        if self.rem_chunk_tokens != -1:
            extend = min(extend, self.rem_chunk_tokens)
        extend = min(extend, self.rem_input_tokens)
        if req.state_split > req.kv_len:  # hybrid: the chunk ends where a snapshot is wanted (state_cache.py)
            extend = min(extend, req.state_split - req.kv_len)
        if extend <= 0:
            return self._stop("input_tokens", AddResult.NO_TOKEN)
        is_last = extend == remaining
        if self.whole_only and not is_last:
            return self._stop("input_tokens", AddResult.NO_TOKEN)
        need_now = slots_spanned(req.kv_len, extend, self.page_size)
        need = need_now + (decode_reservation(req, self.new_token_ratio) if is_last else 0)
        if need > self.rem_total_tokens:
            # Progress guarantee: with nothing decoding, the head request runs if its prefill fits;
            # retract_decode handles the rest should its decode run out of memory later.
            if not (self.running_empty and not self.admitted and need_now <= self.rem_total_tokens):
                return self._stop("kv_tokens", AddResult.NO_TOKEN)
            need = need_now
        self.rem_total_tokens -= need
        self.rem_input_tokens -= extend
        if not holds_row:
            self.rem_rows -= 1
            self.rem_running -= 1
        self.admitted.append(Admission(req, extend, is_last))
        return AddResult.CONTINUE if is_last else self._stop("chunked", AddResult.OTHER)
