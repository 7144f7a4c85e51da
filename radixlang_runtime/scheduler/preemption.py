"""Which request gives up its place (torch-free): the Scheduler's retractions and refusals, as functions over it.

- retract_decode (ensure_decode_memory): while the next decode step's slots do not fit, the running request with
  the most tokens still to decode (ties: the newest, as SGLang) goes back to the front of the waiting queue.
- Priority scheduling (--enable-priority-scheduling, PriorityRule): when a budget that running requests hold
  refused the head of the queue, the running request it outranks most by more than the threshold is retracted
  (preempt_for_head). A prompt mid-way through chunked prefill that a waiting request outranks (by rank alone, as
  the queue orders them) goes back to the queue before the next prefill, so priority decides who gets the next
  prefill budget (yield_chunk_for_head).
- --max-queued-requests (room_in_queue): a full queue refuses a new request with HTTP 503, or under priority
  scheduling drops its lowest-ranked waiting request for one that outranks it.

A retracted request keeps its output ids; its K/V goes into the radix cache (and, with the hierarchical cache, its
whole records are swapped out to the tiers); on readmission what L1 still holds is reused, what the tiers hold is
loaded, the rest recomputed (admission counts each: readmit_tokens), so its greedy output is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixlang_runtime.pooling import PooledSum
from radixlang_runtime.scheduler.request import Req, pending_len

if TYPE_CHECKING:
    from radixlang_runtime.scheduler.scheduler import Scheduler

REFUSING_BUDGETS = ("kv_tokens", "rows", "max_running")  # PrefillAdder stop reasons that running requests cause


@dataclass(frozen=True)
class PriorityRule:
    """--enable-priority-scheduling (SGLang's flags): a request's `priority` ranks it in the waiting queue, higher
    values first (low_values_first: lower first, vLLM's order); a waiting request whose priority exceeds a running
    one's by more than preemption_threshold may retract it (preempt_for_head)."""

    low_values_first: bool = False
    preemption_threshold: int = 10

    def rank(self, req: Req) -> int:
        """Smaller runs first."""
        return req.priority if self.low_values_first else -req.priority

    def may_preempt(self, waiting: Req, running: Req) -> bool:
        return self.rank(running) - self.rank(waiting) > self.preemption_threshold


def retract(s: "Scheduler", victim: Req) -> None:
    """A running request (or the prompt mid-way through chunked prefill) back to the front of the waiting queue, its
    outputs kept and its K/V given to the radix cache (and, with the tiers, swapped out)."""
    if victim is s.chunked_req:
        s.chunked_req = None
    else:
        s.running.remove(victim)
    s.drafts.drop_ngram([victim])
    s.kv.swap_out(victim)
    s._release(victim)
    victim.num_retractions += 1
    s.num_retracted_total += 1
    s.waiting.insert(0, victim)


def ensure_decode_memory(s: "Scheduler") -> None:
    """retract_decode: while the next step's slots don't fit, send requests back to waiting (speculation never
    costs a retraction: drafts go first)."""
    def need() -> int:
        return sum(s.allocator.slots_needed(r.kv_len, pending_len(r) + len(r.draft)) for r in s.running)

    if need() <= s.kv.available_size():
        return
    s.drafts.drop_ngram(s.running)
    if s.overlap is not None:  # the step in flight applied first (it may finish requests)
        s.overlap.drain()
    retracted = False
    while s.running and need() > s.kv.available_size():
        if len(s.running) == 1:
            raise RuntimeError("KV pool too small to decode a single request; raise --max-total-tokens")
        retract(s, max(s.running, key=lambda r: (r.remaining_new_tokens, r.created_at)))
        retracted = True
    if retracted:
        s.new_token_ratio = s.cfg.new_token_ratio_init


def preempt_for_head(s: "Scheduler") -> bool:
    """Priority scheduling, after an admission round that admitted nothing: when a budget running requests hold
    refused the head of the queue, retract the running request it outranks most (lowest rank, then the most tokens
    left, then the newest). Whether one was retracted (at most one per call, so the caller's loop ends)."""
    rule = s.cfg.priority
    if rule is None or not s.waiting or not s.running or s.admission.last_stop_reason not in REFUSING_BUDGETS:
        return False
    head = next((r for r in s.waiting if not r.finished), None)
    if head is None or not any(rule.may_preempt(head, r) for r in s.running):
        return False
    if s.overlap is not None:  # the step in flight applied first (it may finish requests)
        s.overlap.drain()
    victims = [r for r in s.running if rule.may_preempt(head, r)]
    if not victims:
        return False
    retract(s, max(victims, key=lambda r: (rule.rank(r), r.remaining_new_tokens, r.created_at)))
    s.num_preempted_total += 1
    return True


def yield_chunk_for_head(s: "Scheduler") -> bool:
    """Priority scheduling, before a prefill admission: the prompt mid-way through chunked prefill gives up its place
    when a waiting request outranks it. Rank alone decides, as between waiting requests (the preemption threshold
    guards decoding requests; this one has no token yet). Its computed pages go into the radix cache (retract), it
    queues by its rank and resumes from the prefix the cache still holds then. Whether it yielded."""
    rule, req = s.cfg.priority, s.chunked_req
    if rule is None or req is None or not any(rule.rank(w) < rule.rank(req) and _adapter_fits(s, w)
                                              for w in s.waiting if not w.finished):
        return False
    if s.overlap is not None:  # the step in flight applied first (it may hold the prompt's last chunk)
        s.overlap.drain()
        if s.chunked_req is not req:
            return False
    forget_prompt_results(req)
    retract(s, req)
    s.num_preempted_total += 1
    return True


def _adapter_fits(s: "Scheduler", w: Req) -> bool:
    """Whether w's LoRA adapter leaves it admissible next to the running requests (max_loras_per_batch): one
    that must wait for an adapter slot would not take the chunk, and the prompt would yield every step."""
    active = {r.lora_id for r in s.running if r.lora_id}
    return not w.lora_id or w.lora_id in active or len(active) < s.cfg.max_loras_per_batch


def forget_prompt_results(req: Req) -> None:
    """What a prompt's chunks returned that its readmission computes again: input logprobs (kv_manager.match stops
    at logprob_start_len, so every position they cover runs again) and the pooled sum (mean and cls compute the
    whole prompt again; last keeps only its final chunk's part)."""
    req.input_logprobs.clear()
    req.input_top_logprobs.clear()
    req.input_ranks.clear()
    if req.pooled is not None:
        req.pooled = PooledSum(req.pooled.spec)


def room_in_queue(s: "Scheduler", req: Req) -> bool:
    """--max-queued-requests (SGLang's): with the queue (waiting and compiling requests) full, a new request is
    refused (HTTP 503), unless under priority scheduling it outranks a waiting one: then the lowest-ranked waiting
    request (the newest of those) is dropped for it (503 too). Whether req may queue."""
    cap = s.cfg.max_queued_requests
    pending = s.grammar.pending if s.grammar is not None else []
    if cap is None or len(s.waiting) + len(pending) < cap:
        return True
    rule = s.cfg.priority
    lowest = max(s.waiting, key=lambda r: (rule.rank(r), r.created_at)) if rule is not None and s.waiting else None
    if lowest is not None and rule.rank(req) < rule.rank(lowest):
        s.waiting.remove(lowest)
        _refuse(s, lowest, f"dropped from the full waiting queue (--max-queued-requests {cap}) for a request of "
                           "higher priority")
        return True
    _refuse(s, req, f"the waiting queue is full (--max-queued-requests {cap}); retry later")
    return False


def _refuse(s: "Scheduler", req: Req, message: str) -> None:
    """End a request that holds nothing (queued, not running) with HTTP 503; the scheduler's next step reports it."""
    req.error, req.error_status = message, 503
    req.finish({"type": "abort", "message": message})
    s._failed_at_admission.append(req)
