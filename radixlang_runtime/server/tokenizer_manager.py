"""TokenizerManager: the server process's side of the runtime (asyncio, in the HTTP event loop).

It tokenizes and validates requests (the same checks as the in-process Engine, so bad input is a
ValueError -> HTTP 400 before the scheduler sees it) on intake threads (run_intake: the event loop
never tokenizes), sends them to the scheduler, and routes the detokenizer's results back to each
waiting handler through a per-request asyncio.Queue. A handler
that stops listening (client gone) aborts its request, which frees its KV at the next step.
Availability lives in one Lifecycle (lifecycle.py): `generate` and `prepare` admit new work through it
(503 while the server drains or is dead), /health asks `health()`. If a child process dies, `mark_dead`
fails every request in flight; SIGTERM / SIGINT run `drain`: admission stops, the requests in flight run
on for the drain time, the rest fail with ShuttingDown (the same path as mark_dead's).

Data parallel (dp_size > 1): one scheduler per replica; the Placement (placement.py) picks each request's
replica and learns when it ends (the `finally` of `_generate`, which every request passes exactly
once). Aborts go to the request's replica; control calls go to every replica and their replies are
merged (stats: counters summed, each replica's own under "replicas").
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional, TypeVar

import zmq
import zmq.asyncio

from radixlang_runtime.protocol.generate_input import GenerateRequest
from radixlang_runtime.protocol.limits import RuntimeLimits
from radixlang_runtime.prompt_encoder import PromptEncoder, Span
from radixlang_runtime.lora_spec import lora_id_of
from radixlang_runtime.protocol.messages import (GetWeightsOut, LoadLoraOut, LoadLoraReq, UnloadLoraOut,
                                                 UnloadLoraReq, UpdateWeightsOut)
from radixlang_runtime.protocol.messages import (AbortReq, BatchStrOut, ErrorOut, FlushCacheOut, FlushCacheReq,
                                                 GetStatsReq, PinPrefixOut, PinPrefixReq, SchedulerHeartbeat, StatsOut,
                                                 TokenizedBatchReq, UnpinPrefixOut, UnpinPrefixReq, decode, encode)
from radixlang_runtime.protocol.results import ResultBuilder
from radixlang_runtime.speculative.accept_stats import merge_accept_stats
from radixlang_runtime.server.ipc import IpcPaths
from radixlang_runtime.server.weight_updates import WeightGate
from radixlang_runtime.server.hicache_metrics import merge_counters, merge_hicache_stats
from radixlang_runtime.server.lifecycle import (SHUTTING_DOWN, Lifecycle, RequestUnavailable, RuntimeUnavailable,
                                                ShuttingDown)
from radixlang_runtime.server.live_series import LiveSeries
from radixlang_runtime.server.metrics import ServerMetrics
from radixlang_runtime.placement import Placement, PlacementConfig

# Stats counters that add up over replicas (the others are taken from replica 0).
_SUMMED_STATS = ("total_slots", "free_slots", "cached_slots", "evictable_slots", "num_running_reqs",
                 "num_waiting_reqs", "prefill_tokens_computed", "prefill_tokens_cached", "num_retractions",
                 "forward_steps", "pinned_slots", "num_pins", "num_grammar_waiting", "forced_tokens_total",
                 "spec_draft_tokens", "spec_accepted_tokens")

logger = logging.getLogger(__name__)
T = TypeVar("T")
INTAKE_THREADS = 4  # per pool (tokenizing mostly runs without the GIL, so threads do run in parallel)
BULK_INTAKE_SIZE = 256 * 1024  # characters / token ids from which a request is tokenized in the bulk pool


@dataclass
class ReqState:
    result: ResultBuilder
    queue: "asyncio.Queue[dict]" = field(default_factory=asyncio.Queue)

    @property
    def finished(self) -> bool:
        return self.result.finished


class TokenizerManager:
    def __init__(self, ipc: IpcPaths, tokenizer: Any, limits: RuntimeLimits, metrics: Optional[ServerMetrics],
                 num_replicas: int = 1, load_balance_method: str = "cache_aware", health_stall_timeout: float = 30.0,
                 images: Any = None):
        """images: the model's multimodal/image_prep.ImagePrep (None: it takes no images)."""
        self.tokenizer = tokenizer
        self.images = images
        self.encoder = PromptEncoder(tokenizer)
        self.limits = limits
        self.metrics = metrics
        self.live = LiveSeries()  # the dashboard's recent history (always on: a few deque appends)
        ctx = zmq.asyncio.Context()
        self.to_replicas = []  # one PUSH socket per replica's scheduler
        for i in range(num_replicas):
            sock = ctx.socket(zmq.PUSH)
            sock.connect(ipc.scheduler_in_of(i))
            self.to_replicas.append(sock)
        config = PlacementConfig(load_balance_method, tree_capacity_tokens=limits.num_slots)
        self.placement = Placement(num_replicas, config) if num_replicas > 1 else None
        self.recv = ctx.socket(zmq.PULL)
        self.recv.bind(ipc.tokenizer_in)
        self.states: dict[str, ReqState] = {}
        self._control: dict[str, asyncio.Future] = {}
        self.weight_gate = WeightGate()  # closed while the weights are replaced (weight_updates.py)
        self.lifecycle = Lifecycle(num_replicas, health_stall_timeout)
        self._task: Optional[asyncio.Task] = None
        self._intake_pool = ThreadPoolExecutor(INTAKE_THREADS, thread_name_prefix="intake")
        self._bulk_pool = ThreadPoolExecutor(INTAKE_THREADS, thread_name_prefix="intake-bulk")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._recv_loop())

    # ------------------------------------------------------------------ requests
    def encode_text(self, text: str) -> list[int]:
        """Tokenize raw text (prompt_encoder.py: the tokenizer's BOS where it adds one; blocking: call it
        inside run_intake, never on the event loop)."""
        return self.encoder.encode(text)

    def encode_words(self, text: str) -> list[int]:
        """Tokenize a word without special tokens (sampling_params bad_words; blocking, as encode_text)."""
        return self.encoder.encode_plain(text)

    def encode_chat(self, text: str, content_spans: Optional[list[Span]]) -> list[int]:
        """Tokenize a rendered chat prompt (content spans: special-token text there stays text)."""
        return self.encoder.encode_chat(text, content_spans)

    async def run_intake(self, fn: Callable[..., T], *args: Any, size: int = 0) -> T:
        """fn(*args) on an intake thread: parsing, chat templates, tokenizing and validating a request
        (HF tokenizers release the GIL while encoding: a 10 MB text tokenizes on a thread while the
        event loop keeps serving). `size` (characters or ids in the request) picks the pool: inputs of
        at least BULK_INTAKE_SIZE go to their own pool, so big requests never queue ahead of small ones."""
        pool = self._bulk_pool if size >= BULK_INTAKE_SIZE else self._intake_pool
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args))

    @property
    def dead(self) -> Optional[str]:
        return self.lifecycle.dead

    def generate(self, req: GenerateRequest) -> AsyncIterator[dict]:
        """Yields progress snapshots ({"text", "output_ids", "meta_info"}); the last has a finish_reason.
        req: one sample, validated by the intake (generate_input.py: rid assigned, n fanned out). Text and
        output_ids are deltas (results.py: "text_trim" in a final one whose stop string was cut;
        results.Cumulative folds them where a protocol wants the whole text, http_common.final_result for
        the final result); with logprobs, a streaming request's output logprob lists are the delta since the
        previous snapshot (input ones come once, in the first), a non-streaming one gets them whole.
        Admission is decided here, when called, not at the first iteration: callers create the
        iterators before any response header goes out, so a refused request is a plain 503."""
        self.lifecycle.admit()
        return self._generate(req)

    def generate_batch(self, reqs: list[GenerateRequest]) -> list[AsyncIterator[dict]]:
        """generate's snapshots for several requests sent as one TokenizedBatchReq per replica: the scheduler
        takes them in one drain, so they prefill as one batch where its budgets allow (pooling inputs).
        The caller iterates every returned iterator (each one's end frees its request)."""
        self.lifecycle.admit()
        if dupes := sorted({r.rid for r in reqs if r.rid in self.states}):
            raise ValueError(f"request id {dupes[0]!r} is already in use")
        per_replica: dict[int, list] = {}
        for req in reqs:
            self.states[req.rid] = ReqState(ResultBuilder(req.rid, req.input_ids, req.stream, req.logprob,
                                                          self._token_text))
            replica = self.placement.route(req.rid, req.prefix_key) if self.placement else 0
            per_replica.setdefault(replica, []).append(req.to_message())
        for replica, msgs in per_replica.items():
            self.to_replicas[replica].send(encode(TokenizedBatchReq(msgs)))  # PUSH: queued, never blocks here
        return [self._generate(req, sent=True) for req in reqs]

    async def _generate(self, req: GenerateRequest, sent: bool = False) -> AsyncIterator[dict]:
        """sent: generate_batch registered and sent it already."""
        rid, input_ids = req.rid, req.input_ids
        if sent:
            state = self.states[rid]
        else:
            await self.weight_gate.wait()  # a weight update runs: start on the new weights
            if rid in self.states:
                raise ValueError(f"request id {rid!r} is already in use")
            state = ReqState(ResultBuilder(rid, input_ids, req.stream, req.logprob, self._token_text))
            self.states[rid] = state
        try:
            if not sent:
                replica = self.placement.route(rid, req.prefix_key) if self.placement else 0
                await self.to_replicas[replica].send(encode(req.to_message()))
            while True:
                out = await state.queue.get()
                if "error" in out:
                    if "raise" in out:  # _fail_in_flight's: the runtime is gone or the drain ran out
                        raise out["raise"](out["error"])
                    if self.dead:
                        raise RuntimeUnavailable(out["error"])
                    status = out.get("status")
                    raise (ValueError if status == 400 else RequestUnavailable if status == 503
                           else RuntimeError)(out["error"])
                yield out
                if out["meta_info"]["finish_reason"] is not None:
                    return
        finally:
            if not state.finished:  # the consumer went away: free the request's memory
                state.result.finished = True
                self.abort(rid)
                if self.metrics:
                    self.metrics.on_abandoned()
            self.states.pop(rid, None)
            if self.placement:
                self.placement.finish(rid)

    def end_early(self, rid: str, finish_reason: dict) -> None:
        """A route ends a request in flight on a rule of its own (llama.cpp's /infill limits, infill_stops.py):
        the scheduler aborts it (its memory freed) and it counts as finished with finish_reason (/metrics: a
        finished request, aborted only for type "abort"), not as abandoned. Its handler closes its stream next
        (records still arriving meanwhile are dropped). Nothing for a request that already ended."""
        st = self.states.get(rid)
        if st is None or st.finished:
            return
        st.result.finished = True
        self.abort(rid)
        self._count_finish(st.result, time.perf_counter(), finish_reason)

    def abort(self, rid: str) -> None:
        """Queue an abort (no await: this also runs while a cancelled handler unwinds)."""
        replica = self.placement.replica_of(rid) if self.placement else 0
        targets = self.to_replicas if replica is None else [self.to_replicas[replica]]
        for sock in targets:  # an rid the router does not know (finished, or never sent): every replica
            sock.send(encode(AbortReq(rid)))

    async def flush_cache(self, tiers: Optional[list[str]] = None) -> bool:
        ok = all(out.success for out in await self._control_all(FlushCacheReq, tiers))
        if ok and self.placement:
            self.placement.reset_trees()
        return ok

    async def get_stats(self) -> dict[str, Any]:
        return self._merge_stats([out.stats for out in await self._control_all(GetStatsReq)])

    async def get_dashboard_stats(self, with_ids: bool) -> dict[str, Any]:
        """get_stats plus the live view's state ("dashboard": queues, KV split, radix tree summary)
        of replica 0 (the live view shows one replica)."""
        return (await self._control_call(GetStatsReq, "dashboard", with_ids)).stats

    def _merge_stats(self, per_replica: list[dict[str, Any]]) -> dict[str, Any]:
        if len(per_replica) == 1:
            return per_replica[0]
        merged = dict(per_replica[0])
        for key in _SUMMED_STATS:
            if key in merged:
                merged[key] = sum(s.get(key, 0) for s in per_replica)
        merged["hicache"] = merge_hicache_stats([s.get("hicache") for s in per_replica])
        merged["readmit_tokens"] = merge_counters([s.get("readmit_tokens") for s in per_replica])
        merged["spec_accept_length"] = merge_accept_stats([s.get("spec_accept_length") for s in per_replica])
        merged["spec_draft_model"] = merge_counters([s.get("spec_draft_model") for s in per_replica])
        merged["replicas"] = per_replica
        merged["placement"] = self.placement.stats()  # several replicas: there is a router
        return merged

    async def pin_prefix(self, input_ids: list[int], ttl_s: Optional[float] = None, owner: str = "") -> dict[str, Any]:
        """Lock the cached part of input_ids in the radix cache (KVManager.pin: only what is cached;
        prefill it first). Returns {"pin_id", "pinned_len", "input_len"}; a bad ttl_s is a ValueError.
        Data parallel: pinned on every replica (wherever it is cached); the id lists the replicas' pins."""
        outs = await self._control_all(PinPrefixReq, list(input_ids), ttl_s, owner)
        if len(outs) == 1:
            out = outs[0]
            if out.pin_id is None:
                raise ValueError(out.error or "the prefix could not be pinned")
            return {"pin_id": out.pin_id, "pinned_len": out.pinned_len, "input_len": len(input_ids)}
        if all(o.pin_id is None for o in outs):
            raise ValueError(outs[0].error or "the prefix could not be pinned")
        pin_id = "dp:" + ",".join(o.pin_id or "-" for o in outs)
        return {"pin_id": pin_id, "pinned_len": max(o.pinned_len for o in outs), "input_len": len(input_ids)}

    async def unpin_prefix(self, pin_id: str, owner: str = "") -> bool:
        """Release a pin; False when there is none by that id of owner's (unknown, unpinned, expired, or
        another owner's)."""
        if not pin_id.startswith("dp:") or len(self.to_replicas) == 1:
            return (await self._control_call(UnpinPrefixReq, pin_id, owner)).success
        ids = pin_id[3:].split(",")
        if len(ids) != len(self.to_replicas):
            return False
        outs = await asyncio.gather(*(self._control_call(UnpinPrefixReq, p, owner, replica=i)
                                      for i, p in enumerate(ids) if p != "-"))
        return bool(outs) and all(o.success for o in outs)

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> int:
        """Serve another LoRA adapter under lora_name (one replica: LoRA refuses dp_size > 1); returns its id."""
        names = list(self.limits.lora_adapters)
        if lora_name in names:
            raise ValueError(f"LoRA adapter {lora_name!r} is already loaded")
        out = await self._control_call(LoadLoraReq, lora_name, lora_path, timeout=120.0)
        if not out.lora_id:
            raise ValueError(out.error or f"LoRA adapter {lora_name!r} could not be loaded")
        names += [None] * (out.lora_id - 1 - len(names)) + [lora_name]  # position = id - 1 (lora_spec.py)
        self.limits = dataclasses.replace(self.limits, lora_adapters=tuple(names))
        return out.lora_id

    async def unload_lora_adapter(self, lora_name: str, timeout: float = 60.0) -> None:
        """Refuse lora_name from now on; its weights go once its requests have ended (TimeoutError after timeout)."""
        lora_id = lora_id_of(lora_name, self.limits.lora_adapters)
        names = list(self.limits.lora_adapters)
        names[lora_id - 1] = None
        self.limits = dataclasses.replace(self.limits, lora_adapters=tuple(names))
        deadline = time.monotonic() + timeout
        while not (await self._control_call(UnloadLoraReq, lora_id)).success:
            if time.monotonic() > deadline:
                raise TimeoutError(f"LoRA adapter {lora_name!r} still has requests after {timeout} s")
            await asyncio.sleep(0.05)

    async def _control_all(self, cls: type, *fields: Any) -> list[Any]:
        """The same control call on every replica; their replies in replica order."""
        return list(await asyncio.gather(*(self._control_call(cls, *fields, replica=i)
                                           for i in range(len(self.to_replicas)))))

    async def _control_call(self, cls: type, *fields: Any, replica: int = 0, timeout: float = 30.0) -> Any:
        if self.dead:
            raise RuntimeUnavailable(self.dead)
        req_id = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self._control[req_id] = fut
        try:
            await self.to_replicas[replica].send(encode(cls(req_id, *fields)))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._control.pop(req_id, None)

    # ------------------------------------------------------------------ results
    async def _recv_loop(self) -> None:
        while True:
            msg = decode(await self.recv.recv())
            if isinstance(msg, SchedulerHeartbeat):
                self.lifecycle.on_heartbeat(msg.replica)
            elif isinstance(msg, BatchStrOut):
                self._on_batch(msg)
            elif isinstance(msg, (FlushCacheOut, StatsOut, PinPrefixOut, UnpinPrefixOut, LoadLoraOut, UnloadLoraOut,
                                  UpdateWeightsOut, GetWeightsOut)):
                fut = self._control.get(msg.req_id)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif isinstance(msg, ErrorOut):
                for rid in msg.rids:
                    st = self.states.get(rid)
                    if st is not None:
                        st.result.finished = True
                        st.queue.put_nowait({"error": msg.message, "status": msg.status})

    def _on_batch(self, msg: BatchStrOut) -> None:
        now = time.perf_counter()
        for rec in msg.reqs:
            st = self.states.get(rec.rid)
            if st is None or st.finished:  # aborted by its handler meanwhile, or ended early (end_early)
                continue
            res = st.result
            last = res.last_token_at
            snapshot = res.apply(rec, now)
            p = rec.progress
            new_ids, fin = p.new_ids, p.finished_reason
            if new_ids:
                self.live.on_tokens(res.created, last, now, len(new_ids))
            if self.metrics and new_ids:
                self.metrics.on_tokens(res.created, last, now, len(new_ids))
            if fin is not None:
                self._count_finish(res, now, fin)
            st.queue.put_nowait(snapshot)

    def _count_finish(self, res: ResultBuilder, now: float, finish_reason: dict) -> None:
        """A request ended (its latest record applied to res): the live view and /metrics count it, as aborted
        only for a finish of type "abort"."""
        self.live.on_finish()
        if self.metrics:
            self.metrics.on_finish(now - res.created, res.queue_time, len(res.input_ids), res.cached_tokens,
                                   finish_reason.get("type") == "abort")

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    # ------------------------------------------------------------------ lifecycle
    def mark_dead(self, why: str) -> None:
        """A child process died: fail every waiting request now; new ones get 503."""
        self.lifecycle.dead = why
        self._fail_in_flight(why, RuntimeUnavailable, abort=False)
        for fut in self._control.values():
            if not fut.done():
                fut.set_exception(RuntimeUnavailable(why))

    def _fail_in_flight(self, message: str, error: type, abort: bool) -> int:
        """End every unfinished request now: its handler raises error(message) (RuntimeUnavailable,
        ShuttingDown: HTTP 503, an SSE error event then [DONE] for a stream). abort: also free its KV
        (the scheduler is alive). Returns how many were ended."""
        ended = [rid for rid, st in self.states.items() if not st.finished]
        for rid in ended:
            st = self.states[rid]
            st.result.finished = True
            st.queue.put_nowait({"error": message, "raise": error})
            if abort:
                self.abort(rid)
        return len(ended)

    def in_flight(self) -> int:
        """Requests (choices) not finished yet."""
        return sum(1 for st in self.states.values() if not st.finished)

    async def drain(self, timeout_s: float) -> tuple[int, int]:
        """SIGTERM / SIGINT: refuse new work from now on, let the requests in flight finish for up to
        timeout_s seconds (less if lifecycle.cut_now is set: a second signal), then fail the rest with
        ShuttingDown and wait (bounded) until their handlers have let go. Returns (in flight at the start,
        cut at the end)."""
        self.lifecycle.draining = True
        started = self.in_flight()
        deadline = time.monotonic() + timeout_s
        while self.in_flight() and time.monotonic() < deadline and not self.lifecycle.cut_now:
            await asyncio.sleep(0.05)
        why = ("a second signal ended the drain" if self.lifecycle.cut_now else
               f"the request did not finish within the {timeout_s:g} s drain (--graceful-shutdown-timeout)")
        cut = self._fail_in_flight(f"{SHUTTING_DOWN}: {why}", ShuttingDown, abort=True)
        deadline = time.monotonic() + 5.0  # handlers pop their state as they unwind (each one event-loop turn)
        while self.states and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return started, cut

    async def health(self) -> Optional[str]:
        """Why /health answers 503 (dead, draining, a scheduler stuck with work waiting), or None."""
        def in_flight() -> list[int]:  # per replica
            return self.placement.loads() if self.placement else [len(self.states)]

        if self.lifecycle.stalled(in_flight()) is not None:
            # This event loop may itself have been busy: let the receive loop read the heartbeats that
            # queued meanwhile before calling the scheduler stuck.
            await asyncio.sleep(0.1)
        return self.lifecycle.unhealthy(in_flight())
