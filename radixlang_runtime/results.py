"""One builder of generate results ({"text", "output_ids", "meta_info"}) for the Engine and the server.

A ResultBuilder follows one request through its detokenized progress messages (BatchStrOut entries)
and returns a snapshot after each. Text and output_ids are cumulative. With logprobs, a streaming
request's output logprob lists are the delta since the previous snapshot (input ones come once, in
the first, and `output_token_logprobs_length` is cumulative); a non-streaming one gets them whole.
Torch-free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from radixlang_runtime.logprob_format import input_meta, output_meta
from radixlang_runtime.messages import BatchStrOut


@dataclass
class LogprobRequest:
    """What a request asked for (normalize_logprob_args validated it)."""

    start: int = 0
    top_num: int = 0
    with_text: bool = False


@dataclass
class ResultBuilder:
    rid: str
    input_ids: list[int]
    stream: bool
    logprob: Optional[LogprobRequest]
    token_text: Callable[[int], str]  # one token's text (return_text_in_logprobs)
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    created: float = field(default_factory=time.perf_counter)
    last_token_at: Optional[float] = None
    # logprobs received so far (non-streaming requests return them whole at the end)
    in_vals: list = field(default_factory=list)
    in_top: list = field(default_factory=list)
    out_vals: list = field(default_factory=list)
    out_top: list = field(default_factory=list)
    input_emitted: bool = False

    def apply(self, msg: BatchStrOut, i: int, now: float) -> dict:
        """Take entry i of msg (this request's progress); return the snapshot."""
        self.text = msg.texts[i] if msg.text_is_full[i] else self.text + msg.texts[i]
        new_ids = msg.new_ids[i]
        self.output_ids.extend(new_ids)
        if new_ids:
            self.last_token_at = now
        fin = msg.finished_reasons[i]
        self.finished = fin is not None
        meta = {
            "id": self.rid, "finish_reason": fin, "prompt_tokens": msg.prompt_tokens[i],
            "completion_tokens": msg.completion_tokens[i], "cached_tokens": msg.cached_tokens[i],
            "num_retractions": msg.num_retractions[i], "e2e_latency": now - self.created,
        }
        if msg.forced_tokens:  # constrained decoding: tokens jump-forward appended, and forward passes
            meta["forced_tokens"], meta["forward_passes"] = msg.forced_tokens[i], msg.forward_passes[i]
        if msg.spec_draft_tokens:  # n-gram speculation: draft tokens verified, and accepted
            meta["spec_draft_tokens"] = msg.spec_draft_tokens[i]
            meta["spec_accepted_tokens"] = msg.spec_accepted_tokens[i]
        if self.logprob is not None and msg.output_logprobs:
            self._logprob_meta(msg, i, new_ids, meta)
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": meta}

    def _logprob_meta(self, msg: BatchStrOut, i: int, new_ids: list[int], meta: dict) -> None:
        lp = self.logprob
        decode = self.token_text if lp.with_text else None
        if msg.input_logprobs[i] is not None:
            self.in_vals, self.in_top = msg.input_logprobs[i], msg.input_top_logprobs[i] or []
        out_vals, out_top = msg.output_logprobs[i] or [], msg.output_top_logprobs[i] or []
        if self.stream:
            if not self.input_emitted:
                meta.update(input_meta(self.input_ids, lp.start, self.in_vals, self.in_top, lp.top_num, decode))
                self.input_emitted = True
            meta.update(output_meta(out_vals, new_ids, out_top, lp.top_num, decode))
            meta["output_token_logprobs_length"] = len(self.output_ids)
        else:
            self.out_vals += out_vals
            self.out_top += out_top
            meta.update(input_meta(self.input_ids, lp.start, self.in_vals, self.in_top, lp.top_num, decode))
            meta.update(output_meta(self.out_vals, self.output_ids, self.out_top, lp.top_num, decode))
