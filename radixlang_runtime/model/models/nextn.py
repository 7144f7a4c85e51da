"""The multi-token-prediction layer a DeepSeek V3 / GLM-4.5 checkpoint carries after its decoder (config.json's
num_nextn_predict_layers; SGLang's DeepseekV3ForCausalLMNextN / Glm4MoeForCausalLMNextN), run as its own model:
the draft of --speculative-algorithm NEXTN (speculative/nextn_draft.py).

At position i it reads the target's final hidden state h_i (after the final norm) and the token at i + 1, and
predicts the token at i + 2:

    x = eh_proj([enorm(embed(t_{i+1})), hnorm(h_i)])      # [2 hidden] -> [hidden]
    y = shared_head.norm(decoder_layer(x))                 # one layer of the family's own kind, own K/V
    logits = shared_head.head(y)

The checkpoint names it model.layers.{N}.* with N = num_hidden_layers: enorm, hnorm, eh_proj, shared_head.norm,
shared_head.head (the output head; lm_head where absent), embed_tokens (model.embed_tokens where absent) and the
decoder layer's own tensors. Here it is the family's model class with one layer (layer N's kind: MoE or dense)
whose `embed` is the projection above, so rope, attention, the MoE block, the final norm and the head are the
family's code. Only the first prediction layer is read (SGLang and vLLM chain that one layer too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from radixlang_runtime.model.layers.rms_norm import RMSNorm
from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.model.models.deepseek import DeepseekForCausalLM
from radixlang_runtime.model.models.moe_decoder import MoEForCausalLM

# the decoder's architecture -> its prediction layer's (the registry holds both)
NEXTN_ARCHS = {"DeepseekV3ForCausalLM": "DeepseekV3ForCausalLMNextN", "Glm4MoeForCausalLM": "Glm4MoeForCausalLMNextN"}


@dataclass(frozen=True)
class NextNLayer:
    """ModelConfig.family_options of a prediction layer: its index in the checkpoint (model.layers.{index})."""

    index: int


def nextn_parse(base: Callable[[dict], ModelConfig], arch: str) -> Callable[[dict], ModelConfig]:
    """config.json -> the prediction layer's ModelConfig: the decoder's (parsed with that one more layer, so the
    per-layer fields cover it) cut to layer N alone."""

    def parse(cfg: dict) -> ModelConfig:
        n = int(cfg.get("num_nextn_predict_layers") or 0)
        if n < 1:
            raise ValueError(f"{arch}: num_nextn_predict_layers is {n}: the checkpoint has no multi-token-prediction "
                             "layer (speculative_algorithm NEXTN reads it)")
        layers = int(cfg["num_hidden_layers"])
        out = base({**cfg, "num_hidden_layers": layers + 1})
        cut = {f: getattr(out, f)[layers:] for f in ("layer_windows", "layer_chunks", "layer_rope") if getattr(out, f)}
        moe = None if out.moe is None else dataclasses.replace(out.moe, sparse_layers=out.moe.sparse_layers[layers:])
        return dataclasses.replace(out, architecture=arch, num_hidden_layers=1, moe=moe,
                                   family_options=NextNLayer(layers), **cut)

    return parse


class NextNTensors:
    """The checkpoint under the names a one-layer decoder reads: layer 0 is model.layers.{N}, the final norm its
    shared_head.norm, the head its shared_head.head and the embedding its own copy, each where the file has it."""

    def __init__(self, tensors, index: int):
        self.tensors = tensors
        self.path = tensors.path
        own = f"model.layers.{index}."
        self._prefix = own
        self._names = {"model.norm.weight": own + "shared_head.norm.weight"}
        for name, alt in (("lm_head.weight", own + "shared_head.head.weight"),
                          ("model.embed_tokens.weight", own + "embed_tokens.weight")):
            self._names[name] = alt if alt in tensors else name

    def _name(self, name: str) -> str:
        if name.startswith("model.layers.0."):
            return self._prefix + name[len("model.layers.0."):]
        if name.startswith("model.layers."):
            raise ValueError(f"{name}: the prediction layer's model reads layer 0 only")
        return self._names.get(name, name)

    def __contains__(self, name: str) -> bool:
        return self._name(name) in self.tensors

    def get(self, name: str, rows=None, cols=None) -> torch.Tensor:
        return self.tensors.get(self._name(name), rows=rows, cols=cols)


class NextNModel:
    """Mixin over a family's model class (cfg: nextn_parse's): the projection of [embedding, hidden state] as the
    decoder's input. `hidden_in` ([T, hidden], the target's final hidden states row for row with the step's
    tokens) is set by the draft before each step; None runs zeros (the runner's warm-up)."""

    def __init__(self, cfg: ModelConfig, *args, **kwargs):
        super().__init__(cfg, *args, **kwargs)
        h = cfg.hidden_size
        self.enorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(h, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.hidden_in: Optional[torch.Tensor] = None

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        e = super().embed(ids)
        h = self.hidden_in
        if h is None:
            h = torch.zeros_like(e)
        elif h.shape != e.shape:
            raise ValueError(f"prediction layer: {tuple(h.shape)} hidden states for {tuple(e.shape)} embeddings")
        return self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h.to(e.dtype))], dim=-1))

    def load_hf_state_dict(self, tensors) -> None:
        super().load_hf_state_dict(NextNTensors(tensors, self.cfg.family_options.index))

    def load_layer_extras(self, i: int, tensors, put) -> None:
        super().load_layer_extras(i, tensors, put)
        for name in ("enorm.weight", "hnorm.weight", "eh_proj.weight"):
            put(name, tensors.get("model.layers.0." + name))

    def use_gguf_blocks(self, blocks: dict) -> int:
        raise ValueError("the prediction layer runs on float weights (its checkpoint's safetensors)")


class DeepseekNextN(NextNModel, DeepseekForCausalLM):
    """DeepSeek V3's prediction layer: multi-head latent attention and a MoE block."""


class Glm4MoeNextN(NextNModel, MoEForCausalLM):
    """GLM-4.5's prediction layer: GQA attention with partial rotary and a MoE block."""
