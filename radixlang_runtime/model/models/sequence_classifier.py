"""Llama / Mistral / Qwen2 / Qwen3 / Gemma 2 *ForSequenceClassification and Gemma3TextForSequenceClassification:
the native decoder (llama.py, gemma2.py, gemma3.py) plus transformers' `score` head (Linear hidden -> num_labels,
no bias), which pooling's classify mode applies to the last token's final hidden state (executor/pooling_step.py).
The LM head is the tied embedding, never used for classify (a classifier's checkpoint has no lm_head: the runner
ties it as for any pooling model).

The head's weight is a buffer, not a parameter: the decoder's loader covers every parameter it names, and the
head stays a plain dense copy whatever packs or quantizes the decoder's linears. The label semantics (id2label,
problem_type, activation) are classifier.py's.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from radixlang_runtime.classifier import classifier_labels
from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.model.loader.weights import SafetensorsDir
from radixlang_runtime.model.models import llama_family
from radixlang_runtime.model.models.gemma2 import Gemma2ForCausalLM, parse_gemma2
from radixlang_runtime.model.models.gemma3 import Gemma3ForCausalLM, parse_gemma3
from radixlang_runtime.model.models.llama import LlamaForCausalLM


class ScoreHead:
    """The score head over a decoder class (a torch module listed after it in the bases)."""

    def __init__(self, cfg: ModelConfig, *a, **kw):
        super().__init__(cfg, *a, **kw)
        self.register_buffer("score_weight", torch.empty(cfg.num_labels, cfg.hidden_size))  # [num_labels, hidden]

    def load_hf_state_dict(self, tensors: SafetensorsDir) -> None:
        super().load_hf_state_dict(tensors)
        if "score.bias" in tensors:
            raise ValueError(f"score.bias: a score head with a bias is not supported ({self.cfg.architecture}'s "
                             "score has none)")
        w = tensors.get("score.weight")
        if tuple(w.shape) != tuple(self.score_weight.shape):
            raise ValueError(f"weight score.weight: expected shape {tuple(self.score_weight.shape)} (num_labels, "
                             f"hidden_size), got {tuple(w.shape)}")
        with torch.no_grad():
            self.score_weight.copy_(w)

    def classify_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [R, hidden] float32 (final_hidden's rows) -> float32 logits [R, num_labels], the head run in the
        weights' dtype as transformers runs it."""
        return F.linear(hidden.to(self.score_weight.dtype), self.score_weight).float()


class SequenceClassifier(ScoreHead, LlamaForCausalLM):
    """Llama, Mistral, Qwen2, Qwen3."""


class Gemma2SequenceClassifier(ScoreHead, Gemma2ForCausalLM):
    """Gemma 2 (Skywork-Reward-Gemma and other reward models): the score head reads the final norm's output; the
    logit soft-capping is the LM head's, never the score's."""


class Gemma3SequenceClassifier(ScoreHead, Gemma3ForCausalLM):
    """Gemma 3 text (Gemma3TextForSequenceClassification): Gemma 2's head rule over Gemma 3's decoder."""


def _classifier(parse):
    def parse_classifier(cfg: dict) -> ModelConfig:
        arch = cfg["architectures"][0]
        if cfg.get("quantization_config") is not None:
            raise ValueError(f"quantization_config is not supported for {arch} (a pre-quantized classifier)")
        return dataclasses.replace(parse(cfg), architecture=arch, num_labels=len(classifier_labels(cfg)))
    return parse_classifier


parse_llama_classifier = _classifier(llama_family.parse_llama)
parse_mistral_classifier = _classifier(llama_family.parse_mistral)
parse_gemma2_classifier = _classifier(parse_gemma2)
parse_gemma3_classifier = _classifier(parse_gemma3)
parse_qwen2_classifier = _classifier(llama_family.parse_qwen2)
parse_qwen3_classifier = _classifier(llama_family.parse_qwen3)
