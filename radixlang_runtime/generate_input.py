"""The one parser of generate inputs (torch-free): the Engine's `generate(...)` arguments and the
native /generate body (server, DSL ZeroMQ frontend) both become a list of GenerateItem here.

Input: text (a string or a list) or input_ids (a list of ints or a list of such lists), exactly one;
sampling_params, rid and logprob_start_len each one value or one per prompt. Every problem raises
ValueError naming it (HTTP 400). n > 1 fans out into n items with rids rid-0 .. rid-(n-1) (a missing
rid stays None: the receiver assigns one). `is_list`: the answer is a list (list input or n > 1).
Field types are checked by limits.need_*; at most MAX_BATCH prompts and prompts x n <= MAX_BATCH
requests, rids of at most MAX_RID_LEN characters.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

from radixlang_runtime.limits import (MAX_BATCH, MAX_RID_LEN, FieldError, RuntimeLimits, check_request, need_bool,
                                      need_str)
from radixlang_runtime.logprob_format import normalize_logprob_args
from radixlang_runtime.results import LogprobRequest
from radixlang_runtime.sampling_params import SamplingParams


class GenerateItem(NamedTuple):
    input_ids: list[int]
    sampling: SamplingParams
    rid: Optional[str]
    logprob: Optional[LogprobRequest]  # None: no logprobs asked


def _listify(value: Any, n: int, name: str) -> list:
    if isinstance(value, list):
        if len(value) != n:
            raise FieldError(name, f"{name} has {len(value)} entries for {n} prompts")
        return value
    return [value] * n


def _prompts(text: Any, input_ids: Any, encode: Callable[[str], list[int]]) -> tuple[list[list[int]], bool]:
    """text / input_ids -> (one id list per prompt, whether the input was a list). Ids are range-checked
    later (check_request, after the length check that bounds the work)."""
    if (text is None) == (input_ids is None):
        raise ValueError("pass exactly one of text / input_ids")
    if text is not None:
        is_list = isinstance(text, list)
        texts = text if is_list else [text]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise FieldError("text", "text must be a string or a non-empty list of strings")
        if len(texts) > MAX_BATCH:
            raise FieldError("text", f"text may hold at most {MAX_BATCH} prompts, got {len(texts)}")
        for i, t in enumerate(texts):
            need_str(t, f"text[{i}]" if is_list else "text")
        return [encode(t) for t in texts], is_list
    is_list = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
    prompts = input_ids if is_list else [input_ids]
    if not isinstance(input_ids, list) or not all(isinstance(p, list) for p in prompts):
        raise FieldError("input_ids", "input_ids must be a list of integers or a list of such lists")
    if len(prompts) > MAX_BATCH:
        raise FieldError("input_ids", f"input_ids may hold at most {MAX_BATCH} prompts, got {len(prompts)}")
    return prompts, is_list


def parse_generate_input(text: Any, input_ids: Any, sampling_params: Any, rid: Any, return_logprob: Any,
                         logprob_start_len: Any, top_logprobs_num: Any, return_text_in_logprobs: Any,
                         encode: Callable[[str], list[int]], limits: RuntimeLimits) -> tuple[list[GenerateItem], bool]:
    prompts, is_list = _prompts(text, input_ids, encode)
    sps = _listify(sampling_params, len(prompts), "sampling_params")
    rids = _listify(rid, len(prompts), "rid")
    starts = _listify(logprob_start_len, len(prompts), "logprob_start_len")
    need_bool(return_logprob, "return_logprob")
    with_text = return_text_in_logprobs is not None and need_bool(return_text_in_logprobs, "return_text_in_logprobs")
    out = []
    for p, sp_dict, r, start in zip(prompts, sps, rids, starts):
        if r is not None:
            need_str(r, "rid", MAX_RID_LEN)
        if not isinstance(sp_dict, (dict, type(None))):
            raise FieldError("sampling_params", "sampling_params must be an object")
        sp = SamplingParams.from_dict(sp_dict)
        if len(out) + sp.n > MAX_BATCH:
            raise FieldError("n", f"prompts x n must be at most {MAX_BATCH} requests per body")
        check_request(p, sp, limits)
        k, top = normalize_logprob_args(len(p), return_logprob, start, top_logprobs_num)  # types even when unused
        lp = LogprobRequest(k, top, with_text) if return_logprob else None
        for j in range(sp.n):
            out.append(GenerateItem(list(p), sp, r if sp.n == 1 or r is None else f"{r}-{j}", lp))
    return out, is_list or len(out) > 1
