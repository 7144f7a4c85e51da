"""NativeBackend: gen / select / prefix caching in the native /generate protocol (PROTOCOL.md),
over any transport. HTTP, ZeroMQ, the in-process Engine and the fake backend implement only the
three transport methods, so every link sends byte-for-byte the same request bodies.

select (FRONTEND.md): (1) a prefill-only request on the prompt gives its length P and caches it;
(2) one batched request scores `[prompt] + [prompt + c for c in choices]` from logit position
k = max(P - 2, 0); the choice's tokens are the entries after the prefix whose token ids equal the
bare prompt's (so a healed boundary token counts, a repeated last token does not confuse it);
(3) unconditional_likelihood_normalized scores the choices' tokens alone in one more request.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Iterator, List, Optional, Sequence

from radixlang.backend.base import BaseBackend
from radixlang.chat_template import pick_chat_template
from radixlang.choices import (ChoicesDecision, ChoicesSamplingMethod, GreedyTokenSelection, TokenLengthNormalized,
                               UnconditionalLikelihoodNormalized, normalized_logprob)
from radixlang.errors import BackendError
from radixlang.global_config import global_config
from radixlang.ir import SglSamplingParams

_BUILTIN_METHODS = (TokenLengthNormalized, GreedyTokenSelection, UnconditionalLikelihoodNormalized)


class NativeBackend(BaseBackend):
    # join(mode="concate_and_append") sends nothing: the texts are joined client-side and the radix cache
    # shares the forks' KV by itself. radixlang's server answers the call with {} and does nothing; SGLang's
    # server has no such route (and the forks' ids are not its request ids): the call was an empty round trip.
    support_concate_and_append = False
    # whether _call_stream's events carry text deltas (the ZeroMQ link) or the whole text so far (HTTP /generate)
    stream_text_deltas = False
    # the runtime's cache_salt (docs/HTTP_API.md): set on a backend, every request it sends reads and writes the
    # prefix cache in that salt's namespace only; it pins no prefix then (a pin names the shared namespace's)
    cache_salt: Optional[str] = None

    def __init__(self, chat_template_name: Optional[str] = None):
        super().__init__()
        self.model_info: dict = self._control("model_info") or {}
        path = " ".join(str(self.model_info.get(k) or "") for k in ("model_path", "served_model_name"))
        self.chat_template = pick_chat_template(chat_template_name, self.model_info.get("chat_template"), path)
        self._pin_supported = True

    # ------------------------------------------------------------------ transport (subclasses)
    @abstractmethod
    def _call(self, body: dict) -> Any:
        """POST /generate without streaming: a result dict, or a list of them for a list input.
        Raises BackendError (with the HTTP-style status) on a refused or failed request."""

    @abstractmethod
    def _call_stream(self, body: dict) -> Iterator[dict]:
        """POST /generate with "stream": true: the events (cumulative text, or deltas when
        stream_text_deltas; delta logprobs)."""

    @abstractmethod
    def _control(self, method: str, body: Optional[dict] = None) -> Any:
        """model_info, server_info, flush_cache, concate_and_append, pin_prefix, unpin_prefix.
        An unsupported method raises BackendError with status 404."""

    # ------------------------------------------------------------------ BaseBackend
    def get_model_name(self) -> str:
        return str(self.model_info.get("model_path") or self.model_info.get("served_model_name") or "the model")

    def image_token(self) -> Optional[str]:
        return self.model_info.get("image_token")

    def generate_body(self, text: str, params: SglSamplingParams, stream: bool = False,
                      images: Sequence[str] = ()) -> dict:
        body: dict = {"text": text, "sampling_params": params.to_runtime_kwargs(
            skip_special_tokens=global_config.skip_special_tokens_in_output,
            spaces_between_special_tokens=global_config.spaces_between_special_tokens_in_out)}
        body.update(params.logprob_kwargs())
        if self.cache_salt is not None:
            body["cache_salt"] = self.cache_salt
        if stream:
            body["stream"] = True
        if images:
            body["image_data"] = list(images)
        return body

    def generate(self, text: str, params: SglSamplingParams, images: Sequence[str] = ()) -> tuple[Any, Any]:
        obj = self._call(self.generate_body(text, params, images=images))
        if isinstance(obj, list):  # n > 1
            return [o["text"] for o in obj], [o["meta_info"] for o in obj]
        return obj["text"], obj["meta_info"]

    def generate_stream(self, text: str, params: SglSamplingParams,
                        images: Sequence[str] = ()) -> Iterator[tuple[str, dict]]:
        pos = 0
        for event in self._call_stream(self.generate_body(text, params, stream=True, images=images)):
            if "error" in event:
                err = event["error"]
                raise BackendError(f"the stream failed: {err.get('message', err) if isinstance(err, dict) else err}")
            # a stop string cut at the end of text already yielded: the whole text is shorter (cumulative)
            # or the delta is "" with "text_trim" (deltas); what was yielded stays, as over HTTP
            delta = event["text"] if self.stream_text_deltas else event["text"][pos:]
            pos += len(delta)
            yield delta, event["meta_info"]

    def _call_salted(self, body: dict) -> Any:
        """_call with the backend's cache_salt."""
        return self._call(body if self.cache_salt is None else {**body, "cache_salt": self.cache_salt})

    def cache_prefix(self, prefix: str, images: Sequence[str] = ()) -> None:
        self._call_salted({"text": prefix, "sampling_params": {"max_new_tokens": 0},
                           **({"image_data": list(images)} if images else {})})

    def pin_prefix(self, prefix: str) -> Optional[Any]:
        """Prefill the prefix, then pin it (a pin locks only what is cached). A runtime without pins
        (404) gets the prefill alone from then on; the pin's id is the handle."""
        self.cache_prefix(prefix)
        if self._pin_supported and self.cache_salt is None:
            try:
                return self._control("pin_prefix", {"text": prefix})["pin_id"]
            except BackendError as e:
                if e.status != 404:
                    raise
                self._pin_supported = False
        return None

    def unpin_prefix(self, handle: Any) -> None:
        if handle is not None:
            self._control("unpin_prefix", {"pin_id": handle})

    def concatenate_and_append(self, src_rids: List[str], dst_rid: str) -> None:
        self._control("concate_and_append", {"src_rids": src_rids, "dst_rid": dst_rid})

    def flush_cache(self) -> bool:
        return bool(self._control("flush_cache"))

    def get_server_info(self) -> dict:
        return self._control("server_info")

    # ------------------------------------------------------------------ select
    def select(self, text: str, choices: List[str], temperature: float,
               choices_method: ChoicesSamplingMethod, images: Sequence[str] = ()) -> ChoicesDecision:
        pics = {"image_data": list(images)} if images else {}
        prompt_len = (self._call_salted({"text": text, "sampling_params": {"max_new_tokens": 0}, **pics})
                      ["meta_info"]["prompt_tokens"] if text else 0)
        start = max(prompt_len - 2, 0)
        texts = ([text] if text else []) + [text + c for c in choices]
        objs = self._call_salted({"text": texts, "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                                  "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": start,
                                  **({"image_data": [list(images)] * len(texts)} if images else {})})
        prompt_entries = objs[0]["meta_info"]["input_token_logprobs"] if text else []
        results = objs[1:] if text else objs
        inputs = [choice_entries(prompt_entries, r["meta_info"]["input_token_logprobs"]) for r in results]
        outputs = [r["meta_info"].get("output_token_logprobs") or [] for r in results]
        kwargs: dict = dict(choices=choices, normalized_prompt_logprobs=[normalized_logprob(e) for e in inputs],
                            input_token_logprobs=inputs, output_token_logprobs=outputs)
        if choices_method.requires_unconditional_logprobs:
            kwargs["unconditional_token_logprobs"] = self._unconditional(inputs)
        if isinstance(choices_method, _BUILTIN_METHODS):
            kwargs["temperature"] = temperature
        return choices_method(**kwargs)

    def _unconditional(self, inputs: List[List[Any]]) -> List[List[Any]]:
        ids = [[e[1] for e in entries] for entries in inputs]
        scored = [i for i, x in enumerate(ids) if x]
        out: List[List[Any]] = [[] for _ in ids]
        if scored:
            objs = self._call_salted({"input_ids": [ids[i] for i in scored], "sampling_params": {"max_new_tokens": 0},
                               "return_logprob": True, "logprob_start_len": 0})
            for i, obj in zip(scored, objs if isinstance(objs, list) else [objs]):
                out[i] = obj["meta_info"]["input_token_logprobs"]
        return out


def choice_entries(prompt_entries: List[Any], entries: List[Any]) -> List[Any]:
    """The entries of the choice's own tokens: after the leading ones whose token ids equal the bare
    prompt's at the same positions; an entry without a logprob (token 0) cannot be scored."""
    m = 0
    while m < len(prompt_entries) and m < len(entries) and entries[m][1] == prompt_entries[m][1]:
        m += 1
    return [e for e in entries[m:] if e[0] is not None]
