"""The one parser of generate inputs (torch-free): the Engine's `generate(...)` arguments and the
native /generate body (server, DSL ZeroMQ frontend) both become a list of GenerateItem here.

Input: text (a string or a list) or input_ids (a list of ints or a list of such lists), exactly one;
sampling_params, rid and logprob_start_len each one value or one per prompt. Every problem raises
ValueError naming it (HTTP 400). n > 1 fans out into n items with rids rid-0 .. rid-(n-1) (a missing
rid stays None: the receiver assigns one). `is_list`: the answer is a list (list input or n > 1).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

from radixlang_runtime.limits import RuntimeLimits, check_request
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
            raise ValueError(f"{name} has {len(value)} entries for {n} prompts")
        return value
    return [value] * n


def parse_generate_input(text: Any, input_ids: Any, sampling_params: Any, rid: Any, return_logprob: Any,
                         logprob_start_len: Any, top_logprobs_num: Any, return_text_in_logprobs: Any,
                         encode: Callable[[str], list[int]], limits: RuntimeLimits) -> tuple[list[GenerateItem], bool]:
    if (text is None) == (input_ids is None):
        raise ValueError("pass exactly one of text / input_ids")
    if text is not None:
        is_list = isinstance(text, list)
        texts = text if is_list else [text]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("text must be a string or a non-empty list of strings")
        prompts = [encode(t) for t in texts]
    else:
        is_list = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
        prompts = input_ids if is_list else [input_ids]
        if not isinstance(input_ids, list) or not all(isinstance(p, list) for p in prompts):
            raise ValueError("input_ids must be a list of integers or a list of such lists")
    sps = _listify(sampling_params, len(prompts), "sampling_params")
    rids = _listify(rid, len(prompts), "rid")
    starts = _listify(logprob_start_len, len(prompts), "logprob_start_len")
    if not isinstance(return_logprob, bool):
        raise ValueError("return_logprob must be a boolean")
    out = []
    for p, sp_dict, r, start in zip(prompts, sps, rids, starts):
        if r is not None and not isinstance(r, str):
            raise ValueError("rid must be a string")
        if not isinstance(sp_dict, (dict, type(None))):
            raise ValueError("sampling_params must be an object")
        sp = SamplingParams.from_dict(sp_dict)
        check_request(p, sp, limits)
        lp = None
        if return_logprob:
            k, top = normalize_logprob_args(len(p), True, start, top_logprobs_num)
            lp = LogprobRequest(k, top, bool(return_text_in_logprobs))
        for j in range(sp.n):
            out.append(GenerateItem(list(p), sp, r if sp.n == 1 or r is None else f"{r}-{j}", lp))
    return out, is_list or len(out) > 1
