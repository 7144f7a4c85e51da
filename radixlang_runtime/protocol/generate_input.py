"""The one intake of generate requests (torch-free): every entrance turns its input into a list of
GenerateRequest here, each one runtime request (one sample) parsed and validated once.

Entrances: the Engine's `generate(...)` arguments, the native /generate body (HTTP and the DSL's ZeroMQ
frontend: parse_generate_body), and the OpenAI routes after rendering (openai_requests: prompts already
tokenized, sampling fields already mapped to native names). All end in `fan_out`, the one place of:
- n fan-out: a prompt with n > 1 becomes n requests (choice index = prompt * n + sample);
- rid rules: a client rid names a prompt's one request (n == 1) or its samples rid-0 .. rid-(n-1);
  a missing rid becomes f"{base_rid}-{index}" when the entrance names a base (OpenAI: cmpl-<hex>),
  else a fresh uuid4 hex; duplicate rids within one call are refused (FieldError `rid`);
- limits: at most MAX_BATCH prompts and prompts x n <= MAX_BATCH requests, rids of <= MAX_RID_LEN chars;
- PD bootstrap fields (parse_bootstrap: bootstrap_host / _port / _room, added by the PD router): required on
  a prefill or decode server, refused on a co-located one; with them one prompt and n == 1 only.
`GenerateRequest.to_message` is the one assembly of the TokenizedGenerateReq the scheduler receives: the
sampling parameters as validated (SamplingParams.to_wire) and the grammar spec built during validation, so
the scheduler decodes them trusted (SamplingParams.from_wire) and never validates or compiles a spec again.
Every problem raises ValueError naming it (HTTP 400).
"""

from __future__ import annotations

import copy
import uuid
from collections import Counter
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional, Union

from radixlang_runtime.protocol.bootstrap_peers import Bootstrap, check_host
from radixlang_runtime.protocol.reasoning_watch import ChatWatch
from radixlang_runtime.protocol.limits import (MAX_BATCH, MAX_RID_LEN, FieldError, RuntimeLimits, check_request,
                                               need_bool, need_int, need_str, per_prompt, show)
from radixlang_runtime.protocol.logprob_format import normalize_logprob_args
from radixlang_runtime.lora_spec import lora_id_of
from radixlang_runtime.mem.cache_namespace import namespaced, salt_key
from radixlang_runtime.protocol.image_input import ImageInput, with_pads
from radixlang_runtime.protocol.messages import TokenizedGenerateReq
from radixlang_runtime.protocol.request_extras import RequestExtras, prompt_extras
from radixlang_runtime.pooling import PoolSpec
from radixlang_runtime.protocol.results import LogprobRequest
from radixlang_runtime.protocol.sampling_params import SamplingParams

Encode = Callable[[str], list[int]]
# (a prompt's ids, its image references, the field's name) -> (ids with their placeholders expanded, ImageInputs)
Attach = Callable[[list[int], list, str], tuple[list[int], list[ImageInput]]]
# (prompt index, its token ids) -> the prompt's logprob request (None: no logprobs)
LogprobOf = Callable[[int, list[int]], Optional[LogprobRequest]]


BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


def parse_bootstrap(body: dict, mode: str, peers: tuple = ()) -> Optional[Bootstrap]:
    """The router's three fields of a body, checked against the server's disaggregation_mode, before anything
    connects: the host names one machine (bootstrap_peers.check_host), and on a decode with an allow-list
    (peers: --disaggregation-prefill-peers) host:port is one of them."""
    given = [f for f in BOOTSTRAP_FIELDS if body.get(f) is not None]
    if mode == "null":
        if given:
            raise FieldError(given[0], f"{given[0]} is for prefill-decode disaggregation; this server runs "
                                       "co-located (disaggregation_mode null)")
        return None
    if missing := [f for f in BOOTSTRAP_FIELDS if body.get(f) is None]:
        raise FieldError(missing[0], f"this server runs disaggregation_mode {mode}: a request needs "
                                     f"{', '.join(missing)} (added by the PD router)")
    out = Bootstrap(check_host(need_str(body["bootstrap_host"], "bootstrap_host", 255)),
                    need_int(body["bootstrap_port"], "bootstrap_port", 1, 65535),
                    need_int(body["bootstrap_room"], "bootstrap_room", 0, 2**63 - 1))
    if peers and (out.host, out.port) not in {(h, p) for h, p in peers}:  # pairs: tuples or lists (IPC)
        raise FieldError("bootstrap_host", f"bootstrap_host:bootstrap_port {out.host}:{out.port} is not a prefill "
                                           "this decode server takes K/V from (--disaggregation-prefill-peers)")
    return out


@dataclass
class GenerateRequest:
    """One runtime request, validated: what a TokenizerManager / the Engine submit."""

    rid: str  # always set (fan_out assigns missing ones)
    input_ids: list[int]  # range-checked against the vocabulary (check_request)
    sampling: SamplingParams  # normalized; sampling.grammar: the GrammarSpec when constrained
    logprob: Optional[LogprobRequest] = None  # None: no logprobs asked
    stream: bool = False
    index: int = 0  # choice index within its call (prompt * n + sample)
    bootstrap: Optional[Bootstrap] = None  # PD only
    pooling: Optional[PoolSpec] = None  # a pooling request (pooling_input.py): max_new_tokens 0, a vector back
    lora_id: int = 0  # the LoRA adapter (lora_spec.py; 0: the base model)
    priority: int = 0  # --enable-priority-scheduling's rank input (parse_priority)
    extras: RequestExtras = RequestExtras()  # cache_salt, return_hidden_states (request_extras.py)
    images: list[ImageInput] = field(default_factory=list)  # its images, at their expanded placeholders

    @property
    def prefix_key(self) -> list[int]:
        """Its prompt as the placement trees key it: in its prefix cache namespace (mem/cache_namespace.py), so
        a salted prompt follows only the same salt's prompts; images as their pad ids."""
        return namespaced(with_pads(self.input_ids, self.images), self.lora_id, salt_key(self.extras.cache_salt))

    def to_message(self) -> TokenizedGenerateReq:
        """The scheduler's message (the one place it is assembled): images' positions hold their pad ids."""
        lp = self.logprob or LogprobRequest()
        return TokenizedGenerateReq(self.rid, with_pads(list(self.input_ids), self.images), copy.copy(self.sampling),
                                    self.stream, self.logprob is not None, lp.start, lp.top_num, self.bootstrap,
                                    self.pooling, self.lora_id, self.priority, self.extras.cache_salt,
                                    self.extras.return_hidden_states, list(self.images))


def fan_out(prompts: list[list[int]], sampling: list[Any], rids: list[Optional[str]], logprob_of: LogprobOf,
            limits: RuntimeLimits, stream: bool = False, ids_name: str = "input_ids",
            base_rid: Optional[str] = None, bootstrap: Optional[Bootstrap] = None,
            is_list: bool = False, lora_id: Union[int, list[int]] = 0, priority: int = 0,
            encode_words: Optional[Encode] = None, chat_watch: Optional[ChatWatch] = None,
            extras: Union[RequestExtras, list[RequestExtras]] = RequestExtras(),
            images: Optional[list[list[ImageInput]]] = None) -> list[GenerateRequest]:
    """Per prompt: its sampling_params dict validated (SamplingParams.from_dict; bad_words tokenized with
    encode_words, the tokenizer's encode without special tokens: None refuses them; check_request, with
    chat_watch: the chat route's reasoning decisions), then n
    requests with the rid rule above, each built whole. sampling / rids: one entry per prompt. bootstrap (PD):
    one prompt given as one (is_list False), n == 1. lora_id: the adapter of every request, or one per prompt
    (a list: then each prompt is one request, n = 1). extras: every request's, or one per prompt (a list: shared by
    the prompt's n samples). images: each prompt's images (multimodal/image_prep.py), or None: none."""
    if bootstrap is not None and (is_list or len(prompts) != 1):
        raise FieldError(ids_name, f"batch input (a list of prompts) is not supported with prefill-decode "
                                   f"disaggregation (disaggregation_mode {limits.disaggregation_mode})")
    out: list[GenerateRequest] = []
    for i, (ids, sp_dict, rid) in enumerate(zip(prompts, sampling, rids)):
        if rid is not None:
            need_str(rid, "rid", MAX_RID_LEN)
        if not isinstance(sp_dict, (dict, type(None))):
            raise FieldError("sampling_params", "sampling_params must be an object")
        sp = SamplingParams.from_dict(sp_dict)
        sp.tokenize_bad_words(encode_words)
        if len(out) + sp.n > MAX_BATCH:
            raise FieldError("n", f"prompts x n must be at most {MAX_BATCH} requests per body, got "
                                  f"{len(prompts)} prompts x n={sp.n}")
        check_request(ids, sp, limits, ids_name, chat_watch=chat_watch)
        if bootstrap is not None and sp.n != 1:
            raise FieldError("n", f"n > 1 is not supported with prefill-decode disaggregation (got n={sp.n})")
        lp = logprob_of(i, ids)
        pics = images[i] if images else []
        if pics and lp is not None and lp.start < pics[-1].end:
            raise FieldError("logprob_start_len", f"prompt logprobs over image positions are not served: start at "
                                                  f"or after position {pics[-1].end}, where the last image ends")
        ex = extras[i] if isinstance(extras, list) else extras
        for j in range(sp.n):
            k = len(out)
            lid = lora_id if not isinstance(lora_id, list) else lora_id[k] if k < len(lora_id) else 0
            out.append(GenerateRequest(_rid(rid, j, sp.n, base_rid, k), list(ids), sp, lp, stream, k, bootstrap,
                                       lora_id=lid, priority=priority, extras=ex, images=pics))
    if isinstance(lora_id, list) and len(lora_id) != len(out):
        raise FieldError("lora_path", f"lora_path as a list names one adapter per prompt (with n = 1): got "
                                      f"{len(lora_id)} names for {len(out)} requests")
    check_unique_rids(out)
    return out


def _prompt_images(image_data: Any, n: int, is_list: bool) -> list[list]:
    """image_data -> each prompt's image references: with a list of prompts, one entry per prompt (an image, a
    list of them, or null); else the prompt's image or list of images."""
    def one(d: Any) -> list:
        return [] if d is None else list(d) if isinstance(d, list) else [d]

    if not is_list:
        return [one(image_data)]
    if not isinstance(image_data, list) or len(image_data) != n:
        raise FieldError("image_data", f"with {n} prompts, image_data must be a list of {n} entries (an image, a "
                                       "list of images, or null each)")
    return [one(d) for d in image_data]


def _rid(rid: Optional[str], sample: int, n: int, base: Optional[str], index: int) -> str:
    if rid is not None:
        return rid if n == 1 else f"{rid}-{sample}"
    return f"{base}-{index}" if base is not None else uuid.uuid4().hex


def check_unique_rids(reqs: list[GenerateRequest]) -> None:
    counts = Counter(r.rid for r in reqs)
    if dupes := sorted(r for r, c in counts.items() if c > 1):
        raise FieldError("rid", f"duplicate rid(s): {show(dupes)}")


def _prompts(text: Any, input_ids: Any, encode: Encode) -> tuple[list[list[int]], bool]:
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
                         encode: Encode, limits: RuntimeLimits, stream: bool = False,
                         bootstrap: Optional[Bootstrap] = None,
                         lora_id: Union[int, list[int]] = 0, priority: int = 0,
                         encode_words: Optional[Encode] = None,
                         extras: Mapping[str, Any] = MappingProxyType({}), image_data: Any = None,
                         attach: Optional[Attach] = None) -> tuple[list[GenerateRequest], bool]:
    """The native inputs (SGLang's GenerateReqInput fields) -> (requests, whether the answer is a list:
    list input or n > 1). encode_words: fan_out's (bad_words). extras: the cache_salt / extra_key /
    return_hidden_states fields as given (request_extras.prompt_extras: one value, or one per prompt).
    image_data: SGLang's (an image or a list of them; with a list of prompts, one such entry per prompt), placed
    by attach (multimodal/image_prep.ImagePrep.attach; None: the model takes no images)."""
    prompts, is_list = _prompts(text, input_ids, encode)
    images = None
    if image_data is not None:
        if attach is None:
            raise FieldError("image_data", "image_data needs a model that takes images; this one takes text only")
        images = []
        for i, refs in enumerate(_prompt_images(image_data, len(prompts), is_list)):
            prompts[i], pics = attach(prompts[i], refs, f"image_data[{i}]" if is_list else "image_data")
            images.append(pics)
    sps = per_prompt(sampling_params, len(prompts), "sampling_params")
    rids = per_prompt(rid, len(prompts), "rid")
    starts = per_prompt(logprob_start_len, len(prompts), "logprob_start_len")
    per_extras = prompt_extras(extras, limits, len(prompts), is_list)
    need_bool(return_logprob, "return_logprob")
    with_text = return_text_in_logprobs is not None and need_bool(return_text_in_logprobs, "return_text_in_logprobs")

    def logprob_of(i: int, ids: list[int]) -> Optional[LogprobRequest]:
        k, top = normalize_logprob_args(len(ids), return_logprob, starts[i], top_logprobs_num)  # types even unused
        return LogprobRequest(k, top, with_text) if return_logprob else None

    out = fan_out(prompts, sps, rids, logprob_of, limits, stream, bootstrap=bootstrap, is_list=is_list,
                  lora_id=lora_id, priority=priority, encode_words=encode_words, extras=per_extras, images=images)
    return out, is_list or len(out) > 1


def parse_generate_body(body: Any, encode: Encode, limits: RuntimeLimits, encode_words: Optional[Encode] = None,
                        attach: Optional[Attach] = None) -> tuple[list[GenerateRequest], bool]:
    """A native /generate JSON body (HTTP, the DSL's ZeroMQ frontend) -> (requests, whether a list answers).
    Tokenizes (encode: prompts; encode_words: bad_words) and reads images (attach): servers run it on an intake
    thread."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    stream = need_bool(body.get("stream", False), "stream")
    bootstrap = parse_bootstrap(body, limits.disaggregation_mode, limits.disaggregation_prefill_peers)
    lora_id = parse_lora_path(body.get("lora_path"), limits)
    reqs, is_list = parse_generate_input(body.get("text"), body.get("input_ids"), body.get("sampling_params"),
                                         body.get("rid"), body.get("return_logprob", False),
                                         body.get("logprob_start_len"), body.get("top_logprobs_num"),
                                         body.get("return_text_in_logprobs"), encode, limits, stream, bootstrap,
                                         lora_id, parse_priority(body.get("priority"), limits), encode_words,
                                         body, body.get("image_data"), attach)
    return reqs, is_list


def parse_priority(priority: Any, limits: RuntimeLimits) -> int:
    """SGLang's / vLLM's `priority` (an integer; None: 0) -> the request's priority; a 400 naming it on a server
    without --enable-priority-scheduling (which would not honour it)."""
    if priority is None:
        return 0
    value = need_int(priority, "priority", -(2**31), 2**31 - 1)
    if not limits.priority_scheduling:
        raise FieldError("priority", "priority needs a server started with --enable-priority-scheduling")
    return value


def parse_lora_path(lora_path: Any, limits: RuntimeLimits) -> Union[int, list[int]]:
    """SGLang's `lora_path`: an adapter's name (None: the base model), or a list of them, one per prompt ->
    the adapter id(s); LoraNotFound (HTTP 404) names an unknown one."""
    if isinstance(lora_path, list):
        return [lora_id_of(p, limits.lora_adapters) for p in lora_path]
    return lora_id_of(lora_path, limits.lora_adapters)


def openai_requests(prompts: list[list[int]], sampling: dict[str, Any], n: int, logprob_of: LogprobOf,
                    limits: RuntimeLimits, base_rid: str, stream: bool,
                    bootstrap: Optional[Bootstrap] = None, lora_id: int = 0,
                    priority: int = 0, encode_words: Optional[Encode] = None,
                    own_rid: bool = False, chat_watch: Optional[ChatWatch] = None,
                    extras: RequestExtras = RequestExtras(),
                    images: Optional[list[list[ImageInput]]] = None) -> list[GenerateRequest]:
    """An OpenAI call after rendering (prompts tokenized, fields mapped to native sampling names) -> its
    choices: prompts x n requests rid f"{base_rid}-{index}", the same validation as native requests. own_rid:
    base_rid is the client's (SGLang's `rid`): a single choice runs as base_rid itself."""
    if len(prompts) * n > MAX_BATCH:
        raise FieldError("n", f"prompts x n must be at most {MAX_BATCH} choices, got {len(prompts)} x {n}")
    sp = {**sampling, "n": n}
    rids = [base_rid] if own_rid and len(prompts) * n == 1 else [None] * len(prompts)
    return fan_out(prompts, [sp] * len(prompts), rids, logprob_of, limits, stream, "prompt",
                   base_rid, bootstrap, is_list=len(prompts) > 1, lora_id=lora_id, priority=priority,
                   encode_words=encode_words, chat_watch=chat_watch, extras=extras, images=images)
