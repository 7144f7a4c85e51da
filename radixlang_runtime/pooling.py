"""Pooling models (--is-embedding) and prompt scoring: how a prompt's final hidden states become one vector.

- PoolingConfig: what a model directory says about its embeddings, read once (read_pooling_config): a
  sentence-transformers directory (modules.json: Transformer -> Pooling -> optional Normalize; 1_Pooling/config.json
  picks last-token / mean / CLS; config_sentence_transformers.json's default prompt; sentence_bert_config.json's
  max_seq_length), else vLLM's default for a decoder (last token, L2-normalized). A module or setting whose math is
  not implemented (Dense, max / weighted-mean pooling, lower-casing, ...) is refused by name.
- A sequence classifier's directory (classifier.py: *ForSequenceClassification) pools the last token through its
  score head: PoolingConfig.labels (id2label) and .activation say how its logits become probabilities.
- PoolSpec: what one request asks the scheduler for (travels in TokenizedGenerateReq.pooling): a pooled hidden
  state (last / mean / cls), for rerankers the logits of a few tokens at the last position (token_logits), or for
  a classifier its score head's logits at the last position (classify).
- finish_embedding: the edge's last steps (Matryoshka truncation, then L2 normalization, as vLLM orders them).
Torch-free.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from radixlang_runtime.classifier import (classifier_activation, classifier_architecture, classifier_labels,
                                          classifier_pad_id)

HIDDEN_MODES = ("last", "mean", "cls")  # a pooled final hidden state
# token_logits: logits of token_ids at the last position; classify: the score head's logits at the last position
POOL_MODES = (*HIDDEN_MODES, "token_logits", "classify")

# modules.json types by class name (sentence-transformers < 6: sentence_transformers.models.X; 6:
# sentence_transformers.base.modules.transformer.Transformer, ...pooling.Pooling, ...normalize.Normalize)
_ST_PIPELINE = ("Transformer", "Pooling", "Normalize")
# 1_Pooling/config.json's modes -> ours: "pooling_mode": name (6) or pooling_mode_<name>: true (< 6); others refused
_ST_MODES = {"lasttoken": "last", "mean_tokens": "mean", "mean": "mean", "cls_token": "cls", "cls": "cls"}


@dataclass(frozen=True)
class PoolSpec:
    mode: str  # one of POOL_MODES
    token_ids: tuple[int, ...] = ()  # token_logits: whose logits (in this order)

    def __post_init__(self) -> None:
        if self.mode not in POOL_MODES:
            raise ValueError(f"pooling mode {self.mode!r}: choose one of {', '.join(POOL_MODES)}")
        if (self.mode == "token_logits") != bool(self.token_ids):
            raise ValueError("token_ids go with pooling mode token_logits (and only with it)")

    @property
    def needs_all_positions(self) -> bool:
        """mean / cls read positions a cached prefix would skip: the whole prompt is computed."""
        return self.mode in ("mean", "cls")

    def to_wire(self) -> list:
        return [self.mode, list(self.token_ids)]

    @staticmethod
    def from_wire(wire: list) -> "PoolSpec":
        return PoolSpec(str(wire[0]), tuple(int(t) for t in wire[1]))


@dataclass(frozen=True)
class PoolingConfig:
    mode: str = "last"  # last | mean | cls
    normalize: bool = True
    # "sentence-transformers": read from its modules; "default": vLLM's decoder default; "classifier": a
    # *ForSequenceClassification checkpoint (classifier.py)
    source: str = "default"
    # Matryoshka-trained (config.json or config_sentence_transformers.json: is_matryoshka / matryoshka_dimensions):
    # `dimensions` may truncate; matryoshka_dimensions, when given, lists the sizes allowed
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()
    max_seq_length: Optional[int] = None  # sentence_bert_config.json: longer inputs are refused, never truncated
    default_prompt: str = ""  # config_sentence_transformers.json's default_prompt_name's text, put before text inputs
    # sentence-transformers >= 6 with a "message" modality (sentence_bert_config.json): a text input is rendered as
    # one user message through the tokenizer's chat template (no generation prompt), then tokenized
    chat_template: bool = False
    hidden_size: int = 0
    labels: tuple[str, ...] = ()  # a classifier's labels by index (id2label); (): an embedding model
    activation: str = ""  # a classifier's logits -> probs: classifier.ACTIVATIONS
    pad_token_id: Optional[int] = None  # a classifier's pad token: trailing ones are not classified (classifier.py)

    @property
    def classifies(self) -> bool:
        return bool(self.labels)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "normalize": self.normalize, "source": self.source, "matryoshka": self.matryoshka,
                "matryoshka_dimensions": list(self.matryoshka_dimensions), "max_seq_length": self.max_seq_length,
                "default_prompt": self.default_prompt, "hidden_size": self.hidden_size,
                "chat_template": self.chat_template, "labels": list(self.labels), "activation": self.activation,
                "pad_token_id": self.pad_token_id}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "PoolingConfig":
        return PoolingConfig(**{**d, "matryoshka_dimensions": tuple(d.get("matryoshka_dimensions") or ()),
                                "labels": tuple(d.get("labels") or ())})


def _load(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def _matryoshka(*configs: dict) -> tuple[bool, tuple[int, ...]]:
    dims: tuple[int, ...] = ()
    flag = False
    for cfg in configs:
        if cfg.get("matryoshka_dimensions"):
            dims = tuple(int(d) for d in cfg["matryoshka_dimensions"])
        flag = flag or bool(cfg.get("is_matryoshka")) or bool(dims)
    return flag, dims


def read_pooling_config(model_dir: str) -> PoolingConfig:
    """The directory's pooling (see the module docstring); ValueError names what is not implemented."""
    cfg = _load(os.path.join(model_dir, "config.json"))
    hidden = int(cfg.get("hidden_size") or 0)
    if classifier_architecture(cfg) is not None:  # the score head on the last token, never normalized
        labels = classifier_labels(cfg)
        return PoolingConfig(mode="last", normalize=False, source="classifier", hidden_size=hidden, labels=labels,
                             activation=classifier_activation(cfg, len(labels)), pad_token_id=classifier_pad_id(cfg))
    st_path = os.path.join(model_dir, "config_sentence_transformers.json")
    st_cfg = _load(st_path) if os.path.isfile(st_path) else {}
    matryoshka, dims = _matryoshka(cfg, st_cfg)
    modules_path = os.path.join(model_dir, "modules.json")
    if not os.path.isfile(modules_path):
        return PoolingConfig(hidden_size=hidden, matryoshka=matryoshka, matryoshka_dimensions=dims)
    modules = sorted(_load(modules_path), key=lambda m: int(m.get("idx", 0)))
    types = [m.get("type", "") for m in modules]
    names = [t.rsplit(".", 1)[-1] if t.startswith("sentence_transformers.") else t for t in types]
    for t, name in zip(types, names):
        if name not in _ST_PIPELINE:
            raise ValueError(f"sentence-transformers module {t!r} (modules.json) is not supported: only Transformer "
                             "-> Pooling -> Normalize pipelines are served")
    if names[:2] != ["Transformer", "Pooling"] or names[2:] not in ([], ["Normalize"]):
        raise ValueError(f"sentence-transformers pipeline {names} is not supported: only Transformer -> Pooling "
                         "(-> Normalize) is served")
    if modules[0].get("path", "") not in ("", "."):
        raise ValueError(f"sentence-transformers Transformer module at {modules[0]['path']!r}: only a Transformer "
                         "saved at the directory's root is served")
    mode = _pooling_mode(_load(os.path.join(model_dir, modules[1]["path"], "config.json")))
    bert_path = os.path.join(model_dir, "sentence_bert_config.json")
    bert = _load(bert_path) if os.path.isfile(bert_path) else {}
    if bert.get("do_lower_case"):
        raise ValueError("sentence_bert_config.json do_lower_case true is not supported")
    prompt = ""
    if st_cfg.get("default_prompt_name"):
        prompts = st_cfg.get("prompts") or {}
        if st_cfg["default_prompt_name"] not in prompts:
            raise ValueError(f"config_sentence_transformers.json: default_prompt_name "
                             f"{st_cfg['default_prompt_name']!r} is not among its prompts")
        prompt = str(prompts[st_cfg["default_prompt_name"]])
    max_len = bert.get("max_seq_length")
    message = "message" in (bert.get("modality_config") or {})
    if message and bert.get("processing_kwargs"):
        raise ValueError("sentence_bert_config.json processing_kwargs are not supported")
    if message and prompt:
        raise ValueError("a default prompt (config_sentence_transformers.json default_prompt_name) with the chat "
                         "template's message modality is not supported")
    return PoolingConfig(mode=mode, normalize=len(names) == 3, source="sentence-transformers", matryoshka=matryoshka,
                         matryoshka_dimensions=dims, max_seq_length=int(max_len) if max_len else None,
                         default_prompt=prompt, hidden_size=hidden, chat_template=message)


def _pooling_mode(pool: dict) -> str:
    """1_Pooling/config.json: exactly one mode, an implemented one."""
    on = pool.get("pooling_mode")
    if on is not None:
        on = [on] if isinstance(on, str) else list(on)
    else:
        on = sorted(k[len("pooling_mode_"):] for k, v in pool.items() if k.startswith("pooling_mode_") and v)
    if unknown := [k for k in on if k not in _ST_MODES]:
        raise ValueError(f"sentence-transformers Pooling mode {unknown[0]!r} is not supported (implemented: "
                         "lasttoken, mean, cls)")
    if len(on) != 1:
        raise ValueError(f"sentence-transformers Pooling must use exactly one mode, got {on}")
    if pool.get("include_prompt", True) is False:
        raise ValueError("sentence-transformers Pooling include_prompt false is not supported")
    return _ST_MODES[on[0]]


def check_dimensions(cfg: PoolingConfig, dimensions: int) -> None:
    """`dimensions` (OpenAI): only for a Matryoshka-trained model, within its sizes."""
    if not cfg.matryoshka:
        raise ValueError("dimensions is not supported: the model is not Matryoshka-trained (config.json / "
                         "config_sentence_transformers.json set neither is_matryoshka nor matryoshka_dimensions)")
    if not 1 <= dimensions <= cfg.hidden_size:
        raise ValueError(f"dimensions must be in [1, {cfg.hidden_size}], got {dimensions}")
    if cfg.matryoshka_dimensions and dimensions not in cfg.matryoshka_dimensions:
        raise ValueError(f"dimensions {dimensions} is not one the model was trained for: "
                         f"{list(cfg.matryoshka_dimensions)}")


def finish_embedding(vec: list[float], normalize: bool, dimensions: Optional[int] = None) -> list[float]:
    """Truncate to `dimensions` (Matryoshka), then L2-normalize when the model says so."""
    if dimensions is not None:
        vec = vec[:dimensions]
    if not normalize:
        return list(vec)
    norm = math.sqrt(math.fsum(x * x for x in vec))
    return [x / max(norm, 1e-12) for x in vec]  # sentence-transformers' F.normalize eps


def softmax_last(logits: list[float]) -> float:
    """P(last token) under a softmax over these logits: a reranker's yes-probability for logits of
    (no, yes) (vLLM's classifier_from_token order)."""
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    return exps[-1] / math.fsum(exps)


@dataclass
class PooledSum:
    """A request's pooled state across the steps of its prompt (chunked prefill): mean adds per chunk."""

    spec: PoolSpec
    vec: Optional[list[float]] = None
    rows: int = field(default=0)

    def add(self, part: list[float], rows: int) -> None:
        if self.spec.mode == "mean" and self.vec is not None:
            self.vec = [a + b for a, b in zip(self.vec, part)]
        else:
            self.vec = list(part)
        self.rows += rows

    def result(self) -> Optional[list[float]]:
        if self.vec is None or self.spec.mode != "mean":
            return self.vec
        return [x / self.rows for x in self.vec]


def check_pooling_args(args: Any) -> None:
    """ServerArgs' --is-embedding with what it does not combine with, and the reranker's settings
    (docs/EMBEDDINGS.md)."""
    if args.is_embedding:
        for name, off in (("speculative_algorithm", None), ("disaggregation_mode", "null"),
                          ("quantization", None)):
            if getattr(args, name) != off:
                raise ValueError(f"{name} {getattr(args, name)!r} is not implemented with a pooling model "
                                 "(--is-embedding, or a sequence classifier's checkpoint)")
    tokens = args.classifier_from_token.split(",")
    if len(tokens) != 2 or not all(tokens):
        raise ValueError(f"classifier_from_token must be two tokens 'false,true' (e.g. no,yes); got "
                         f"{args.classifier_from_token!r}")
    if args.rerank_template is not None and "{document}" not in args.rerank_template:
        raise ValueError("rerank_template must hold {document} (and {query})")
