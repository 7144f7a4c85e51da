"""Sequence classifiers (transformers' *ForSequenceClassification): what config.json says about the head, and
how a classify result's probabilities come from its logits, as vLLM serves them (docs/EMBEDDINGS.md).

- A classifier is the native decoder plus `score` (Linear hidden -> num_labels, no bias) applied to the last
  token's final hidden state (models/sequence_classifier.py). Its checkpoint is served as a pooling model
  whether --is-embedding is given or not (vLLM's --runner auto picks its pooling runner from the architecture).
- pad_token_id (config.json): transformers pools the rightmost token that is not the pad token, so a prompt
  ending in pad tokens is classified without them (the decoder is causal: that row's state is the same either
  way); vLLM pools the last token whatever it is.
- labels: id2label by index (transformers saves id2label, num_labels is its length).
- activation (vLLM's classify activation, aligned with transformers' loss for problem_type): softmax over the
  labels; sigmoid for one label or multi_label_classification; identity for regression.
- score / rerank: a one-label classifier scores a (query, document) pair as a cross-encoder: sigmoid(logit).
Torch-free.
"""

from __future__ import annotations

import math
from typing import Any, Optional

SUFFIX = "ForSequenceClassification"
CLASSIFIER_ARCHS = ("LlamaForSequenceClassification", "MistralForSequenceClassification",
                    "Qwen2ForSequenceClassification", "Qwen3ForSequenceClassification",
                    "Gemma2ForSequenceClassification", "Gemma3TextForSequenceClassification")
ACTIVATIONS = ("softmax", "sigmoid", "identity")
_PROBLEM_TYPES = (None, "single_label_classification", "multi_label_classification", "regression")
# the score activation a cross-encoder's config may name (sentence-transformers' CrossEncoder): only the default
_SCORE_ACTIVATION_KEYS = ("sbert_ce_default_activation_function",)
_SIGMOID = "torch.nn.modules.activation.Sigmoid"


def classifier_architecture(cfg: dict) -> Optional[str]:
    """config.json's architecture when it is a sequence classifier (None: it is not one); ValueError for a
    classifier architecture not served here."""
    arch = (cfg.get("architectures") or [""])[0]
    if not arch.endswith(SUFFIX):
        return None
    if arch not in CLASSIFIER_ARCHS:
        raise ValueError(f"{arch} is not supported: the sequence classifiers served are "
                         f"{', '.join(CLASSIFIER_ARCHS)} (on the native decoders)")
    return arch


def classifier_labels(cfg: dict) -> tuple[str, ...]:
    """id2label by index (transformers' default names LABEL_i when config.json has only num_labels)."""
    id2label: dict[str, Any] = cfg.get("id2label") or {}
    n = len(id2label) if id2label else int(cfg.get("num_labels", 2))
    if n < 1:
        raise ValueError(f"num_labels must be >= 1, got {n}")
    if id2label and sorted(int(k) for k in id2label) != list(range(n)):
        raise ValueError(f"id2label's keys must be 0 .. {n - 1}, got {sorted(id2label)}")
    return tuple(str(id2label[str(i)]) if id2label else f"LABEL_{i}" for i in range(n))


def classifier_activation(cfg: dict, num_labels: int) -> str:
    """The classify activation (module docstring); ValueError names a setting whose math is not implemented."""
    problem = cfg.get("problem_type")
    if problem not in _PROBLEM_TYPES:
        raise ValueError(f"problem_type {problem!r} is not supported (choose one of "
                         f"{', '.join(p for p in _PROBLEM_TYPES if p)})")
    for key in _SCORE_ACTIVATION_KEYS:
        if cfg.get(key) not in (None, _SIGMOID):
            raise ValueError(f"{key} {cfg[key]!r} is not supported: a one-label classifier scores pairs with "
                             "a sigmoid")
    act_fn = (cfg.get("sentence_transformers") or {}).get("activation_fn")
    if act_fn not in (None, _SIGMOID):
        raise ValueError(f"sentence_transformers activation_fn {act_fn!r} is not supported: a one-label "
                         "classifier scores pairs with a sigmoid")
    if problem == "regression":
        return "identity"
    if problem == "multi_label_classification" or num_labels == 1:
        return "sigmoid"
    return "softmax"


def classifier_pad_id(cfg: dict) -> Optional[int]:
    """config.json's pad_token_id (None: the last token is pooled whatever it is); ValueError for a non-integer."""
    pad = cfg.get("pad_token_id")
    if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or pad < 0):
        raise ValueError(f"pad_token_id must be a token id (a non-negative integer) or null, got {pad!r}")
    return pad


def without_trailing_pad(ids: list[int], pad_id: Optional[int]) -> list[int]:
    """The prompt up to the token transformers' classifier pools: the rightmost one that is not pad_id (a prompt of
    nothing but pad tokens pools its first)."""
    if pad_id is None:
        return ids
    end = len(ids)
    while end > 1 and ids[end - 1] == pad_id:
        end -= 1
    return ids[:end]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def classify_probs(logits: list[float], activation: str) -> list[float]:
    """A classify result's `probs` from the score head's logits."""
    if activation == "identity":
        return list(logits)
    if activation == "sigmoid":
        return [_sigmoid(x) for x in logits]
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = math.fsum(exps)
    return [e / total for e in exps]


def cross_encoder_score(logits: list[float]) -> float:
    """A one-label classifier's score of a pair (vLLM's cross-encoder default): sigmoid of its logit."""
    return _sigmoid(logits[0])
