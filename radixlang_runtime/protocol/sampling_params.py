"""Per-request sampling parameters (SGLang's names), validated once on arrival. Torch-free."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from radixlang_runtime.protocol.limits import (MAX_ALLOWED_TOKEN_IDS, MAX_BAD_WORDS, MAX_LOGIT_BIAS, MAX_N,
                                               MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, FieldError, need_bool,
                                               need_float, need_int, need_int_list, need_str, show)
from radixlang_runtime.protocol.sampling_fields import REQUEST_FIELDS
from radixlang_runtime.protocol.stop_regex import StopRegex, check_stops, compile_stop_regex

GREEDY_EPS = 1e-6  # temperature below this is greedy
INFILL_MAX_TOP_K = 1024  # infill's candidates are the top_k tokens: at most this many per row
# from_dict refuses them (built on intake)
_NOT_REQUEST_FIELDS = frozenset({"grammar", "bad_words_ids", "reasoning_watch"})
_NOT_WIRE_FIELDS = frozenset({"n", "grammar", "reasoning_watch"})


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: Union[str, list[str], None] = None
    stop_token_ids: list[int] = field(default_factory=list)
    stop_regex: Union[str, list[str]] = field(default_factory=list)  # normalized to a list
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    regex: Optional[str] = None
    json_schema: Optional[str] = None
    ebnf: Optional[str] = None  # GBNF-style EBNF (SGLang's field): --grammar-backend xgrammar | llguidance
    structural_tag: Optional[str] = None  # JSON {"structures", "triggers"} (response_format structural_tag)
    sampling_seed: Optional[int] = None
    # token id -> bias added to its logit before any sampling step (greedy too); JSON keys are decimal
    # strings ("123"), normalized to ints; biases finite in [-100, 100] (OpenAI's range).
    logit_bias: dict[int, float] = field(default_factory=dict)
    # vLLM's: at most this many output tokens inside the reasoning block, then its end marker is forced
    # (protocol/reasoning_watch.py; needs --reasoning-parser)
    thinking_token_budget: Optional[int] = None
    # vLLM's: only these token ids may be sampled (greedy too); None: any. Non-empty, in the vocabulary.
    allowed_token_ids: Optional[list[int]] = None
    # vLLM's: words never generated. Tokenized once on intake (tokenize_bad_words) into bad_words_ids.
    bad_words: list[str] = field(default_factory=list)
    # llama.cpp's infill sampler after top-k / top-p / min-p (model/executor/infill_sampling.py): it ends the
    # middle where end tokens weigh enough, merges tokens whose text starts another's, drops unlikely text
    # tokens. Needs top_k in [1, INFILL_MAX_TOP_K] (its candidates).
    infill: bool = False
    # Not a request field: bad_words' token sequences (tokenize_bad_words); the sampler bans a sequence's last
    # token whenever the output ends with the rest of it. None: no bad words.
    bad_words_ids: Optional[list[list[int]]] = None
    # Not a request field: the GrammarSpec normalize() built from regex / json_schema (None: unconstrained).
    # It travels with the request (GrammarSpec.to_wire) so no later stage builds it again.
    grammar: Any = field(default=None, compare=False, repr=False)
    # Not a request field: the ReasoningWatch the intake planned (check_request): a thinking budget, a grammar
    # held until the reasoning ends. None: nothing watched.
    reasoning_watch: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def from_dict(cls, d: Optional[dict[str, Any]]) -> "SamplingParams":
        d = {k: v for k, v in (d or {}).items() if v is not None}  # null: the field's default
        unknown = sorted(set(d) - REQUEST_FIELDS)  # REQUEST_FIELDS: the fields but _NOT_REQUEST_FIELDS
        if unknown:
            raise FieldError(unknown[0], f"unknown sampling parameter(s): {', '.join(unknown)}")
        if d.get("stop_token_ids") is None:
            d.pop("stop_token_ids", None)
        if d.get("stop_regex") is None:
            d.pop("stop_regex", None)
        elif isinstance(d["stop_regex"], str):
            d["stop_regex"] = [d["stop_regex"]]
        sp = cls(**d)
        sp.normalize()
        return sp

    def to_wire(self) -> dict[str, Any]:
        """The fields the scheduler needs, as a plain dict inside a TokenizedGenerateReq (n is expanded into n
        requests by the sender), the grammar spec as GrammarSpec.to_wire (built once, at intake)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _NOT_WIRE_FIELDS}
        d["grammar"] = self.grammar.to_wire() if self.grammar is not None else None
        d["reasoning_watch"] = self.reasoning_watch.to_wire() if self.reasoning_watch is not None else None
        return d

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "SamplingParams":
        """Trusted decode on the scheduler's side of to_wire: the sender validated every field (from_dict), so
        nothing is checked or compiled again. An unknown field is a TypeError."""
        d = dict(d)
        grammar = d.pop("grammar", None)
        watch = d.pop("reasoning_watch", None)
        sp = cls(**d)
        if watch is not None:
            from radixlang_runtime.protocol.reasoning_watch import ReasoningWatch

            sp.reasoning_watch = ReasoningWatch.from_wire(watch)
        if grammar is not None:
            from radixlang_runtime.constrained.spec import GrammarSpec

            sp.grammar = GrammarSpec.from_wire(grammar)
        return sp

    # --- derived ---
    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    @property
    def stop_strs(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def stop_patterns(self) -> list[StopRegex]:
        """stop_regex compiled in RE2 (each pattern once per process: compile_stop_regex is cached)."""
        return [compile_stop_regex(r) for r in self.stop_regex]

    @property
    def constrained(self) -> bool:
        """The output must match a grammar (regex / json_schema): the scheduler compiles and masks it."""
        return self.grammar_kind is not None

    @property
    def grammar_kind(self) -> Optional[str]:
        """regex | json_schema | ebnf | structural_tag: the grammar field that is set (at most one), else None."""
        for name in ("regex", "json_schema", "ebnf", "structural_tag"):
            if getattr(self, name) is not None:
                return name
        return None

    @property
    def has_penalties(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    def normalize(self) -> None:
        """Type checks and range checks; raises ValueError naming the field and the allowed range."""

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        # Types first (limits.need_*: bools are bools, ints fit int64, numbers are finite), then ranges.
        self.max_new_tokens = need_int(self.max_new_tokens, "max_new_tokens", 0)
        self.min_new_tokens = need_int(self.min_new_tokens, "min_new_tokens", 0)
        self.top_k = need_int(self.top_k, "top_k")  # above the vocab size: the whole vocabulary, as -1
        self.n = need_int(self.n, "n", 1, MAX_N)
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
            setattr(self, name, need_float(getattr(self, name), name))
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "infill"):
            need_bool(getattr(self, name), name)
        need(self.min_new_tokens <= self.max_new_tokens,
             f"min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], got {self.min_new_tokens}")
        need(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        need(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        need(self.top_k == -1 or self.top_k >= 1, f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        need(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}")
        if self.infill and not 1 <= self.top_k <= INFILL_MAX_TOP_K:
            raise FieldError("top_k", f"infill runs over the top_k candidates: top_k must be in [1, "
                                      f"{INFILL_MAX_TOP_K}] with it, got {self.top_k}")
        need(-2.0 <= self.frequency_penalty <= 2.0,
             f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        need(-2.0 <= self.presence_penalty <= 2.0, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        need(0.0 < self.repetition_penalty <= 2.0,
             f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if self.stop is not None and not isinstance(self.stop, str):
            need(isinstance(self.stop, list), "stop must be a string or a list of strings")
            need(len(self.stop) <= MAX_STOP_STRINGS,
                 f"stop: at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        for i, s in enumerate(self.stop_strs):
            name = "stop" if isinstance(self.stop, str) else f"stop[{i}]"
            need(bool(need_str(s, name)), "stop strings must be non-empty")
        need_int_list(self.stop_token_ids, "stop_token_ids", max_len=MAX_STOP_TOKEN_IDS)
        grammars = [n for n in ("regex", "json_schema", "ebnf", "structural_tag") if getattr(self, n) is not None]
        for name in grammars:
            need_str(getattr(self, name), name)
        need(len(grammars) <= 1, f"at most one of regex / json_schema / ebnf / structural_tag may be set, got "
                                 f"{', '.join(grammars)}")
        if self.sampling_seed is not None:
            need_int(self.sampling_seed, "sampling_seed")
        if self.thinking_token_budget is not None:
            need_int(self.thinking_token_budget, "thinking_token_budget", 0)
        self.logit_bias = normalize_logit_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            try:
                need_int_list(self.allowed_token_ids, "allowed_token_ids", 0, max_len=MAX_ALLOWED_TOKEN_IDS)
            except FieldError as e:  # param: the field itself, not one entry
                raise FieldError("allowed_token_ids", str(e)) from None
            if not self.allowed_token_ids:  # vLLM: "allowed_token_ids is not None and empty!"
                raise FieldError("allowed_token_ids", "allowed_token_ids must not be empty (leave it out: any token)")
        self.bad_words = normalize_bad_words(self.bad_words)
        need(isinstance(self.stop_regex, list) and all(isinstance(r, str) and r for r in self.stop_regex),
             "stop_regex must be a non-empty string or a list of them")
        check_stops(self.stop_strs, self.stop_regex)  # limits, RE2 compile: ValueError naming them (HTTP 400)
        self.grammar = None
        if self.constrained:
            from radixlang_runtime.constrained.spec import spec_from_sampling

            # ValueError naming what is wrong (HTTP 400); built here once, kept for the scheduler
            self.grammar = spec_from_sampling(self.regex, self.json_schema, self.ebnf, self.structural_tag)

    def check_vocab(self, vocab_size: int) -> None:
        bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise FieldError("stop_token_ids", f"stop_token_ids must be in [0, {vocab_size}), got {show(bad)}")
        bad = sorted(t for t in self.logit_bias if not 0 <= t < vocab_size)
        if bad:
            raise FieldError("logit_bias", f"logit_bias keys must be token ids in [0, {vocab_size}), got {show(bad)}")
        bad = sorted({t for t in self.allowed_token_ids or () if t >= vocab_size})
        if bad:  # vLLM: "allowed_token_ids contains out-of-vocab token id!"
            raise FieldError("allowed_token_ids", f"allowed_token_ids contains out-of-vocab token ids (the "
                                                  f"vocabulary is [0, {vocab_size})): {show(bad)}")
        bad = sorted({t for ids in self.bad_words_ids or () for t in ids if not 0 <= t < vocab_size})
        if bad:
            raise FieldError("bad_words", f"bad_words tokenize to ids outside the model's vocabulary "
                                          f"[0, {vocab_size}): {show(bad)}")

    def tokenize_bad_words(self, encode: Optional[Callable[[str], list[int]]]) -> None:
        """bad_words -> bad_words_ids, as vLLM's SamplingParams.update_from_tokenizer: each word (its leading
        whitespace stripped) encoded without special tokens; then with a leading space too, kept where that
        gives a sequence of the same length starting with another token (the word inside a text). encode: the
        tokenizer's plain encode; None (no tokenizer) refuses bad_words."""
        if not self.bad_words:
            return
        if encode is None:
            raise FieldError("bad_words", "bad_words needs the tokenizer (this engine runs without one)")
        out: list[list[int]] = []
        for word in self.bad_words:
            ids = encode(word.lstrip())
            if not ids:
                raise FieldError("bad_words", f"bad_words entry {show(word)} tokenizes to no tokens")
            out.append(ids)
            spaced = encode(" " + word.lstrip())
            if spaced and spaced[0] != ids[0] and len(spaced) == len(ids):
                out.append(spaced)
        self.bad_words_ids = out


def normalize_logit_bias(value: Any) -> dict[int, float]:
    """{token id (int, or its decimal string as JSON keys are): bias} -> {int: float}; FieldError naming
    logit_bias on anything else (a non-object, a key that is not a token id, a bias outside [-100, 100],
    more than MAX_LOGIT_BIAS entries). The vocabulary bound is check_vocab's (it needs the model)."""
    if not isinstance(value, dict):
        raise FieldError("logit_bias", f"logit_bias must be an object of token id -> bias, got {show(value)}")
    if len(value) > MAX_LOGIT_BIAS:
        raise FieldError("logit_bias", f"logit_bias may hold at most {MAX_LOGIT_BIAS} entries, got {len(value)}")
    out: dict[int, float] = {}
    for k, b in value.items():
        if isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 19:
            tid = int(k)
        elif type(k) is int and k >= 0:
            tid = k
        else:
            raise FieldError("logit_bias", f"logit_bias keys must be token ids (non-negative integers), got {show(k)}")
        try:
            out[tid] = need_float(b, f"logit_bias[{show(k, 20)}]", -100.0, 100.0)
        except FieldError as e:  # param: the field itself (OpenAI names `logit_bias`, not one entry)
            raise FieldError("logit_bias", str(e)) from None
    return out


def normalize_bad_words(value: Any) -> list[str]:
    """A list of non-blank strings (at most MAX_BAD_WORDS); FieldError naming bad_words otherwise."""
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise FieldError("bad_words", f"bad_words must be a list of strings, got {show(value)}")
    if len(value) > MAX_BAD_WORDS:
        raise FieldError("bad_words", f"bad_words may hold at most {MAX_BAD_WORDS} words, got {len(value)}")
    for i, w in enumerate(value):
        try:
            need_str(w, f"bad_words[{i}]")
        except FieldError as e:  # param: the field itself, not one entry
            raise FieldError("bad_words", str(e)) from None
        if not w.strip():
            raise FieldError("bad_words", f"bad_words entries must not be empty or blank, got {show(w)}")
    return value


def stop_token(finish_reason: Optional[dict[str, Any]], no_stop_trim: bool) -> Optional[int]:
    """The stop token id (EOS, stop_token_ids) that finished the request, when its text is left out of the
    output (as SGLang's detokenizer drops it; no_stop_trim keeps it), else None. It matters where special
    tokens are kept (skip_special_tokens false: an end-of-turn token's text would end the content)."""
    if no_stop_trim or not finish_reason or finish_reason.get("type") != "stop":
        return None
    matched = finish_reason.get("matched")
    return matched if isinstance(matched, int) and not isinstance(matched, bool) else None


def trim_at_stop(text: str, finish_reason: Optional[dict[str, Any]], no_stop_trim: bool,
                 from_end: int = 0) -> Optional[str]:
    """The final text cut before the stop string that finished the request, or None when nothing is
    cut (no stop string matched, no_stop_trim, or the string is not in the decoded text).
    from_end: where the occurrence that ended generation starts, counted from the end of the text
    (Req.stop_from_end); an earlier occurrence (inside the min_new_tokens part) is never the cut."""
    if no_stop_trim or not finish_reason or finish_reason.get("type") != "stop":
        return None
    matched = finish_reason.get("matched")
    if not isinstance(matched, str):
        return None
    if 0 < from_end <= len(text) and text.startswith(matched, len(text) - from_end):
        return text[: len(text) - from_end]
    cut = text.rfind(matched)
    return text[:cut] if cut >= 0 else None
