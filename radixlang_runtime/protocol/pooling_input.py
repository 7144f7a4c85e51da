"""The intake of pooling calls (torch-free): /v1/embeddings, /encode, /classify, /v1/rerank, /v1/score bodies ->
typed calls whose requests are prefill-only GenerateRequests (max_new_tokens 0) carrying a PoolSpec (pooling.py).

Inputs: OpenAI's `input` (a string, a list of strings, a token array, a list of token arrays) or vLLM's chat
`messages` (/v1/embeddings, /classify), SGLang's /encode `text` / `input_ids`, rerank's query + documents, score's
text_1 / text_2; vLLM's shared fields (truncate_prompt_tokens, use_activation, priority, request_id, ...) are
pooling_fields.py's. A sequence classifier (PoolingConfig.labels) answers /classify, and scores rerank /
score pairs as a cross-encoder when it has one label. Each prompt is checked like a generate
prompt (limits.check_request: empty, too long for the context or the pool, ids outside the vocabulary) and against
the model's max_seq_length (sentence-transformers truncates there; this server refuses instead). Every problem
raises FieldError / ValueError naming it (HTTP 400).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Union

from radixlang_runtime.classifier import without_trailing_pad
from radixlang_runtime.protocol.embed_bytes import EMBED_DTYPES, ENDIANNESS
from radixlang_runtime.protocol.generate_input import GenerateRequest
from radixlang_runtime.protocol.limits import (MAX_BATCH, FieldError, RuntimeLimits, check_request, need_bool, need_int,
                                               need_str, show)
from radixlang_runtime.pooling import PoolingConfig, PoolSpec, check_dimensions
from radixlang_runtime.protocol.pooling_fields import (COMMON_FIELDS, PROMPT_FIELDS, PoolingOptions, pooling_options,
                                                       refuse_unknown)
from radixlang_runtime.protocol.sampling_params import SamplingParams

Encode = Callable[[str], list[int]]
PairEncode = Callable[[str, str], list[int]]  # a cross-encoder's (query, document) -> one prompt's ids
ChatEncode = Callable[[dict, bool], list[int]]  # a body's messages (and chat fields), add_special_tokens -> ids
Prompt = Any  # a string, or a list of token ids

ENCODING_FORMATS = ("float", "base64")
EMBEDDING_FIELDS = {*COMMON_FIELDS, *PROMPT_FIELDS, "encoding_format", "dimensions", "embed_dtype", "endianness"}
ENCODE_FIELDS = {"text", "input_ids", "rid"}
RERANK_FIELDS = {*COMMON_FIELDS, "query", "documents", "top_n", "return_documents", "instruction"}
SCORE_FIELDS = {*COMMON_FIELDS, "queries", "documents", "text_1", "text_2", "instruction"}
SCORE_NAMES = (("queries", "documents"), ("text_1", "text_2"))  # vLLM's names for score's two sides, then its older
CLASSIFY_FIELDS = {*COMMON_FIELDS, *PROMPT_FIELDS}
# Qwen3-Reranker's prompt (--rerank-template replaces it): {instruction}, {query}, {document}
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
    "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")


@dataclass(frozen=True)
class PromptEncoders:
    """How a pooling route's prompts become ids (server/pooling_api.py builds them; blocking: intake thread)."""

    text: Encode  # a text with the model's special tokens (embedding_encoder)
    bare: Encode  # a text without special tokens (add_special_tokens false)
    chat: ChatEncode  # vLLM's chat form: the messages through the chat template, as the generation routes render


@dataclass(frozen=True)
class EmbeddingCall:
    reqs: list[GenerateRequest]  # one per input, index = input position
    encoding_format: str = "float"
    dimensions: Optional[int] = None
    as_list: bool = True  # /encode: whether the input was a list (a list answers)
    options: PoolingOptions = PoolingOptions("")  # rid, use_activation
    embed_dtype: str = "float32"  # base64's element type and byte order (embed_bytes.py)
    endianness: str = "native"


@dataclass(frozen=True)
class PairCall:
    """rerank / score: pairs (query, document) scored; reqs per pair (a reranker) or per text (cosine of
    embeddings: queries first, then documents)."""

    reqs: list[GenerateRequest]
    pairs: list[tuple[int, int]]  # (left index, right index) into the texts each request stands for
    documents: list[str]  # rerank: the documents as given (return_documents)
    # what scores a pair: "reranker" (one request per pair, P(yes)), "classifier" (one request per pair, the
    # one-label classifier's sigmoid(logit)) or "cosine" (of the two texts' embeddings)
    scorer: str
    options: PoolingOptions = PoolingOptions("")  # rid, use_activation (False: the raw logit)


def prompts_of(value: Any, name: str) -> list[Prompt]:
    """OpenAI's input forms -> one prompt per input (strings or token id lists)."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise FieldError(name, f"{name} must be a non-empty string, list of strings, token array or list of token "
                               f"arrays, got {show(value)}")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return [value]
    if all(isinstance(p, str) for p in value) or all(isinstance(p, list) for p in value):
        if len(value) > MAX_BATCH:
            raise FieldError(name, f"{name} may hold at most {MAX_BATCH} inputs, got {len(value)}")
        return list(value)
    raise FieldError(name, f"{name} must be a string, a list of strings, a token array or a list of token arrays "
                           "(not a mix)")


def pooling_requests(prompts: list[Prompt], spec: PoolSpec, encode: Encode, limits: RuntimeLimits, name: str,
                     opts: PoolingOptions, max_len: Optional[int] = None, pad_id: Optional[int] = None
                     ) -> list[GenerateRequest]:
    """Prefill-only requests rid f"{opts.rid}-{i}"; strings tokenized by `encode`, cut by opts.truncation
    (truncate_prompt_tokens, truncation_side), run at opts.priority in opts.extras' cache_salt; pad_id: a
    classifier's pad token, its trailing ones left out (classifier.without_trailing_pad)."""
    if limits.disaggregation_mode != "null":
        raise ValueError(f"{name}: pooling requests are not implemented with prefill-decode disaggregation "
                         f"(disaggregation_mode {limits.disaggregation_mode})")
    sp = SamplingParams.from_dict({"max_new_tokens": 0})
    out = []
    for i, p in enumerate(prompts):
        where = f"{name}[{i}]" if len(prompts) > 1 else name
        if isinstance(p, str):
            if not p:  # OpenAI refuses an empty string too (a template would otherwise embed its own tokens)
                raise FieldError(where, f"{where} is an empty string")
            ids = encode(need_str(p, where))
        elif isinstance(p, list):
            ids = p
        else:
            raise FieldError(where, f"{where} must be a string or a token array, got {show(p)}")
        if not ids:
            raise FieldError(where, f"{where} is empty (no tokens)")
        if opts.truncation is not None:
            ids = opts.truncation.cut(ids)
        ids = without_trailing_pad(ids, pad_id)
        check_request(ids, sp, limits, where, pooling=True)
        if max_len is not None and len(ids) > max_len:
            raise FieldError(where, f"{where} has {len(ids)} tokens; the model's max_seq_length is {max_len} "
                                    "(sentence_bert_config.json)")
        out.append(GenerateRequest(f"{opts.rid}-{i}", list(ids), sp, index=i, pooling=spec, priority=opts.priority,
                                   extras=opts.extras))
    return out


def _embed_spec(cfg: Optional[PoolingConfig], route: str) -> PoolingConfig:
    if cfg is None:
        raise ValueError(f"{route} needs a pooling model: start the server with --is-embedding (this one serves "
                         "text generation)")
    if cfg.classifies:
        raise ValueError(f"{route} needs an embedding model: this server runs a sequence classifier, which serves "
                         "/classify (and /v1/score, /v1/rerank with one label)")
    return cfg


def embedding_encoder(tokenizer: Any, cfg: Optional[PoolingConfig]) -> Encode:
    """Texts tokenized as sentence-transformers does: with the model's special tokens, or (its message modality)
    rendered as one user message through the chat template. Blocking: call it on an intake thread."""
    if cfg is not None and cfg.chat_template:
        def render(text: str) -> list[int]:
            chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=False)
            return tokenizer(chat, add_special_tokens=False)["input_ids"]
        return render
    return lambda text: tokenizer(text)["input_ids"]


def _embed_encoder(cfg: PoolingConfig, encode: Encode) -> Encode:
    """Texts as sentence-transformers encodes them: its default prompt first."""
    return (lambda t: encode(cfg.default_prompt + t)) if cfg.default_prompt else encode


def _prompts(body: dict, opts: PoolingOptions, enc: PromptEncoders) -> tuple[list[Prompt], Encode, str]:
    """A body's prompts (its `input`, or its `messages` rendered as one prompt), the encoder of its texts, and the
    field they came from."""
    if opts.chat:
        return [enc.chat(body, opts.add_special_tokens)], enc.bare, "messages"
    return prompts_of(body["input"], "input"), enc.text if opts.add_special_tokens else enc.bare, "input"


def _choice(body: dict, name: str, choices: Any, default: str) -> str:
    value = body.get(name)
    if value is None:
        return default
    if value not in choices:
        raise FieldError(name, f"{name} must be one of {', '.join(choices)}, got {show(value)}")
    return value


def parse_embeddings_body(body: Any, cfg: Optional[PoolingConfig], enc: PromptEncoders, limits: RuntimeLimits,
                          prefix: str = "embd") -> EmbeddingCall:
    """/v1/embeddings (OpenAI, vLLM's completion and chat forms): input or messages, encoding_format float | base64
    (embed_dtype and endianness: embed_bytes.py), dimensions (Matryoshka models only), pooling_fields' fields."""
    body = refuse_unknown(body, EMBEDDING_FIELDS, "/v1/embeddings")
    cfg = _embed_spec(cfg, "/v1/embeddings")
    opts = pooling_options(body, limits, prefix, prompts=True)
    fmt = _choice(body, "encoding_format", ENCODING_FORMATS, "float")
    dtype = _choice(body, "embed_dtype", EMBED_DTYPES, "float32")
    endianness = _choice(body, "endianness", tuple(ENDIANNESS), "native")
    dims = body.get("dimensions")
    if dims is not None:
        try:
            check_dimensions(cfg, need_int(dims, "dimensions", 1))
        except ValueError as e:
            raise FieldError("dimensions", str(e)) from None
    if cfg.chat_template and not opts.chat and not opts.add_special_tokens:
        raise FieldError("add_special_tokens", "add_special_tokens false is not supported for this model: it renders "
                                               "a text input through its chat template (sentence-transformers' "
                                               "message modality); send messages or token arrays instead")
    prompts, encode, name = _prompts(body, opts, enc)
    reqs = pooling_requests(prompts, PoolSpec(cfg.mode), encode if opts.chat else _embed_encoder(cfg, encode), limits,
                            name, opts, cfg.max_seq_length)
    return EmbeddingCall(reqs, fmt, dims, options=opts, embed_dtype=dtype, endianness=endianness)


def parse_encode_body(body: Any, cfg: Optional[PoolingConfig], encode: Encode, limits: RuntimeLimits,
                      base_rid: str) -> EmbeddingCall:
    """/encode (SGLang): text or input_ids, one prompt or a list; a list answers a list."""
    body = refuse_unknown(body, ENCODE_FIELDS, "/encode")
    cfg = _embed_spec(cfg, "/encode")
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise FieldError("text", "pass exactly one of text / input_ids")
    name = "text" if text is not None else "input_ids"
    value = text if text is not None else ids
    if text is not None and not isinstance(text, (str, list)):
        raise FieldError("text", f"text must be a string or a list of strings, got {show(text)}")
    if ids is not None and not (isinstance(ids, list) and ids and all(isinstance(p, (int, list)) for p in ids)):
        raise FieldError("input_ids", "input_ids must be a list of integers or a list of such lists")
    prompts = prompts_of(value, name)
    as_list = isinstance(value, list) and (text is not None or isinstance(value[0], list))
    rid = body.get("rid")
    base = need_str(rid, "rid", 200) if rid is not None else base_rid
    reqs = pooling_requests(prompts, PoolSpec(cfg.mode), _embed_encoder(cfg, encode), limits, name,
                            PoolingOptions(base), cfg.max_seq_length)
    return EmbeddingCall(reqs, as_list=as_list)


@dataclass(frozen=True)
class Reranker:
    """A decoder reranker's prompt and labels (--rerank-template, --rerank-instruction, --classifier-from-token
    resolved to token ids: (false id, true id))."""

    template: str
    instruction: str
    label_ids: tuple[int, int]

    def prompt(self, query: str, document: str) -> str:
        # plain replacement: braces in a document or in the template are text, never placeholders
        return (self.template.replace("{instruction}", self.instruction).replace("{query}", query)
                .replace("{document}", document))


@dataclass(frozen=True)
class CrossEncoder:
    """A one-label classifier's pair prompt: the tokenizer's (text, text_pair) encoding, as vLLM's cross-encoder
    path builds it."""

    encode_pair: PairEncode


PairModel = Union[Reranker, CrossEncoder]  # what scores a pair in one request (else: the cosine of embeddings)


def _pairs_call(queries: list[str], docs: list[str], pairs: list[tuple[int, int]], cfg: Optional[PoolingConfig],
                reranker: Optional[PairModel], encode: Encode, encode_plain: Encode, limits: RuntimeLimits,
                opts: PoolingOptions, name: str) -> PairCall:
    pad = cfg.pad_token_id if cfg is not None else None  # a classifier's (an embedding model has none)

    def requests(prompts: list[Prompt], spec: PoolSpec, enc: Encode, max_len: Optional[int] = None) -> list:
        return pooling_requests(prompts, spec, enc, limits, name, opts, max_len, pad)

    if cfg is not None and cfg.classifies:  # a cross-encoder: one request per pair through the score head
        if len(cfg.labels) != 1 or not isinstance(reranker, CrossEncoder):
            raise ValueError(f"scoring pairs needs a classifier with one label (num_labels 1: a cross-encoder); "
                             f"this one has {len(cfg.labels)}: use /classify")
        prompts = [reranker.encode_pair(queries[q], docs[d]) for q, d in pairs]
        reqs = requests(prompts, PoolSpec("classify"), encode_plain)
        return PairCall(reqs, pairs, docs, "classifier", opts)
    if cfg is not None:  # a pooling model: cosine similarity of the embeddings
        texts = queries + docs
        reqs = requests(texts, PoolSpec(cfg.mode), _embed_encoder(cfg, encode), cfg.max_seq_length)
        return PairCall(reqs, [(q, len(queries) + d) for q, d in pairs], docs, "cosine", opts)
    if reranker is None:
        raise ValueError("this server has no reranker: a generation model needs --classifier-from-token tokens "
                         "that are single tokens of its vocabulary")
    prompts = [reranker.prompt(queries[q], docs[d]) for q, d in pairs]
    reqs = requests(prompts, PoolSpec("token_logits", reranker.label_ids), encode_plain)
    return PairCall(reqs, pairs, docs, "reranker", opts)


def _instructed(body: dict, cfg: Optional[PoolingConfig], reranker: Optional[PairModel]) -> Optional[PairModel]:
    """vLLM's per-request `instruction` on rerank / score: a decoder reranker's template takes it in place of
    --rerank-instruction. Other scorers have no slot for it: a FieldError naming it."""
    text = body.get("instruction")
    if text is None:
        return reranker
    need_str(text, "instruction")
    if cfg is not None or not isinstance(reranker, Reranker):
        scorer = "no reranker" if cfg is None else "a cross-encoder" if cfg.classifies else "embeddings"
        raise FieldError("instruction", "instruction needs a decoder reranker (its template's {instruction}); this "
                                        f"server scores pairs with {scorer}")
    if "{instruction}" not in reranker.template:
        raise FieldError("instruction", "instruction needs an {instruction} placeholder in --rerank-template; "
                                        "this server's template has none")
    return replace(reranker, instruction=text)


def _text_list(value: Any, name: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise FieldError(name, f"{name} must be a string or a non-empty list of strings, got {show(value)}")
    if len(texts) > MAX_BATCH:
        raise FieldError(name, f"{name} may hold at most {MAX_BATCH} texts, got {len(texts)}")
    return [need_str(t, f"{name}[{i}]") for i, t in enumerate(texts)]


def parse_rerank_body(body: Any, cfg: Optional[PoolingConfig], reranker: Optional[PairModel], encode: Encode,
                      encode_plain: Encode, limits: RuntimeLimits, prefix: str = "rerank"
                      ) -> tuple[PairCall, int, bool]:
    """/v1/rerank: query, documents (strings or {"text"}), top_n, return_documents, instruction, pooling_fields'
    fields -> (call, top_n, return docs)."""
    body = refuse_unknown(body, RERANK_FIELDS, "/v1/rerank")
    opts = pooling_options(body, limits, prefix)
    query = need_str(body.get("query"), "query")
    docs = body.get("documents")
    if isinstance(docs, list):
        docs = [d.get("text") if isinstance(d, dict) and set(d) == {"text"} else d for d in docs]
    docs = _text_list(docs, "documents")
    top_n = need_int(body["top_n"], "top_n", 0) if body.get("top_n") is not None else 0  # 0: every document
    ret = need_bool(body.get("return_documents", True), "return_documents")
    call = _pairs_call([query], docs, [(0, d) for d in range(len(docs))], cfg, _instructed(body, cfg, reranker),
                       encode, encode_plain, limits, opts, "documents")
    return call, min(top_n or len(docs), len(docs)), ret


def parse_score_body(body: Any, cfg: Optional[PoolingConfig], reranker: Optional[PairModel], encode: Encode,
                     encode_plain: Encode, limits: RuntimeLimits, prefix: str = "score") -> PairCall:
    """/v1/score (vLLM): queries and documents (or their older names text_1 and text_2), 1 x N (one query) or
    N x N (zipped), pooling_fields' fields."""
    body = refuse_unknown(body, SCORE_FIELDS, "/v1/score")
    opts = pooling_options(body, limits, prefix)
    given = [names for names in SCORE_NAMES if any(body.get(n) is not None for n in names)]
    if len(given) > 1:
        raise FieldError("text_1", "pass queries and documents, or their older names text_1 and text_2, not both")
    q_name, d_name = given[0] if given else SCORE_NAMES[0]
    left, right = _text_list(body.get(q_name), q_name), _text_list(body.get(d_name), d_name)
    if len(left) == 1:
        pairs = [(0, j) for j in range(len(right))]
    elif len(left) == len(right):
        pairs = [(i, i) for i in range(len(left))]
    else:
        raise FieldError(d_name, f"{q_name} has {len(left)} texts and {d_name} {len(right)}: give one of {q_name}, "
                                 f"or as many as {d_name}")
    return _pairs_call(left, right, pairs, cfg, _instructed(body, cfg, reranker), encode, encode_plain, limits, opts,
                       d_name)


def parse_classify_body(body: Any, cfg: Optional[PoolingConfig], enc: PromptEncoders, limits: RuntimeLimits,
                        prefix: str = "classify") -> EmbeddingCall:
    """/classify (vLLM's completion and chat forms): input or messages, pooling_fields' fields."""
    body = refuse_unknown(body, CLASSIFY_FIELDS, "/classify")
    if cfg is None or not cfg.classifies:
        raise ValueError("/classify needs a sequence classifier (a *ForSequenceClassification checkpoint); this "
                         f"server runs {'text generation' if cfg is None else 'an embedding model'}")
    opts = pooling_options(body, limits, prefix, prompts=True)
    prompts, encode, name = _prompts(body, opts, enc)
    return EmbeddingCall(pooling_requests(prompts, PoolSpec("classify"), encode, limits, name, opts,
                                          pad_id=cfg.pad_token_id), options=opts)
