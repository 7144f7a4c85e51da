"""In-process Engine (offline use, tests, benchmarks): SGLang's offline API over our scheduler.

    engine = Engine()                         # the embedded SmolLM2 model
    engine.generate("The capital of France is", {"max_new_tokens": 16, "temperature": 0})
    engine.shutdown()

The scheduler runs on its own thread (SchedulerLoop), so concurrent `generate` calls from several
threads are batched together continuously; a streaming call yields while others keep decoding.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Iterator, Optional, Union

from radixlang_runtime.limits import check_request
from radixlang_runtime.logprob_format import Decode, input_meta, normalize_logprob_args, output_meta
from radixlang_runtime.model.resolve import resolve_model_dir, served_name
from radixlang_runtime.model.runner import ModelRunner
from radixlang_runtime.sampling_params import SamplingParams, trim_at_stop
from radixlang_runtime.scheduler.loop import ReqUpdate, SchedulerLoop
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.scheduler.factory import build_scheduler, runtime_limits, scheduler_stats
from radixlang_runtime.scheduler.scheduler import Scheduler
from radixlang_runtime.server_args import ServerArgs, server_args_from_kwargs

logger = logging.getLogger(__name__)

Prompt = Union[str, list[str], None]
InputIds = Union[list[int], list[list[int]], None]
SamplingArg = Union[dict[str, Any], list[dict[str, Any]], None]


class Engine:
    def __init__(self, model_path: Optional[str] = None, **server_args: Any):
        from transformers import AutoTokenizer

        self.server_args: ServerArgs = server_args_from_kwargs(model_path, **server_args)
        args = self.server_args
        self.model_dir = resolve_model_dir(args.model_path, args.model_cache_dir)
        self.served_model_name = args.served_model_name or served_name(args.model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_path or self.model_dir)
        self._loop = SchedulerLoop(lambda: self._build_scheduler(args), args.stream_interval)
        self.scheduler: Scheduler = self._loop.scheduler
        self.runner: ModelRunner = self.scheduler.runner
        self.limits = runtime_limits(self.scheduler)
        self.context_len = self.limits.context_len
        self.vocab_size = self.limits.vocab_size

    def _build_scheduler(self, args: ServerArgs) -> Scheduler:
        """Runs on the scheduler thread: every torch op of the engine happens there."""
        return build_scheduler(args, self.model_dir, self.tokenizer)

    # ------------------------------------------------------------------ public API
    def generate(self, prompt: Prompt = None, sampling_params: SamplingArg = None, input_ids: InputIds = None,
                 stream: bool = False, rid: Union[str, list[str], None] = None, return_logprob: bool = False,
                 logprob_start_len: Union[int, list[int], None] = None, top_logprobs_num: int = 0,
                 return_text_in_logprobs: bool = False) -> Any:
        """Returns a dict (single prompt), a list of dicts (list input), or a generator of chunks.

        return_logprob adds meta_info input_token_logprobs (from logit position logprob_start_len,
        default 0) and output_token_logprobs (+ *_top_logprobs with top_logprobs_num), as the
        native protocol does; entries are [logprob, token_id, text | None]."""
        reqs, is_batch = self._make_reqs(prompt, sampling_params, input_ids, rid,
                                         (return_logprob, logprob_start_len, top_logprobs_num))
        decode = self._token_text if return_text_in_logprobs else None
        if stream:
            if is_batch or len(reqs) != 1:
                raise ValueError("stream=True takes a single prompt with n=1")
            return self._stream(reqs[0], decode)
        queues = [(req, self._loop.submit(req, stream=False)) for req in reqs]
        results = [self._result(req, q.get(), decode) for req, q in queues]
        return results if is_batch or len(results) > 1 else results[0]

    def abort_request(self, rid: str) -> None:
        """End request rid wherever it is (queued, prefilling, decoding): finish_reason {"type": "abort"}."""
        self._loop.abort(rid)

    abort = abort_request

    def check_integrity(self) -> None:
        """Every KV page free, cached or held by a live request (run on the scheduler thread)."""
        self._loop.call(lambda s: s.check_integrity())

    def flush_cache(self) -> bool:
        """Empty the radix cache. False (nothing done) while requests are queued or running."""
        return self._loop.call(lambda s: s.flush_cache())

    def get_stats(self) -> dict[str, Any]:
        """KV and scheduler counters, read on the scheduler thread."""
        return self._loop.call(scheduler_stats)

    def shutdown(self) -> None:
        self._loop.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ requests
    def _make_reqs(self, prompt: Prompt, sampling_params: SamplingArg, input_ids: InputIds, rid,
                   logprob: tuple[bool, Any, Any] = (False, None, 0)) -> tuple[list[Req], bool]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("pass exactly one of prompt / input_ids")
        if prompt is not None:
            is_batch = isinstance(prompt, list)
            prompts = prompt if is_batch else [prompt]
            if not all(isinstance(p, str) for p in prompts):
                raise ValueError("prompt must be a string or a list of strings")
            ids_list = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        else:
            is_batch = bool(input_ids) and isinstance(input_ids[0], list)
            ids_list = input_ids if is_batch else [input_ids]
        if isinstance(sampling_params, list):
            if len(sampling_params) != len(ids_list):
                raise ValueError(f"got {len(sampling_params)} sampling_params for {len(ids_list)} prompts")
            sps = [SamplingParams.from_dict(s) for s in sampling_params]
        else:
            sps = [SamplingParams.from_dict(sampling_params)] * len(ids_list)
        rids = rid if isinstance(rid, list) else [rid] * len(ids_list)
        return_logprob, start, top_num = logprob
        starts = start if isinstance(start, list) else [start] * len(ids_list)
        if len(rids) != len(ids_list) or len(starts) != len(ids_list):
            raise ValueError("rid / logprob_start_len lists must have one entry per prompt")
        reqs = []
        for i, (ids, sp) in enumerate(zip(ids_list, sps)):
            check_request(ids, sp, self.limits)
            k, top = normalize_logprob_args(len(ids), return_logprob, starts[i], top_num)
            for j in range(sp.n):
                base = rids[i] or uuid.uuid4().hex
                reqs.append(Req(rid=base if sp.n == 1 else f"{base}-{j}", input_ids=list(ids), sampling=sp,
                                return_logprob=return_logprob, logprob_start_len=k, top_logprobs_num=top))
        return reqs, is_batch

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    # ------------------------------------------------------------------ results
    def _stream(self, req: Req, decode: Decode = None) -> Iterator[dict]:
        q = self._loop.submit(req, stream=True)
        try:
            while True:
                upd = q.get()
                out = self._result(req, upd, decode, partial=upd.finished_reason is None and upd.error is None)
                yield out
                if out["meta_info"]["finish_reason"] is not None:
                    return
        finally:
            if not req.finished:  # the consumer stopped early: free the request's memory
                self._loop.abort(req.rid)

    def _result(self, req: Req, upd: ReqUpdate, decode: Decode = None, partial: bool = False) -> dict:
        if upd.error is not None:
            raise RuntimeError(f"request {req.rid} failed: {upd.error}")
        sp = req.sampling
        text = self.tokenizer.decode(upd.output_ids, skip_special_tokens=sp.skip_special_tokens)
        fin = upd.finished_reason
        if partial:
            text = text.rstrip("\ufffd")  # an incomplete UTF-8 character waits for its next token
        elif (trimmed := trim_at_stop(text, fin, sp.no_stop_trim)) is not None:
            text = trimmed
        end = req.finished_at or time.perf_counter()
        meta = {
            "id": req.rid,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(upd.output_ids),
            "cached_tokens": upd.cached_len,
            "num_retractions": req.num_retractions,
            "finish_reason": fin,
            "e2e_latency": end - req.created_at,
        }
        if req.return_logprob and upd.logprobs is not None:
            in_vals, in_top, out_vals, out_top = upd.logprobs
            meta.update(input_meta(req.input_ids, req.logprob_start_len, in_vals, in_top, req.top_logprobs_num, decode))
            meta.update(output_meta(out_vals, upd.output_ids, out_top, req.top_logprobs_num, decode))
        return {"text": text, "output_ids": upd.output_ids, "meta_info": meta}
