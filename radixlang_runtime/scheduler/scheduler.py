"""The scheduler core (torch-free): continuous batching, prefill first, over a shared prefix cache.

Each `step()`: drop aborted requests -> form a batch (a prefill batch if one can be admitted,
otherwise one decode step over every running request) -> `runner.forward(batch.model_batch())` -> apply
its StepResult: append sampled (and accepted draft) tokens, finish requests, hand their KV to the radix
cache. The runner is anything with `forward(ModelBatch) -> StepResult` (model/executor/step_io.py: one token per
request with a SampleSpec), so tests drive this class with a fake runner and no torch. Slot ownership
lives in KVManager, drafts (n-gram, jump-forward) in Drafts, retractions and a full queue's refusals in
preemption.py. With prefill-decode disaggregation a
DisaggRole (disagg/prefill.py or disagg/decode.py, set as `self.pd` by the wiring) holds the requests
between the two servers: the hooks below hand them over and take them back.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

from radixlang_runtime.constrained.step_guard import GrammarBudgetExceeded
from radixlang_runtime.utils.faults import FatalFault
from radixlang_runtime.model.executor.step_io import ModelBatch, StepResult
from radixlang_runtime.scheduler.admission import PrefillAdmission, take_dirty_rows
from radixlang_runtime.scheduler.batch import ScheduleBatch
from radixlang_runtime.scheduler.disagg_role import DisaggRole
from radixlang_runtime.speculative.drafter import NgramDrafter
from radixlang_runtime.speculative.drafts import Drafts
from radixlang_runtime.scheduler.grammar_queue import GrammarQueue
from radixlang_runtime.scheduler.hidden_states import keep_hidden
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.overlap import OverlapSchedule
from radixlang_runtime.scheduler.preemption import PriorityRule, ensure_decode_memory, preempt_for_head, \
    room_in_queue, yield_chunk_for_head
from radixlang_runtime.scheduler.mask_gate import IDLE_MASK_WAIT_S, LATE_MASK_WAIT, MaskGate
from radixlang_runtime.scheduler.request import Req, pending_ids, pending_len
from radixlang_runtime.scheduler.stop_check import check_finished

logger = logging.getLogger(__name__)


class Runner(Protocol):
    def forward(self, batch: ModelBatch) -> StepResult: ...


@dataclass
class SchedulerConfig:
    page_size: int
    context_len: int
    max_running_requests: int
    max_prefill_tokens: int
    chunked_prefill_size: int  # -1: off
    eos_token_ids: tuple[int, ...]
    new_token_ratio_init: float = 0.7
    new_token_ratio_min: float = 0.1
    new_token_ratio_decay: float = 0.001
    schedule_policy: str = "fcfs"  # "lpm" | "fcfs" | "dfs-weight" (see policy.order_waiting)
    enable_mixed_chunk: bool = False  # decode steps ride along in prefill batches
    debug_check_integrity: bool = False
    max_loras_per_batch: int = 8  # distinct LoRA adapters among the running requests (the base not counted)
    priority: Optional[PriorityRule] = None  # --enable-priority-scheduling (None: off)
    max_queued_requests: Optional[int] = None  # --max-queued-requests: waiting + compiling requests (None: no cap)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, runner: Runner, kv: KVManager, detokenize: Callable[[list[int]], str],
                 grammar: Optional[GrammarQueue] = None, drafter: Optional[NgramDrafter] = None):
        self.cfg = cfg
        self.drafts = Drafts(drafter, grammar, self._check_finished)
        if isinstance(drafter, NgramDrafter) and drafter.corpus is None:
            drafter.corpus = kv.radix if kv.radix.shares else None  # NGRAM: cached text as a draft corpus
        self.grammar = grammar  # None: constrained requests are refused before they get here
        self.masks = MaskGate(grammar, self.drafts)  # constrained requests wait for their next mask there
        self.runner = runner
        self.kv = kv
        self.allocator = kv.allocator
        self.table = kv.table
        self.detokenize = detokenize
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked_req: Optional[Req] = None  # a prompt mid-way through chunked prefill
        self._to_abort: set[str] = set()
        self.new_token_ratio = cfg.new_token_ratio_init
        self.num_retracted_total = 0
        self.num_preempted_total = 0  # of those, for a waiting request of higher priority (preemption.py)
        self.forward_steps = 0
        self.admission = PrefillAdmission(cfg, kv)  # prefill batches; prefill_tokens_computed / _cached counts
        self._decode_owed = False  # a chunk just ran while requests were decoding: decode next
        # (phase, batch size, tokens) of recent steps, for debugging and tests of step order.
        self.recent_batches: deque[tuple[str, int, int]] = deque(maxlen=1024)
        self.pd: Optional[DisaggRole] = None  # prefill-decode disaggregation (wiring.make_disagg_role)
        self._failed_at_admission: list[Req] = []  # ended before running (adapter unreadable, queue full)
        self.overlap: Optional[OverlapSchedule] = None  # the overlap schedule (scheduler/overlap.py), when on

    # ------------------------------------------------------------------ intake
    def add_request(self, req: Req) -> None:
        if not room_in_queue(self, req):
            return
        if req.sampling.constrained and self.grammar is not None:
            self.grammar.add(req)  # joins `waiting` once its grammar compiled (step polls)
        else:
            self._enqueue([req])

    def _enqueue(self, reqs: list[Req]) -> None:
        """New requests (grammar ready) queue for prefill; on a decode server they wait for their K/V instead
        (the PD role takes them, or refuses a duplicate room: `add` False)."""
        if self.pd is not None:
            reqs = [req for req in reqs if self.pd.add(req)]
        self.waiting += reqs

    def drop_lora_if_unused(self, lora_id: int) -> bool:
        """Drop LoRA adapter lora_id's weights unless a request of it is queued, compiling or holds it."""
        pending = self.grammar.pending if self.grammar is not None else []
        if any(r.lora_id == lora_id for r in [*self.waiting, *pending, *self._lora_holders()]):
            return False
        self.runner.loras.drop(lora_id)
        return True

    def load_lora(self, name: str, path: str) -> int:
        """Serve another LoRA adapter (runner.load_lora); the running requests' adapters are never evicted for it."""
        return self.runner.load_lora(name, path, frozenset(self.loras_in_use()))

    def loras_in_use(self) -> set[int]:
        return {r.lora_id for r in self._lora_holders() if r.lora_id}

    def _lora_holders(self) -> list[Req]:
        """The requests whose adapter must stay loaded: running, the prompt mid-way through chunked prefill and (PD)
        those whose K/V is on its way (on a decode server they join the running batch when it arrives)."""
        held = self.pd.held_reqs() if self.pd is not None else []
        return [*self.running, *([self.chunked_req] if self.chunked_req else []), *held]

    def abort(self, rid: str) -> None:
        self._to_abort.add(rid)

    @property
    def is_idle(self) -> bool:
        return not (self.waiting or self.running or self.chunked_req or self.grammar_pending
                    or (self.pd is not None and self.pd.pending) or (self.overlap is not None and self.overlap.busy))

    @property
    def grammar_pending(self) -> bool:
        return self.grammar is not None and bool(self.grammar.pending)

    @property
    def only_grammar_pending(self) -> bool:
        """Nothing to run but requests whose grammar compiles: the loop may wait a little."""
        return self.grammar_pending and not (self.waiting or self.running or self.chunked_req)

    @property
    def only_background_pending(self) -> bool:
        """Nothing to run but grammar compiles or PD transfers: the loop may wait a little."""
        pd = self.pd is not None and self.pd.pending
        return (self.grammar_pending or pd) and not (self.waiting or self.running or self.chunked_req)

    # ------------------------------------------------------------------ the loop body
    def step(self) -> list[Req]:
        """One scheduling iteration (step_sync, or with the overlap schedule OverlapSchedule.step). Returns the
        requests that produced tokens or finished."""
        return self.step_sync() if self.overlap is None else self.overlap.step()

    def step_sync(self) -> list[Req]:
        """One scheduling iteration whose forward pass ends before it returns.

        A fault while running or finishing the batch (forward, sampling, logprobs, stop checks) ends
        exactly the batch's requests: each gets `error` set, an abort finish reason and its KV freed
        (not cached: the slots may hold garbage); requests outside the batch go on next step."""
        touched = self._process_aborts()
        gated = self.grammar is not None  # only constrained requests are held or wait for masks (mask_gate.py)
        if gated:
            if self.masks.held:
                self.masks.take_held()  # left over from a failed step (its requests ended)
            if self.grammar.pending:
                touched += self._poll_grammars()
        if self.pd is not None:
            touched += self._poll_disagg()
        late = [r for r in self.running if r.mask_pending] if gated else None
        if late:  # masks that finished since: those requests rejoin this step
            touched += self._settle_masks(late, time.monotonic())
        batch = self.get_next_batch_to_run()
        touched, self._failed_at_admission = touched + self._failed_at_admission, []
        if batch is None:
            if gated and any(r.mask_pending for r in self.running):  # only masks to wait for: wait a little
                touched += self._settle_masks([r for r in self.running if r.mask_pending],
                                              time.monotonic() + IDLE_MASK_WAIT_S)
            return touched
        try:
            began, began_cpu = time.perf_counter(), time.process_time()
            if self.kv.states is not None:  # hybrid: state snapshots (prefills, decode rows at page boundaries)
                batch.state_loads, batch.state_saves = self.kv.states.plan(
                    batch.reqs, batch.prefix_lens, [len(x) for x in batch.extend_ids], batch.decode_from,
                    self.cfg.page_size)
            result = (self.runner if self.overlap is None else self.overlap).forward(batch.model_batch())
            forward_s = time.perf_counter() - began
            if batch.phase == "extend":  # the hierarchical cache weighs its loads against this
                self.kv.note_prefill(batch.num_tokens, forward_s)
            self.forward_steps += 1
            for r in batch.reqs:
                r.forward_passes += 1
            self.recent_batches.append((batch.phase, batch.batch_size, batch.num_tokens))
            touched += self._process_batch_result(batch, result)
            if self.masks.held:  # the next masks computed meanwhile: wait a fraction of the forward for the late ones
                self._settle_masks(self.masks.take_held(), time.monotonic() + LATE_MASK_WAIT * forward_s)
            self.drafts.note_step(batch.batch_size, batch.num_tokens, batch.decode_from == 0,
                                  time.perf_counter() - began, time.process_time() - began_cpu)
        except Exception as e:  # noqa: BLE001 - contained: only this batch's requests fail
            logger.exception("step failed (%s batch of %d): failing its requests", batch.phase, batch.batch_size)
            failed = touched + self._fail_batch(batch, f"internal error: {type(e).__name__}: {e}")
            if isinstance(e, FatalFault):  # the loop fails the rest and stops (RequestLoop.run_once)
                raise FatalFault(str(e), failed) from e
            return failed
        # Chunked prefill never freezes decoding: after a non-final chunk, running requests step once.
        self._decode_owed = batch.phase == "extend" and self.chunked_req is not None and bool(self.running)
        if self.cfg.debug_check_integrity:
            self.check_integrity()
        return touched

    def get_next_batch_to_run(self) -> Optional[ScheduleBatch]:
        """Prefill first; decode when nothing can be admitted, or when a chunk just ran (interleave)."""
        if (self.waiting or self.chunked_req) and not self._decode_owed:
            batch = self._get_new_prefill_batch()
            if batch is not None:
                if self.cfg.enable_mixed_chunk and self.running:
                    self._mix_in_decode(batch)
                return batch
        self._decode_owed = False
        if any(not r.mask_pending for r in self.running):
            return self._get_decode_batch()
        return None

    def _mix_in_decode(self, batch: ScheduleBatch) -> None:
        """Append every running request's decode step to a prefill batch, when its slots are free now
        (otherwise they decode next step, where retract_decode can make room)."""
        self.drafts.gate(self.running)
        ready = [r for r in self.running if not r.mask_pending]  # the others wait for their mask (mask_gate.py)
        need = sum(self.allocator.slots_needed(r.kv_len, pending_len(r) + len(r.draft)) for r in ready)
        if not ready or need > self.kv.available_size():
            return
        if batch.draft_lens or any(r.draft for r in ready):
            batch.draft_lens = (batch.draft_lens or [0] * len(batch.reqs)) + [len(r.draft) for r in ready]
        self.kv.ensure_free(need)
        batch.phase = "mixed"
        first = len(batch.reqs)
        for r in ready:
            batch.reqs.append(r)
            batch.prefix_lens.append(r.kv_len)
            ids = pending_ids(r) + r.draft
            batch.extend_ids.append(ids)
            batch.out_locs.append(self.kv.alloc(r, len(ids)))
            batch.sample.append(True)
        batch.rewrite_rows += [first + i for i in take_dirty_rows(ready)]

    # ------------------------------------------------------------------ prefill
    def _get_new_prefill_batch(self) -> Optional[ScheduleBatch]:
        yield_chunk_for_head(self)
        while True:
            plan = self.admission.plan(self.waiting, self.running, self.chunked_req, self.new_token_ratio)
            self.waiting, self.chunked_req = plan.waiting, plan.chunked_req
            self._failed_at_admission += plan.failed
            if plan.batch is not None or not preempt_for_head(self):
                return plan.batch

    # ------------------------------------------------------------------ decode
    def _get_decode_batch(self) -> ScheduleBatch:
        self.drafts.gate(self.running)
        ensure_decode_memory(self)
        reqs = [r for r in self.running if not r.mask_pending]  # the others wait for their mask (mask_gate.py)
        prefix_lens = [r.kv_len for r in reqs]
        extend_ids = [pending_ids(r) + r.draft for r in reqs]  # the last sampled token (+ a draft to verify)
        self.kv.ensure_free(sum(self.allocator.slots_needed(r.kv_len, len(x)) for r, x in zip(reqs, extend_ids)))
        out_locs = [self.kv.alloc(r, len(x)) for r, x in zip(reqs, extend_ids)]
        self.new_token_ratio = max(self.new_token_ratio - self.cfg.new_token_ratio_decay, self.cfg.new_token_ratio_min)
        # Forced tokens make some steps longer than one token: the batch runs as an extend over cached
        # prefixes ("mixed" with every request decoding), still one forward pass.
        phase = "decode" if all(len(x) == 1 for x in extend_ids) else "mixed"
        return ScheduleBatch(phase, reqs, prefix_lens, extend_ids, out_locs, [True] * len(reqs),
                             rewrite_rows=take_dirty_rows(reqs), decode_from=0,
                             draft_lens=[len(r.draft) for r in reqs] if phase == "mixed" else [])

    # ------------------------------------------------------------------ results
    def _process_batch_result(self, batch: ScheduleBatch, result: StepResult) -> list[Req]:
        touched: list[Req] = []
        tokens = iter(result.next_token_ids)
        now = time.perf_counter()
        for i, (req, sampled) in enumerate(zip(batch.reqs, batch.sample)):
            decoding = i >= batch.decode_from
            lp = result.logprobs.get(i)
            if lp is not None:
                req.input_logprobs += lp.input_vals
                req.input_top_logprobs += lp.input_top
                req.input_ranks += lp.input_ranks
            if i in result.pooled:  # a pooling request's part (the sum of this chunk's rows for mean)
                req.pooled.add(result.pooled[i], len(batch.extend_ids[i]))
            if i in result.hidden:  # return_hidden_states: this step's rows, kept by position
                keep_hidden(req, batch, i, result)
            if not decoding and req is self.chunked_req:
                self.kv.cache_unfinished(req)  # more chunks to go; what is done can be shared already
                if self.pd is not None:
                    self.pd.on_chunk(req)  # PD prefill: this chunk's K/V streams to the decode now
                continue
            if sampled:
                token = next(tokens)
                if req.draft:  # the draft tokens the model agreed with come first (verified, not sampled)
                    try:
                        self.drafts.accept(req, result.accepted.get(i, 0), token, lp)
                    except GrammarBudgetExceeded as e:
                        req.finish({"type": "abort", "message": str(e)})
                if not req.finished:
                    if lp is not None and lp.output_val is not None:
                        req.output_logprobs.append(lp.output_val)
                        if lp.output_top is not None:
                            req.output_top_logprobs.append(lp.output_top)
                    req.output_ids.append(token)
                    if req.first_token_at is None:
                        req.first_token_at = now
                    self._after_sample(req)
                # K/V of rejected draft tokens, or of the token after its finish (a step in flight ran it)
                if req.kv_len > req.seq_len - 1 + (req.future is not None and not req.finished):
                    self.kv.truncate(req, req.seq_len - 1)
            elif req.sampling.max_new_tokens == 0:
                req.finish({"type": "length", "length": 0})
            if self.pd is not None and self.pd.kind == "prefill" and not decoding:
                self.pd.hold(req)  # answered once its K/V reached the decode (PrefillRole.poll)
                continue
            touched.append(req)
            if req.finished:
                if decoding:
                    self.running.remove(req)
                self._release(req)
            elif not decoding:
                self.kv.cache_unfinished(req)
                self.running.append(req)
        return touched

    def _after_sample(self, req: Req) -> None:
        """Finish checks for the sampled token (for a constrained request also its grammar step), then the
        draft it carries into its next step (verified by that forward pass, model/executor/sample_step.py). A grammar
        past its budget (constrained/step_guard.py) ends this request alone, with the limit named."""
        try:
            self._after_sample_checked(req)
        except GrammarBudgetExceeded as e:
            req.draft, req.draft_states = [], []
            if not req.finished:
                req.finish({"type": "abort", "message": str(e)})

    def _after_sample_checked(self, req: Req) -> None:
        # a token that opened or closed the reasoning block moved the grammar: it is not the grammar's
        moved = req.watch is not None and req.watch.plan.hold_grammar and self._move_grammar(req)
        if not moved and req.grammar is not None and not self.grammar.advance(req, req.output_ids[-1]):
            # the mask makes this a bug, not bad input
            raise RuntimeError(f"request {req.rid}: the grammar refused sampled token {req.output_ids[-1]}")
        self._check_finished(req)
        if req.grammar is not None and not req.finished:
            self.grammar.prefetch(req)  # the next mask computes on the guard's thread from now on
            self.masks.hold(req)  # its must-finish check and draft once the mask is known (mask_gate.py)
            return
        self.drafts.propose(req, len(self.running))

    @staticmethod
    def _move_grammar(req: Req) -> bool:
        """A grammar held until the reasoning ends (scheduler/reasoning_watch.py): held when the token opened the
        block, given back when it closed it (True: the token moved it); grammar_held holds it meanwhile."""
        held = req.watch.holds_grammar(req.output_ids)
        if held and req.grammar is not None:
            req.grammar_held, req.grammar = req.grammar, None
            return True
        if not held and req.grammar_held is not None:
            req.grammar, req.grammar_held = req.grammar_held, None
            return True
        return False

    def _settle_masks(self, reqs: list[Req], until: float) -> list[Req]:
        """MaskGate.settle; the requests it ended leave `running` with their slots released."""
        ended = self.masks.settle(reqs, until, len(self.running))
        for req in ended:
            if req in self.running:
                self.running.remove(req)
                self._release(req)
        return ended

    def _poll_disagg(self) -> list[Req]:
        """PD: requests the role ended (released already), and on a decode server those whose K/V and first
        token arrived: the first token's checks as after a sample, then they decode with the others."""
        ended, ready = self.pd.poll(len(self.running))
        for req in ready:
            if not req.finished:
                self._after_sample(req)
            if req.finished:
                self._release(req)
            else:
                self.kv.cache_unfinished(req)
                self.running.append(req)
        self._settle_masks(self.masks.take_held(), time.monotonic())
        return ended + ready

    def _poll_grammars(self) -> list[Req]:
        """Requests whose grammar finished compiling join the queue (after its forced prefix); those
        whose grammar failed end with a 400-class error."""
        ready, failed = self.grammar.poll()
        self._enqueue(ready)  # its first token is sampled by the prefill; drafts start after it
        for req in failed:
            if not req.finished:
                req.finish({"type": "abort", "message": req.error})
        return failed

    def _check_finished(self, req: Req) -> None:
        check_finished(req, self.cfg.eos_token_ids, self.cfg.context_len, self.detokenize)

    # ------------------------------------------------------------------ memory
    def _release(self, req: Req, cache: bool = True) -> None:
        self.kv.release(req, cache=cache)

    def flush_cache(self, tiers: Optional[list[str]] = None) -> bool:
        """Empty the radix cache (and the hicache tiers named, None: all); refused (False) while any
        request is queued or running."""
        if not (self.is_idle and self.kv.flush(tiers)):
            return False
        if self.grammar is not None:
            self.grammar.clear_cache()
        return True

    def _process_aborts(self) -> list[Req]:
        if not self._to_abort:
            return []
        aborted: list[Req] = []
        if self.grammar is not None:
            for req in self.grammar.remove(self._to_abort):
                req.finish({"type": "abort", "message": "aborted by request"})
                aborted.append(req)
        for req in list(self.waiting) + list(self.running) + ([self.chunked_req] if self.chunked_req else []):
            if req.rid in self._to_abort:
                aborted.append(req)
        if self.pd is not None:
            aborted += self.pd.take(self._to_abort)  # released by the role (a half-received K/V is not cached)
        for req in aborted:
            self._detach(req)
            self._release(req)
            req.finish({"type": "abort", "message": "aborted by request"})
        if aborted:  # benchmarks/bench_disconnect.py reads the time
            logger.debug("aborted by request: %s", " ".join(r.rid for r in aborted))
        self._to_abort.clear()
        return aborted

    def _detach(self, req: Req) -> None:
        """Take req out of the waiting and running lists and the chunked-prefill slot, wherever it is."""
        for queue in (self.waiting, self.running):
            if req in queue:
                queue.remove(req)
        if req is self.chunked_req:
            self.chunked_req = None

    def _fail_batch(self, batch: ScheduleBatch, message: str) -> list[Req]:
        """End every request of a failed batch with `message`; free what each still holds."""
        failed = []
        for req in batch.reqs:
            if req.error is not None:  # listed twice (mixed chunk): already handled
                continue
            self._detach(req)
            if self.pd is not None:
                self.pd.take({req.rid}, failed=True)
            if not req.finished:  # a request that finished before the fault was released already
                self._release(req, cache=False)
                req.finish({"type": "abort", "message": message})
            req.error = message
            failed.append(req)
        self._decode_owed = False
        return failed

    def abort_all(self, message: str = "aborted") -> list[Req]:
        """Release every request (used when a step fails); returns them, finished with `abort`."""
        reqs = self.waiting + self.running + ([self.chunked_req] if self.chunked_req else [])
        self.waiting, self.running, self.chunked_req = [], [], None
        if self.pd is not None:
            for req in self.pd.take_all():  # released by the role
                if not req.finished:
                    req.finish({"type": "abort", "message": message})
                req.error = message
                reqs.append(req)
        if self.grammar is not None:
            for req in self.grammar.take_all():  # nothing held yet: just end them
                req.finish({"type": "abort", "message": message})
                req.error = message
                reqs.append(req)
        for req in reqs:
            if req.finished:
                continue
            self._release(req, cache=False)  # the failed step may have left garbage in its slots
            req.finish({"type": "abort", "message": message})
            req.error = message
        return reqs

    def check_integrity(self) -> None:
        """Every page free, cached or held by exactly one live request; table rows likewise."""
        held = (self.pd.held_reqs() if self.pd is not None else []) + (self.overlap.held() if self.overlap else [])
        self.kv.check_integrity(self.running + self.waiting + ([self.chunked_req] if self.chunked_req else []) + held)

