"""OverlapSchedule (torch-free): SGLang's overlap scheduler. While step N's forward runs on the forward thread
(scheduler/forward_thread.py), the scheduler's thread plans step N+1 (admission, prefix match, allocation, the
runner's batch) and submits it, then applies step N's result.

The lag: a request decoding in N and N+1 runs N's token in N+1 before the scheduler has seen it (Req.future,
the placeholder request.future_token); its finish checks for N's token happen while N+1 runs. A request N
finished has one token too many in flight: N+1's row of it is dropped when N+1's result is applied, and the
slot it wrote was given back with the request at N (K/V past its finish is never cached). So stop ids, stop
strings, EOS and max_new_tokens give exactly the outputs of the schedule without overlap.

Steps run without overlap (the step in flight is applied first, then the plain Scheduler step) whenever the
one-step lag is not safe: an abort is pending; a constrained request is queued, compiling or running (its
mask needs its grammar advanced by the token before; jump-forward drafts); a thinking budget may force a
request's next token or move its grammar (Req.watch_active); the next decode would retract a
request; the step in flight holds a prompt's non-final chunk. Whole configurations that run without overlap
(`overlap_off_reason`): speculative decoding, PD disaggregation, hybrid state snapshots, LoRA, tensor
parallelism, the hierarchical cache.

A forward fault ends its batch's requests, and also those of the step submitted behind it when that step reads
its tokens (the requests decoding in both).
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Optional

from radixlang_runtime.model.executor.step_io import ModelBatch, StepResult
from radixlang_runtime.scheduler.batch import ScheduleBatch
from radixlang_runtime.scheduler.forward_thread import ForwardThread, Job
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.utils.faults import FatalFault

logger = logging.getLogger(__name__)


def overlap_off_reason(args: Any, device_type: str, hybrid: bool) -> Optional[str]:
    """Why a server with these ServerArgs on this device schedules without overlap (None: it overlaps). The
    default is on for CUDA, off on CPU (docs/SERVER.md#overlap-schedule); --enable-overlap-schedule with a
    configuration that cannot overlap is refused by name."""
    if args.disable_overlap_schedule:
        return "--disable-overlap-schedule"
    if not args.enable_overlap_schedule and device_type != "cuda":
        return f"the {device_type} default (--enable-overlap-schedule turns it on)"
    for on, name in ((args.speculative_algorithm is not None, "speculative decoding"),
                     (args.disaggregation_mode != "null", "PD disaggregation"), (hybrid, "hybrid state snapshots"),
                     (args.enable_lora, "LoRA"), (args.tp_size > 1, "tensor parallelism"),
                     (args.enable_hierarchical_cache, "the hierarchical cache")):
        if on and args.enable_overlap_schedule:
            raise ValueError(f"enable_overlap_schedule: the overlap schedule does not run with {name}")
        if on:
            return name
    return None


@dataclass
class Launched:
    batch: ScheduleBatch
    job: Job
    chunk: bool  # holds a prompt's non-final chunk (the next step must see that chunk applied)


class OverlapSchedule:
    def __init__(self, sched: Any):
        """sched: the Scheduler it steps (scheduler.py; set as its `overlap`)."""
        if sched.drafts.drafter is not None or sched.pd is not None or sched.kv.states is not None:
            raise ValueError("the overlap schedule does not run with speculative decoding, PD disaggregation or "
                             "hybrid state snapshots")
        self.s = sched
        self.thread = ForwardThread(sched.runner.forward)
        weakref.finalize(self, self.thread.close)
        self.inflight: Optional[Launched] = None
        self.serial = 0
        self._drained: list[Req] = []  # requests a drain touched, returned by the next step
        self.overlapped_steps = 0  # steps submitted while another ran
        self.sync_steps = 0  # steps run without overlap

    @property
    def busy(self) -> bool:
        return self.inflight is not None or bool(self._drained)

    def held(self) -> list[Req]:
        """Requests the step in flight holds that are not queued or running (a prompt's last chunk sampling
        its first token), for the integrity check."""
        if self.inflight is None:
            return []
        s = self.s
        listed = {id(r) for r in [*s.waiting, *s.running, *([s.chunked_req] if s.chunked_req else [])]}
        held = []
        for r in self.inflight.batch.reqs:
            if not r.finished and id(r) not in listed:
                listed.add(id(r))
                held.append(r)
        return held

    def stats(self) -> dict:
        return {"overlapped_steps": self.overlapped_steps, "sync_steps": self.sync_steps}

    def forward(self, batch: ModelBatch) -> StepResult:
        """A step without overlap: on the forward thread all the same (torch stays on one thread)."""
        self.serial += 1
        return self.thread.wait(self.thread.submit(Job(self.serial, batch, [], 0)))

    def drain(self) -> None:
        """Apply the step in flight now (its touched requests go out with the next step's)."""
        self._drained += self._finish_inflight()

    def _may_overlap(self) -> bool:
        s = self.s
        if s._to_abort or (self.inflight is not None and self.inflight.chunk):
            return False
        if any(r.watch_active for r in s.running) or any(r.watch_active for r in s.waiting):
            return False
        if s.grammar is None:
            return True
        return not (s.grammar.pending or any(r.grammar is not None or r.sampling.constrained
                                             for r in [*s.waiting, *s.running]))

    def step(self) -> list[Req]:
        """Scheduler.step with the forward of the step it plans left running."""
        s = self.s
        if not self._may_overlap():
            self.drain()
            touched, self._drained = self._drained, []
            self.sync_steps += 1
            return touched + s.step_sync()
        batch = s.get_next_batch_to_run()  # may drain (a retraction needs the step in flight applied)
        touched, self._drained = self._drained, []
        if s._failed_at_admission:
            touched += s._failed_at_admission
            s._failed_at_admission = []
        if batch is None:
            return touched + self._finish_inflight()
        launched = self._launch(batch)
        touched += self._finish_inflight()
        self.inflight = launched
        if all(r.finished for r in batch.reqs):  # it runs only tokens past finishes: idle once it ends
            touched += self._finish_inflight()
        s._decode_owed = batch.phase == "extend" and s.chunked_req is not None and bool(s.running)
        if s.cfg.debug_check_integrity:
            s.check_integrity()
        return touched

    def _launch(self, batch: ScheduleBatch) -> Launched:
        s = self.s
        self.serial += 1
        mb = batch.model_batch()  # placeholders for the tokens of the step in flight (Req.future)
        futures = [(i, r.future[1]) for i, r in enumerate(batch.reqs) if r.future is not None]
        future_serial = self.inflight.job.serial if self.inflight is not None else 0
        k = 0
        for r, sampled in zip(batch.reqs, batch.sample):
            if sampled:
                r.future = (self.serial, k)
                k += 1
        job = self.thread.submit(Job(self.serial, mb, futures, future_serial))
        if self.inflight is not None:
            self.overlapped_steps += 1
        s.forward_steps += 1
        for r in batch.reqs:
            r.forward_passes += 1
        s.recent_batches.append((batch.phase, batch.batch_size, batch.num_tokens))
        chunk = s.chunked_req is not None and any(r is s.chunked_req for r in batch.reqs)
        return Launched(batch, job, chunk)

    def _finish_inflight(self) -> list[Req]:
        """Wait for the step in flight and apply its result (Scheduler._process_batch_result); a fault ends its
        batch's requests as Scheduler.step does."""
        launched, self.inflight = self.inflight, None
        if launched is None:
            return []
        s, batch = self.s, launched.batch
        try:
            result = self.thread.wait(launched.job)
            if batch.phase == "extend":  # the hierarchical cache weighs its loads against this
                s.kv.note_prefill(batch.num_tokens, launched.job.seconds)
            touched = s._process_batch_result(*drop_finished(batch, result))
        except Exception as e:  # noqa: BLE001 - contained: only this batch's requests fail
            logger.exception("step failed (%s batch of %d): failing its requests", batch.phase, batch.batch_size)
            failed = s._fail_batch(batch, f"internal error: {type(e).__name__}: {e}")
            if isinstance(e, FatalFault):
                raise FatalFault(str(e), failed) from e
            return failed
        finally:
            for r in batch.reqs:
                if r.future is not None and r.future[0] == launched.job.serial:
                    r.future = None
        return touched


def drop_finished(batch: ScheduleBatch, result: StepResult) -> tuple[ScheduleBatch, StepResult]:
    """The batch and result without the rows of requests that finished before the step's result was applied
    (they finished at the step before, whose result the scheduler saw while this one ran)."""
    keep = [i for i, r in enumerate(batch.reqs) if not r.finished]
    if len(keep) == len(batch.reqs):
        return batch, result
    new_index = {old: new for new, old in enumerate(keep)}
    token_of, k = {}, 0
    for i, sampled in enumerate(batch.sample):
        if sampled:
            token_of[i] = result.next_token_ids[k]
            k += 1
    decode_from = sum(1 for i in keep if i < batch.decode_from)
    sub = ScheduleBatch(batch.phase, [batch.reqs[i] for i in keep], [batch.prefix_lens[i] for i in keep],
                        [batch.extend_ids[i] for i in keep], [batch.out_locs[i] for i in keep],
                        [batch.sample[i] for i in keep], decode_from=decode_from,
                        draft_lens=[batch.draft_lens[i] for i in keep] if batch.draft_lens else [])
    out = StepResult(next_token_ids=[token_of[i] for i in keep if batch.sample[i]],
                     accepted={new_index[i]: a for i, a in result.accepted.items() if i in new_index},
                     logprobs={new_index[i]: lp for i, lp in result.logprobs.items() if i in new_index},
                     pooled={new_index[i]: p for i, p in result.pooled.items() if i in new_index},
                     hidden={new_index[i]: h for i, h in result.hidden.items() if i in new_index})
    return sub, out
