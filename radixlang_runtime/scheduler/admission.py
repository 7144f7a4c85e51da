"""Prefill admission (torch-free): which waiting requests (and which chunk of a long prompt) the next prefill
batch runs. Owned by the Scheduler (self.admission); the queues stay the Scheduler's, each call gets them and
returns what changed (PrefillPlan).

Order: waiting requests are sorted by the policy (policy.order_waiting), each first gets its cached prefix
(locked); PrefillAdder's budgets (KV, input tokens, chunk, rows, running requests) decide; a refused
request gives its prefix back, and admission stops at the first request a budget refuses. A prompt
mid-way through chunked prefill continues first, after arrivals that fit whole in half a chunk (under priority
scheduling a waiting request that outranks it has sent it back to the queue before: preemption.yield_chunk_for_head).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.scheduler.batch import ScheduleBatch
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.policy import AddResult, Admission, PrefillAdder, decode_reservation, order_waiting, \
    prefill_target_len
from radixlang_runtime.scheduler.request import Req

if TYPE_CHECKING:
    from radixlang_runtime.scheduler.scheduler import SchedulerConfig

# A waiting request that shares at least this many uncached tokens with one admitted in the same
# round waits a round: the other computes them once and this one then hits the cache (SGLang's
# in-batch prefix caching check). With pages (CPU: 16 tokens) the gain is whole pages, and one page is enough
# (_worth_waiting): a burst of few-shot programs shares the prompt's partial last page + the question's start.
IN_BATCH_SHARE_THRESHOLD = 32


@dataclass
class PrefillPlan:
    batch: Optional[ScheduleBatch]  # None: nothing admitted
    waiting: list[Req]  # the waiting queue after this round (reordered by the policy, admitted ones removed)
    chunked_req: Optional[Req]  # the prompt mid-way through chunked prefill after this batch
    failed: list[Req] = field(default_factory=list)  # ended here (their LoRA adapter could not be read again)


class PrefillAdmission:
    def __init__(self, cfg: "SchedulerConfig", kv: KVManager):
        self.cfg = cfg
        self.kv = kv
        self.prefill_tokens_computed = 0  # extend tokens run through the model
        self.prefill_tokens_cached = 0  # prompt tokens served by the radix cache instead
        # a retracted request's readmission: of the K/V it had (all but its last token), tokens still in
        # L1 (kept), loaded from the hicache tiers (swapped: retract_decode swapped them out) or recomputed
        self.readmit_tokens = {"kept": 0, "swapped": 0, "recomputed": 0}
        self.last_stop_reason: Optional[str] = None  # why the last prefill admission stopped (PrefillAdder)
        self._loras: set[int] = set()  # during plan(): the distinct LoRA adapters of the running + admitted
        # --max-loaded-loras: (adapter id, adapters in use) -> whether it is resident now (read again if it was
        # evicted; False: no room, the request waits; ValueError: it cannot be read). None: all are resident.
        self.lora_residency: Optional[Callable[[int, set[int]], bool]] = None
        self._failed: list[Req] = []

    def plan(self, waiting: list[Req], running: list[Req], chunked_req: Optional[Req],
             new_token_ratio: float) -> PrefillPlan:
        cfg, kv = self.cfg, self.kv
        adder = PrefillAdder(
            page_size=cfg.page_size,
            rem_total_tokens=kv.available_size() - sum(decode_reservation(r, new_token_ratio) for r in running),
            rem_input_tokens=cfg.max_prefill_tokens,
            rem_chunk_tokens=cfg.chunked_prefill_size,
            rem_rows=kv.table.available,
            rem_running=cfg.max_running_requests - len(running) - (1 if chunked_req else 0),
            new_token_ratio=new_token_ratio,
            running_empty=not running,
        )
        if cfg.enable_mixed_chunk:
            adder.rem_input_tokens -= len(running)  # their decode tokens share the forward pass
        # LoRA adapters already in the running batch (max_loras_per_batch bounds the distinct ones)
        self._loras = {r.lora_id for r in [*running, *([chunked_req] if chunked_req else [])] if r.lora_id}
        if waiting:  # once per attempt: cache-aware policies re-match every waiting request
            waiting = order_waiting(waiting, cfg.schedule_policy, kv.radix, cfg.priority)
        proceed = True
        if chunked_req is not None:
            if waiting and cfg.chunked_prefill_size > 0:
                # Arrivals that fit whole in half a chunk go first, so a long prompt's chunks do not hold
                # back short requests; the chunk shrinks by what they take (the step stays one chunk).
                budget, adder.whole_only = adder.rem_input_tokens, True
                adder.rem_input_tokens = min(budget, cfg.chunked_prefill_size // 2)
                self._admit_waiting(adder, waiting)
                used = sum(a.extend_len for a in adder.admitted)
                adder.rem_input_tokens, adder.whole_only = budget - used, False
                adder.rem_chunk_tokens = cfg.chunked_prefill_size - used
            # then the chunked request; others may follow its last chunk
            proceed = adder.add_one(chunked_req, holds_row=True) == AddResult.CONTINUE
        if proceed and waiting:
            self._admit_waiting(adder, waiting)
        self.last_stop_reason = adder.stop_reason
        failed, self._failed = self._failed, []
        if failed:
            waiting = [r for r in waiting if all(r is not f for f in failed)]
        if not adder.admitted:
            return PrefillPlan(None, waiting, chunked_req, failed)
        admitted_ids = {id(a.req) for a in adder.admitted}
        waiting = [r for r in waiting if id(r) not in admitted_ids]

        reqs, prefix_lens, extend_ids, out_locs, sample = [], [], [], [], []
        for a in adder.admitted:
            req = a.req
            kv.assign_row(req)
            start = req.kv_len
            slots = kv.alloc(req, a.extend_len)
            reqs.append(req)
            prefix_lens.append(start)
            extend_ids.append(req.fill_ids[start:start + a.extend_len])
            out_locs.append(slots)
            # A retracted request (it has outputs) resumes decoding without drawing a token here.
            sample.append(a.is_last_chunk and not req.output_ids and req.sampling.max_new_tokens > 0)
            if not a.is_last_chunk:
                chunked_req = req
            elif req is chunked_req:  # its last chunk (it may also sit out a step: then it stays)
                chunked_req = None
            self.prefill_tokens_computed += a.extend_len
        batch = ScheduleBatch("extend", reqs, prefix_lens, extend_ids, out_locs, sample,
                              rewrite_rows=take_dirty_rows(reqs))
        return PrefillPlan(batch, waiting, chunked_req, failed)

    def _lora_ready(self, req: Req) -> bool:
        """Whether req's adapter may run in this batch: max_loras_per_batch, then --max-loaded-loras (its
        weights resident, read again if evicted). One that cannot be read ends the request (400 naming it)."""
        if not req.lora_id or req.lora_id in self._loras:
            return True
        if len(self._loras) >= self.cfg.max_loras_per_batch:
            return False  # its adapter waits until one of the batch's adapters has no request left
        if self.lora_residency is None:
            return True
        try:
            return self.lora_residency(req.lora_id, self._loras)
        except ValueError as e:
            req.error, req.error_status = str(e), 400
            req.finish({"type": "abort", "message": req.error})
            self._failed.append(req)
            return False

    def _worth_waiting(self, shared: int, cached: int) -> bool:
        """Whether a request that shares `shared` prompt tokens with one admitted this round (it has `cached`
        of them from the cache) should wait a round: the cache then gives it the shared part in whole pages,
        so the gain is page-aligned; one page of gain is enough when a page is IN_BATCH_SHARE_THRESHOLD
        tokens or fewer (a page of 16 shared tokens, e.g. a few-shot prompt's tail, is then worth a round)."""
        page = self.cfg.page_size
        gain = shared // page * page - cached
        return gain >= min(IN_BATCH_SHARE_THRESHOLD, page) if page > 1 else gain >= IN_BATCH_SHARE_THRESHOLD

    def _admit_waiting(self, adder: PrefillAdder, waiting: list[Req]) -> None:
        """Offer waiting requests to the adder in order: each first gets its cached prefix (locked);
        one that is refused gives it back. Admission stops at the first request a budget refuses."""
        kv = self.kv
        batch_tree = RadixCache(1) if kv.radix.shares else None  # prompts admitted this round
        already = {id(a.req) for a in adder.admitted}
        for req in waiting:
            if id(req) in already or req.finished:
                continue
            if not self._lora_ready(req):
                continue
            target = prefill_target_len(req)
            adder.rem_total_tokens -= (locked := kv.match(req, target))
            if batch_tree is not None:
                ids = req.cache_ids[:target]
                shared = batch_tree.match_prefix(ids)
                # a request returning hidden states computes its whole prompt: waiting gains it nothing
                if self._worth_waiting(shared.length, req.kv_len) and not req.return_hidden_states:
                    kv.unmatch(req)
                    adder.rem_total_tokens += locked
                    if kv.states is not None and self._split_sharer(adder, shared.slots[-1], shared.length):
                        break  # the sharer now ends a chunk: a round ends with its chunked request
                    continue
            res = adder.add_one(req, holds_row=False)
            if adder.admitted and adder.admitted[-1].req is req:
                if req.output_ids:  # a retracted request keeps its first figures
                    self._note_readmission(req, target)
                elif not req.num_retractions:  # first admission (not a prompt that yielded mid-way: preemption.py)
                    req.cached_len = req.kv_len
                    req.admitted_at = time.perf_counter()
                self.prefill_tokens_cached += req.kv_len
                if req.lora_id:
                    self._loras.add(req.lora_id)
                if batch_tree is not None:  # the values: which admission holds the prompt
                    batch_tree.insert(ids, [len(adder.admitted) - 1] * len(ids))
            else:
                kv.unmatch(req)
                adder.rem_total_tokens += locked
            if res != AddResult.CONTINUE:
                break

    def _split_sharer(self, adder: PrefillAdder, index: int, shared: int) -> bool:
        """Hybrid models: a waiting prompt shares `shared` tokens with admission `index` of this round, which
        holds no state snapshot there. When that admission is the round's last and runs past the shared
        prefix's last page boundary, it ends its chunk there (its state is saved at the chunk's end:
        state_cache.py), so the waiting prompt continues from it next round. Whether it was shortened."""
        a = adder.admitted[index]
        split = shared // self.cfg.page_size * self.cfg.page_size
        if index != len(adder.admitted) - 1 or not a.req.kv_len < split < a.req.kv_len + a.extend_len:
            return False
        if a.is_last_chunk and split >= prefill_target_len(a.req) // self.cfg.page_size * self.cfg.page_size:
            return False
        adder.admitted[index] = Admission(a.req, split - a.req.kv_len, False)
        a.req.state_split = split
        return True

    def _note_readmission(self, req: Req, target: int) -> None:
        """A retracted request had K/V for target (= seq_len - 1) positions; kv_len of them it has now."""
        self.readmit_tokens["kept"] += req.kv_len - req.tier_len
        self.readmit_tokens["swapped"] += req.tier_len
        self.readmit_tokens["recomputed"] += target - req.kv_len


def take_dirty_rows(reqs: list[Req]) -> list[int]:
    """Indices of the requests whose table row must be rewritten before the step (row_dirty cleared)."""
    dirty = [i for i, r in enumerate(reqs) if r.row_dirty]
    for i in dirty:
        reqs[i].row_dirty = False
    return dirty
