"""In-process Engine (offline use, tests, benchmarks): SGLang's offline API over our scheduler.

    engine = Engine()                         # the embedded SmolLM2 model
    engine.generate("The capital of France is", {"max_new_tokens": 16, "temperature": 0})
    engine.shutdown()

The scheduler runs on its own thread (ThreadedLoop around the RequestLoop the server's scheduler
process runs too), so concurrent `generate` calls from several threads are batched together
continuously; a streaming call yields while others keep decoding. Text comes from the same
incremental detokenizer and meta_info from the same ResultBuilder as the server's. A request that an
internal fault ends raises RuntimeError carrying the message (a streaming iterator raises it); no call
waits on a dead scheduler.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Optional, Union

from radixlang_runtime.detokenize import IncrementalDetokenizer
from radixlang_runtime.protocol.generate_input import parse_generate_input, parse_lora_path, parse_priority
from radixlang_runtime.lora_spec import lora_id_of
from radixlang_runtime.mem.hicache import check_flush_tiers
from radixlang_runtime.protocol.messages import AbortReq, TokenizedGenerateReq
from radixlang_runtime.model.loader.resolve import cache_root, resolve_model_dir, served_name
from radixlang_runtime.model.executor.runner import ModelRunner
from radixlang_runtime.prompt_encoder import PromptEncoder
from radixlang_runtime.protocol.results import Cumulative, LogprobRequest, ResultBuilder
from radixlang_runtime.multimodal.image_prep import image_prep, image_token_text
from radixlang_runtime.wiring import build_scheduler, runtime_limits, scheduler_stats
from radixlang_runtime.scheduler.loop_thread import ThreadedLoop
from radixlang_runtime.scheduler.scheduler import Scheduler
from radixlang_runtime.server_args import ServerArgs, server_args_from_kwargs

logger = logging.getLogger(__name__)

Prompt = Union[str, list[str], None]
InputIds = Union[list[int], list[list[int]], None]
SamplingArg = Union[dict[str, Any], list[dict[str, Any]], None]


class Engine:
    def __init__(self, model_path: Optional[str] = None, **server_args: Any):
        from radixlang_runtime.model.loader.tokenizer import load_remembered

        self.server_args: ServerArgs = server_args_from_kwargs(model_path, **server_args)
        args = self.server_args
        if args.dp_size > 1 or args.nnodes > 1:
            raise ValueError("the in-process Engine runs one replica on this machine: dp_size and nnodes must be 1 "
                             "(launch_server serves data parallelism and multi-node groups)")
        if args.disaggregation_mode != "null":
            raise ValueError(f"disaggregation_mode {args.disaggregation_mode} is served by launch_server only "
                             "(the in-process Engine runs co-located)")
        self._tp_procs: list = []
        if args.tp_size > 1:  # rank 0 is the scheduler thread; ranks 1.. are worker processes
            from radixlang_runtime.model.executor.tp_worker import free_local_addr, spawn_tp_workers

            args = self.server_args = args.replace(dist_init_addr=args.dist_init_addr or free_local_addr())
            self._tp_procs = spawn_tp_workers(args, list(range(1, args.tp_size)))
        self.model_dir = resolve_model_dir(args.model_path, args.model_cache_dir)
        self.served_model_name = args.served_model_name or served_name(args.model_path)
        self.tokenizer = load_remembered(args.tokenizer_path or self.model_dir, cache_root())
        self._encoder = PromptEncoder(self.tokenizer)
        self._detok = IncrementalDetokenizer(self.tokenizer)
        try:
            self._loop = ThreadedLoop(lambda: self._build_scheduler(args), args.stream_interval, scheduler_stats)
        except BaseException:
            self._stop_tp_workers()
            raise
        self.scheduler: Scheduler = self._loop.scheduler
        self.runner: ModelRunner = self.scheduler.runner
        self.limits = runtime_limits(self.scheduler, self.tokenizer)
        self.weight_version = "default"  # SGLang's name for the weights served; an update may set it
        self.context_len = self.limits.context_len
        self.vocab_size = self.limits.vocab_size
        # None: the model takes no images. In process, the caller's own files are its images to name
        local = args if args.allowed_local_media_path else args.replace(allowed_local_media_path="/")
        self._images = image_prep(self.model_dir, self.limits, local, self.tokenizer)
        self.image_token = image_token_text(self.tokenizer, self.limits)  # what sgl.image writes (None: no images)

    def _build_scheduler(self, args: ServerArgs) -> Scheduler:
        """Runs on the scheduler thread: every torch op of the engine happens there."""
        return build_scheduler(args, self.model_dir, self.tokenizer,
                               peers_alive=lambda: all(p.is_alive() for p in self._tp_procs))

    # ------------------------------------------------------------------ public API
    def generate(self, prompt: Prompt = None, sampling_params: SamplingArg = None, input_ids: InputIds = None,
                 stream: bool = False, rid: Union[str, list[str], None] = None, return_logprob: bool = False,
                 logprob_start_len: Union[int, list[int], None] = None, top_logprobs_num: int = 0,
                 return_text_in_logprobs: bool = False, lora_path: Union[str, list, None] = None,
                 priority: Optional[int] = None, cache_salt: Union[str, list[Optional[str]], None] = None,
                 return_hidden_states: Union[bool, list[bool]] = False, image_data: Any = None) -> Any:
        """Returns a dict (single prompt), a list of dicts (list input), or a generator of chunks.

        return_logprob adds meta_info input_token_logprobs (from logit position logprob_start_len,
        default 0) and output_token_logprobs (+ *_top_logprobs with top_logprobs_num), as the
        native protocol does; entries are [logprob, token_id, text | None]. lora_path: the name of a
        --lora-paths adapter every request of the call runs (None: the base model), or one name (or None)
        per prompt. priority: every request's, with --enable-priority-scheduling (preemption.PriorityRule).
        cache_salt: the prefix cache namespace of the call's requests (None: the shared one); return_hidden_states:
        meta_info hidden_states, with enable_return_hidden_states; each one value, or a list of one per prompt of a
        list of prompts (request_extras.prompt_extras). image_data: SGLang's, for a model that takes images (an
        image or a list of them per prompt: a path, a URL, a data URL or base64; generate_input._prompt_images)."""
        extras = {"cache_salt": cache_salt, "return_hidden_states": return_hidden_states}
        reqs, is_batch = self._make_reqs(prompt, sampling_params, input_ids, rid,
                                         (return_logprob, logprob_start_len, top_logprobs_num), lora_path, priority,
                                         extras, image_data)
        lp_text = return_text_in_logprobs
        if stream:
            if is_batch or len(reqs) != 1:
                raise ValueError("stream=True takes a single prompt with n=1")
            return self._stream(reqs[0], lp_text)
        results = self._finals([self._submit(msg, lp_text) for msg in reqs])
        return results if is_batch or len(results) > 1 else results[0]

    def encode(self, prompt: Prompt = None, input_ids: InputIds = None, rid: Optional[str] = None) -> Any:
        """SGLang's Engine.encode on a pooling model (is_embedding=True): {"embedding", "meta_info"} per prompt (a
        list for list input), as the server's /encode answers (docs/EMBEDDINGS.md)."""
        from radixlang_runtime.pooling import finish_embedding
        from radixlang_runtime.protocol.pooling_input import embedding_encoder, parse_encode_body

        cfg = self.runner.pooling
        body = {k: v for k, v in (("text", prompt), ("input_ids", input_ids), ("rid", rid)) if v is not None}
        call = parse_encode_body(body, cfg, embedding_encoder(self.tokenizer, cfg), self.limits, uuid.uuid4().hex)
        outs = self._finals([self._submit(r.to_message(), False) for r in call.reqs])
        items = [{"embedding": finish_embedding(o["embedding"], cfg.normalize), "meta_info": o["meta_info"]}
                 for o in outs]
        return items if call.as_list else items[0]

    def _finals(self, pending: list) -> list[dict]:
        """Each submitted request's result, in order; a failure ends the call and frees what the others hold."""
        try:
            return [self._final(q, builder) for q, builder in pending]
        finally:
            for _, builder in pending:
                if not builder.finished:
                    self._loop.put(AbortReq(builder.rid))

    def load_lora_adapter(self, lora_name: str, lora_path: str) -> int:
        """Serve another LoRA adapter (a peft directory) under lora_name; returns its id. Its radix keys are
        its own, also when the name was served before (a reload gets a new id)."""
        names = list(self.limits.lora_adapters)
        if lora_name in names:
            raise ValueError(f"LoRA adapter {lora_name!r} is already loaded")
        lora_id = self._loop.call(lambda s: s.load_lora(lora_name, lora_path))
        names += [None] * (lora_id - 1 - len(names)) + [lora_name]  # position = id - 1 (lora_spec.py)
        self.limits = dataclasses.replace(self.limits, lora_adapters=tuple(names))
        return lora_id

    def unload_lora_adapter(self, lora_name: str, timeout: float = 60.0) -> None:
        """Stop serving lora_name: new requests naming it are refused at once; its weights go once its queued
        and running requests have ended (TimeoutError after `timeout` seconds, the name then stays refused)."""
        lora_id = lora_id_of(lora_name, self.limits.lora_adapters)
        names = list(self.limits.lora_adapters)
        names[lora_id - 1] = None
        self.limits = dataclasses.replace(self.limits, lora_adapters=tuple(names))

        deadline = time.monotonic() + timeout
        while not self._loop.call(lambda s: s.drop_lora_if_unused(lora_id)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"LoRA adapter {lora_name!r} still has requests after {timeout} s")
            time.sleep(0.02)

    def _update_weights(self, update, what: str, weight_version: Optional[str], timeout: float) -> tuple[bool, str]:
        """Run update(runner) once the scheduler is idle (scheduler/weight_sync.py), then flush the prefix cache."""
        from radixlang_runtime.scheduler.weight_sync import BUSY, apply_weight_update

        deadline = time.monotonic() + timeout
        while True:
            ok, message = self._loop.call(lambda s: apply_weight_update(s, update, what))
            if message != BUSY or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if ok and weight_version is not None:
            self.weight_version = weight_version
        return ok, message

    def update_weights_from_disk(self, model_path: str, load_format: Optional[str] = None,
                                 weight_version: Optional[str] = None, timeout: float = 600.0) -> tuple[bool, str, int]:
        """SGLang's: replace the served weights with model_path's checkpoint (same config, same tensor names and
        shapes; model/executor/weight_update.py) once the running requests have ended; (success, message,
        num_paused_requests). A refusal names why and leaves the old weights in place."""
        from radixlang_runtime.model.executor.weight_update import update_from_disk

        ok, message = self._update_weights(lambda r: update_from_disk(r, model_path, load_format), model_path,
                                           weight_version, timeout)
        return ok, message, 0

    def update_weights_from_tensor(self, named_tensors: list, load_format: Optional[str] = None,
                                   flush_cache: bool = True, weight_version: Optional[str] = None,
                                   timeout: float = 600.0) -> tuple[bool, str]:
        """SGLang's, in process: named_tensors is a list of (checkpoint name, torch.Tensor) holding every tensor
        of the served checkpoint; (success, message). The prefix cache is always flushed."""
        from radixlang_runtime.model.executor.weight_update import update_from_tensors

        if load_format not in (None, "auto"):
            return False, f"load_format {load_format!r} is not supported for tensors (None)"
        if not flush_cache:
            return False, "flush_cache False is not supported: the prefix cache holds the old weights' K/V"
        named = list(named_tensors)
        return self._update_weights(lambda r: update_from_tensors(r, named), "tensors", weight_version, timeout)

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list:
        """A served parameter by its checkpoint name: its first truncate_size entries along dim 0 as float lists
        (model/executor/weight_read.py); ValueError naming it when there is none."""
        from radixlang_runtime.model.executor.weight_read import weights_by_name

        return self._loop.call(lambda s: weights_by_name(s.runner, name, truncate_size))

    def abort_request(self, rid: str) -> None:
        """End request rid wherever it is (queued, prefilling, decoding): finish_reason {"type": "abort"}."""
        self._loop.put(AbortReq(rid))

    abort = abort_request

    def check_integrity(self) -> None:
        """Every KV page free, cached or held by a live request (run on the scheduler thread)."""
        self._loop.call(lambda s: s.check_integrity())

    def flush_cache(self, tiers: Optional[list[str]] = None) -> bool:
        """Empty the radix cache and the hierarchical cache's tiers (tiers: which of "l1", "l2", "l3";
        None: all). False (nothing done) while requests are queued or running, or a prefix is pinned."""
        tiers = check_flush_tiers(tiers)
        return self._loop.call(lambda s: s.flush_cache(tiers))

    def get_stats(self) -> dict[str, Any]:
        """KV and scheduler counters, read on the scheduler thread."""
        return self._loop.call(scheduler_stats)

    def pin_prefix(self, text: Optional[str] = None, input_ids: Optional[list[int]] = None,
                   ttl_s: Optional[float] = None) -> dict[str, Any]:
        """Lock the cached part of a prefix (text or input_ids) in the radix cache until
        `unpin_prefix(pin_id)` or ttl_s seconds: evictions cannot take it. Only what is cached is
        locked (generate it with max_new_tokens=0 first). Returns {"pin_id", "pinned_len", "input_len"}.
        While a pin exists flush_cache refuses."""
        if (text is None) == (input_ids is None):
            raise ValueError("pin_prefix takes text or input_ids (one of them)")
        ids = self._encode(text) if text is not None else list(input_ids)
        pin_id, pinned_len = self._loop.call(lambda s: s.kv.pin(ids, ttl_s))
        return {"pin_id": pin_id, "pinned_len": pinned_len, "input_len": len(ids)}

    def unpin_prefix(self, pin_id: str) -> bool:
        """Release a pin; False when there is none by that id (unknown, unpinned or expired)."""
        return self._loop.call(lambda s: s.kv.unpin(pin_id))

    def shutdown(self) -> None:
        if self._loop.is_alive():  # the hierarchical cache keeps what only L1 held (bounded wait)
            try:
                self._loop.call(lambda s: s.kv.close_tiers(), timeout=60.0)
            except Exception:  # noqa: BLE001 - shutdown goes on; the tiers only lose what L1 held
                logger.exception("hicache: storing the pool's pages at shutdown failed")
        self._loop.close()
        if self.runner.kv_pool.prefaulter is not None:  # its thread would otherwise last until the pool is freed
            self.runner.kv_pool.prefaulter.close()
        if self.scheduler.overlap is not None:  # its forward thread ends too (the loop thread is done with it)
            self.scheduler.overlap.thread.close()
        if self._tp_procs and self.runner.tp is not None and not self._loop.is_alive():
            self.runner.tp.close()  # STOP to the workers (the loop thread is done with the group)
        self._stop_tp_workers()

    def _stop_tp_workers(self, timeout: float = 10.0) -> None:
        for p in self._tp_procs:
            p.join(timeout=timeout)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        self._tp_procs = []

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ requests
    def _make_reqs(self, prompt: Prompt, sampling_params: SamplingArg, input_ids: InputIds, rid,
                   logprob: tuple[bool, Any, Any] = (False, None, 0),
                   lora_path: Union[str, list, None] = None,
                   priority: Optional[int] = None,
                   extras: Mapping[str, Any] = MappingProxyType({}),
                   image_data: Any = None) -> tuple[list[TokenizedGenerateReq], bool]:
        """The one intake (generate_input.py, the server's too): one message per sample."""
        return_logprob, start, top_num = logprob
        lora_id = parse_lora_path(lora_path, self.limits)
        reqs, is_list = parse_generate_input(prompt, input_ids, sampling_params, rid, return_logprob, start,
                                             top_num, False, self._encode, self.limits, lora_id=lora_id,
                                             priority=parse_priority(priority, self.limits),
                                             encode_words=self._encoder.encode_plain, extras=extras,
                                             image_data=image_data,
                                             attach=self._images.attach if self._images is not None else None)
        return [r.to_message() for r in reqs], is_list

    def _encode(self, text: str) -> list[int]:
        return self._encoder.encode(text)

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    # ------------------------------------------------------------------ results
    def _submit(self, msg: TokenizedGenerateReq, lp_text: bool):
        lp = LogprobRequest(msg.logprob_start_len, msg.top_logprobs_num, lp_text) if msg.return_logprob else None
        builder = ResultBuilder(msg.rid, msg.input_ids, msg.stream, lp, self._token_text)
        return self._loop.submit(msg), builder

    def _next(self, q, builder: ResultBuilder) -> dict:
        """The request's next (delta) snapshot; raises RuntimeError when a fault ended it."""
        kind, payload = self._loop.get(q)
        if kind == "error":
            self._detok.forget(builder.rid)
            builder.finished = True
            status, message = payload
            if status == 400:  # the request's own fault (its grammar)
                raise ValueError(message)
            raise RuntimeError(f"request {builder.rid} failed: {message}")
        out, failed = self._detok.update(payload)
        if failed:
            builder.finished = True
            self._loop.put(AbortReq(builder.rid))  # it may still be running (streaming)
            raise RuntimeError(f"request {builder.rid} failed: {failed[builder.rid]}")
        return builder.apply(out.reqs[0], time.perf_counter())

    def _final(self, q, builder: ResultBuilder) -> dict:
        whole = Cumulative()
        while True:
            out = self._next(q, builder)
            whole.add(out)
            if builder.finished:
                return whole.snapshot(out)

    def _stream(self, msg: TokenizedGenerateReq, lp_text: bool) -> Iterator[dict]:
        msg.stream = True
        q, builder = self._submit(msg, lp_text)
        try:
            whole = Cumulative()  # SGLang's Engine streams the whole text so far
            while not builder.finished:
                out = self._next(q, builder)
                whole.add(out)
                yield whole.snapshot(out)
        finally:
            if not builder.finished:  # the consumer stopped early: free the request's memory
                builder.finished = True
                self._detok.forget(builder.rid)
                self._loop.put(AbortReq(builder.rid))
