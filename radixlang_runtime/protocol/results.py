"""One builder of generate results ({"text", "output_ids", "meta_info"}) for the Engine and the server.

A ResultBuilder follows one request through its detokenized records (ReqStrOut) and returns a
snapshot after each. Snapshots are deltas: "text" and "output_ids" are what is new since the previous
one ("text_trim": n, only in a final snapshot, says the last n characters of the text so far were cut by
a stop string: a stream that showed them keeps them). meta_info carries the totals so far. With
logprobs, a streaming request's output logprob lists are the delta since the previous snapshot (input
ones come once, in the first, and `output_token_logprobs_length` is cumulative); a non-streaming one
gets them whole. `Cumulative` folds the deltas into the whole text and ids where a protocol asks for
them (final results, /generate's SSE without --incremental-streaming-output, the Engine's API).
Torch-free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from radixlang_runtime.protocol.logprob_format import input_meta, output_meta
from radixlang_runtime.protocol.messages import ReqProgress, ReqStrOut


@dataclass
class LogprobRequest:
    """What a request asked for (normalize_logprob_args validated it)."""

    start: int = 0
    top_num: int = 0
    with_text: bool = False
    ranks: bool = False  # meta_info input_token_ranks too (logprob_format.input_meta)


@dataclass
class ResultBuilder:
    rid: str
    input_ids: list[int]
    stream: bool
    logprob: Optional[LogprobRequest]
    token_text: Callable[[int], str]  # one token's text (return_text_in_logprobs)
    output_len: int = 0  # output tokens received so far
    finished: bool = False
    created: float = field(default_factory=time.perf_counter)
    last_token_at: Optional[float] = None
    queue_time: float = 0.0  # the latest record's (meta_info queue_time)
    cached_tokens: int = 0  # the latest record's
    # logprobs received so far (non-streaming requests return them whole at the end)
    in_vals: list = field(default_factory=list)
    in_top: list = field(default_factory=list)
    in_ranks: list = field(default_factory=list)
    out_vals: list = field(default_factory=list)
    out_top: list = field(default_factory=list)
    out_ids: list = field(default_factory=list)  # non-streaming with logprobs: the ids they align with
    input_emitted: bool = False

    def apply(self, rec: ReqStrOut, now: float) -> dict:
        """Take one record of this request's progress; return the (delta) snapshot."""
        p = rec.progress
        new_ids = p.new_ids
        self.output_len += len(new_ids)
        if new_ids:
            self.last_token_at = now
        fin = p.finished_reason
        self.finished = fin is not None
        self.queue_time, self.cached_tokens = p.queue_time, p.cached_tokens
        meta = {
            "id": self.rid, "finish_reason": fin, "prompt_tokens": len(self.input_ids),
            "completion_tokens": p.completion_tokens, "cached_tokens": p.cached_tokens,
            "num_retractions": p.num_retractions, "e2e_latency": now - self.created,
            # seconds from arrival at the scheduler to its first admission to a prefill (0 until admitted)
            "queue_time": p.queue_time,
            # constrained decoding: tokens jump-forward appended, and forward passes
            "forced_tokens": p.forced_tokens, "forward_passes": p.forward_passes,
            # n-gram speculation: draft tokens verified, and accepted
            "spec_draft_tokens": p.spec_draft_tokens, "spec_accepted_tokens": p.spec_accepted_tokens,
        }
        if self.logprob is not None and p.output_logprobs is not None:
            self._logprob_meta(p, meta)
        if p.hidden_states is not None:  # return_hidden_states (scheduler/hidden_states.py), the final record
            meta["hidden_states"] = p.hidden_states
        out = {"text": rec.text, "output_ids": new_ids, "meta_info": meta}
        if p.embedding is not None:  # a pooling request's vector (its final record)
            out["embedding"] = p.embedding
        if rec.trim:
            out["text_trim"] = rec.trim
        return out

    def _logprob_meta(self, p: ReqProgress, meta: dict) -> None:
        lp = self.logprob
        decode = self.token_text if lp.with_text else None
        if p.input_logprobs is not None:
            self.in_vals, self.in_top = p.input_logprobs, p.input_top_logprobs or []
            self.in_ranks = p.input_ranks or []
        ranks = self.in_ranks if lp.ranks else None
        out_vals, out_top = p.output_logprobs or [], p.output_top_logprobs or []
        if self.stream:
            if not self.input_emitted:
                meta.update(input_meta(self.input_ids, lp.start, self.in_vals, self.in_top, lp.top_num, decode,
                                       ranks))
                self.input_emitted = True
            meta.update(output_meta(out_vals, p.new_ids, out_top, lp.top_num, decode))
            meta["output_token_logprobs_length"] = self.output_len
        else:
            self.out_vals += out_vals
            self.out_top += out_top
            self.out_ids += p.new_ids
            meta.update(input_meta(self.input_ids, lp.start, self.in_vals, self.in_top, lp.top_num, decode,
                                   ranks))
            meta.update(output_meta(self.out_vals, self.out_ids, self.out_top, lp.top_num, decode))


@dataclass
class Cumulative:
    """One request's delta snapshots folded into the whole text and output ids so far."""

    pieces: list[str] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)

    def add(self, out: dict) -> None:
        if out.get("text_trim"):
            text = "".join(self.pieces)
            self.pieces = [text[: len(text) - out["text_trim"]]]
        self.pieces.append(out["text"])
        self.output_ids.extend(out["output_ids"])

    def snapshot(self, out: dict) -> dict:
        """out (the latest delta snapshot, already added) with the whole text and ids in their place."""
        text = "".join(self.pieces)
        self.pieces = [text]
        rest = {k: v for k, v in out.items() if k != "text_trim"}
        return {**rest, "text": text, "output_ids": list(self.output_ids)}
