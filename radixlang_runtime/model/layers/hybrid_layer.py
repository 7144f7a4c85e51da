"""HybridDecoderLayer: the decoder layer of the hybrid families (Qwen3-Next / Qwen3.5, Granite 4.0-H): norm, the
token mixer (a recurrent layer or attention), norm, feed-forward, with DecoderLayer's contract (the returned output
is added to the residual by the next norm)."""

from __future__ import annotations

import torch
from torch import nn

from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.layers.rms_norm import RMSNorm
from radixlang_runtime.model.loader.config import ModelConfig


class HybridDecoderLayer(nn.Module):
    """scale: Granite's residual_multiplier on the mixer's and the feed-forward's outputs (1.0: none)."""

    def __init__(self, mixer: nn.Module, mlp: nn.Module, cfg: ModelConfig, scale: float = 1.0):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mixer = mixer
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp
        self.scale = scale

    def forward(self, h: torch.Tensor, residual: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        x = self.input_layernorm(residual) if h is None else self.input_layernorm.add_forward(h, residual)
        a = self.mixer(x, fb)
        if self.scale == 1.0:
            return self.mlp(self.post_attention_layernorm.add_forward(a, residual))
        return self.mlp(self.post_attention_layernorm.add_forward(a * self.scale, residual)) * self.scale
