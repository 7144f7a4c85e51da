"""A request as the scheduler sees it (torch-free).

Lengths (mini-sglang's vocabulary):
- fill_ids = input_ids + output_ids: every token the request has seen.
- kv_len = len(kv_indices): positions 0..kv_len-1 have K/V in the pool.
- While decoding, kv_len == len(fill_ids) - 1: the last sampled token is the next decode input.
- extend_len: tokens a prefill step adds (fill_ids[kv_len : kv_len + extend_len]).
- tree_len: kv_indices[:tree_len] belong to the radix cache (locked through last_node, page-aligned);
  kv_indices[tree_len:] are the request's own slots. cached_len <= tree_len.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from radixlang_runtime.pooling import PooledSum
from radixlang_runtime.protocol.bootstrap_peers import Bootstrap
from radixlang_runtime.mem.cache_namespace import namespaced, salt_key
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.scheduler.reasoning_watch import WatchTracker


@dataclass
class Req:
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    # --- memory ---
    table_idx: int = -1  # row in req_to_token, -1 when not holding one
    kv_indices: list[int] = field(default_factory=list)  # slot of each position with K/V stored
    cached_len: int = 0  # prompt tokens served from the prefix cache at first admission (cached_tokens)
    tree_len: int = 0  # leading kv_indices owned by the radix cache
    last_node: Any = None  # the radix node locked for kv_indices[:tree_len] (None: nothing locked)
    row_dirty: bool = False  # kv_indices[:kv_len] changed in place: the runner rewrites the table row
    tier_len: int = 0  # of the prefix the last `match` gave, tokens the hicache tiers loaded (the rest: L1)
    # hybrid models (scheduler/state_cache.py): the snapshot slot a match copies into the request's state at its
    # next step (None: nothing to load), and the (snapshot slot, position) its running step saves the state to;
    # state_split: a page boundary where its prompt leaves a cached path (or another prompt of its round): its
    # prefill ends a chunk there so that the state at the shared prefix's end is saved (0: none)
    state_load: Optional[int] = None
    pending_state: Optional[tuple[int, int]] = None
    state_split: int = 0
    # --- logprobs (return_logprob): raw log_softmax of the model's logits, before any sampling transform ---
    return_logprob: bool = False
    logprob_start_len: int = 0  # first logit position whose next-token logprob is returned (< len(input_ids))
    top_logprobs_num: int = 0
    input_logprobs: list[float] = field(default_factory=list)  # of tokens logprob_start_len+1 .. L-1
    input_top_logprobs: list[list[list]] = field(default_factory=list)  # per position: [[logprob, id], ...]
    input_ranks: list[int] = field(default_factory=list)  # the prompt tokens' ranks (as input_logprobs)
    output_logprobs: list[float] = field(default_factory=list)  # one per output token
    output_top_logprobs: list[list[list]] = field(default_factory=list)
    # --- return_hidden_states (scheduler/hidden_states.py): the final norm's output per position, from 0 ---
    return_hidden_states: bool = False
    hidden_rows: list[list[float]] = field(default_factory=list)  # row p: the hidden state at position p
    # --- constrained decoding (scheduler/grammar_queue.py) ---
    grammar: Any = None  # GrammarState once the grammar compiled; its position matches output_ids
    grammar_handle: Any = None  # GrammarHandle while the grammar compiles
    forced_tokens: int = 0  # output tokens jump-forward supplied (verified drafts)
    draft: list[int] = field(default_factory=list)  # jump-forward tokens to verify in the next step
    draft_states: list[Any] = field(default_factory=list)  # GrammarState before each draft token, then after all
    mask_pending: bool = False  # its next mask still computes: it sits out decode steps (scheduler/mask_gate.py)
    forward_passes: int = 0  # forward steps this request took part in
    # overlap schedule (scheduler/overlap.py): (step serial, k) while its newest sampled token is the k-th of a
    # step in flight whose result the scheduler has not applied yet (its next input is that step's output)
    future: Optional[tuple[int, int]] = None
    # --- n-gram speculation (speculative/drafter.py; req.draft holds its draft, draft_states stays empty) ---
    spec_index: Any = None  # NgramIndex, built at the first draft
    spec_draft_tokens: int = 0  # n-gram draft tokens verified so far (meta_info.spec_draft_tokens)
    spec_accepted_tokens: int = 0  # of which the model agreed with (meta_info.spec_accepted_tokens)
    spec_idle: int = 0  # steps Drafts._may_pay skipped the lookup (its last match could not pay)
    spec_match: int = 0  # how many tokens the current n-gram draft's source matched (drafter.MatchAgreement)
    spec_values: list[float] = field(default_factory=list)  # P(draft[:j + 1] all taken), for drafter.trim_to_cost
    spec_from_corpus: bool = False  # the current n-gram draft came from the radix tree (drafter.corpus)
    # --- pooling (pooling.py): a prefill-only request whose result is a pooled vector, not tokens ---
    pooled: Optional[PooledSum] = None  # its PoolSpec and the sum so far (mean: over the chunks)
    # --- state ---
    finished_reason: Optional[dict[str, Any]] = None
    error: Optional[str] = None  # set when a fault or a bad grammar ended the request (finished_reason: abort)
    error_status: int = 500  # 400: the request's own fault (its grammar), 500: internal
    stop_from_end: int = 0  # a stop string ended it: where that occurrence starts, in chars from the text's end
    num_retractions: int = 0
    bootstrap: Optional[Bootstrap] = None  # PD: the prefill's socket and the room, from the router's fields
    lora_id: int = 0  # the LoRA adapter it runs (0: the base model); its radix keys: cache_ids
    cache_salt: Optional[str] = None  # its prefix cache namespace besides the adapter (None: the shared one)
    salt_key: int = field(default=0, init=False)  # cache_salt's number (mem/cache_namespace.salt_key)
    priority: int = 0  # --enable-priority-scheduling: its rank in the waiting queue (preemption.PriorityRule)
    images: list = field(default_factory=list)  # its ImageInputs (input_ids: their pad ids at their positions)
    # the reasoning watch (scheduler/reasoning_watch.py: a thinking budget, a grammar held until the reasoning
    # ends; None: nothing watched), and the compiled grammar while it is held (req.grammar is None then)
    watch: Optional[WatchTracker] = None
    grammar_held: Any = None
    # --- timing ---
    created_at: float = field(default_factory=time.perf_counter)
    admitted_at: Optional[float] = None  # first admission to a prefill batch
    first_token_at: Optional[float] = None
    finished_at: Optional[float] = None

    def __post_init__(self) -> None:
        self.salt_key = salt_key(self.cache_salt)  # mem/cache_namespace.py
        if self.sampling.reasoning_watch is not None and self.watch is None:
            self.watch = WatchTracker(self.sampling.reasoning_watch)

    @property
    def watch_active(self) -> bool:
        """Its reasoning watch may still force a token or move its grammar: that depends on the token before."""
        return self.watch is not None and self.watch.active

    @property
    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def cache_ids(self) -> list[int]:
        """fill_ids as the radix cache keys them: under a LoRA adapter or a cache_salt every id is moved into
        that namespace's range (mem/cache_namespace.py), so its prefixes never match the base's, another
        adapter's or another salt's."""
        return namespaced(self.fill_ids, self.lora_id, self.salt_key)

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def kv_len(self) -> int:
        return len(self.kv_indices)

    @property
    def wants_input_logprobs(self) -> bool:
        """Prompt positions >= logprob_start_len must be computed, not served from the cache (a
        retracted request has them already)."""
        return self.return_logprob and not self.output_ids

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def remaining_new_tokens(self) -> int:
        return max(self.sampling.max_new_tokens - len(self.output_ids), 0)

    def finish(self, reason: dict[str, Any]) -> None:
        self.finished_reason = reason
        self.finished_at = time.perf_counter()


def future_token(k: int) -> int:
    """The placeholder id of the k-th sampled token of the step in flight (token ids are >= 0); the forward
    thread puts the real id in before the next step runs (scheduler/forward_thread.py)."""
    return -1 - k


def pending_len(req: Req) -> int:
    """Tokens of its output a running request still has to run (its last sampled token, or the one a step in
    flight samples; more after a retraction kept its output), not counting a jump-forward draft (req.draft)."""
    return len(req.input_ids) + len(req.output_ids) + (req.future is not None) - req.kv_len


def pending_ids(req: Req) -> list[int]:
    """Those tokens; a token a step in flight samples is its placeholder (future_token)."""
    n = pending_len(req)  # n <= len(output_ids) + 1: a running request has sampled at least once
    if req.future is None:
        return req.output_ids[-n:]
    return req.output_ids[len(req.output_ids) - n + 1:] + [future_token(req.future[1])]
