"""The multi-token-prediction layer a checkpoint carries after its decoder, run as its own model: the draft of
--speculative-algorithm NEXTN (speculative/nextn_draft.py). DeepSeek V3 / GLM-4.5 (config.json's
num_nextn_predict_layers; SGLang's DeepseekV3ForCausalLMNextN / Glm4MoeForCausalLMNextN) and Qwen3-Next / Qwen3.5
(mtp_num_hidden_layers; SGLang's Qwen3NextForCausalLMMTP).

At position i it reads the target's final hidden state h_i (after the final norm) and the token at i + 1, and
predicts the token at i + 2:

    x = eh_proj([enorm(embed(t_{i+1})), hnorm(h_i)])      # [2 hidden] -> [hidden]
    y = norm(decoder_layer(x))                             # one layer of the family's own kind, own K/V
    logits = head(y)

DeepSeek / GLM name it model.layers.{N}.* (N = num_hidden_layers): enorm, hnorm, eh_proj, shared_head.norm,
shared_head.head (the output head; lm_head where absent), embed_tokens (model.embed_tokens where absent) and the
decoder layer's own tensors. Qwen3-Next / Qwen3.5 name it mtp.*: pre_fc_norm_embedding, pre_fc_norm_hidden, fc,
norm (zero-centred norms, as the family's) and layers.0 (a full-attention layer), with the decoder's embedding and
head. Here it is the family's model class with that one layer (MoE or dense as the checkpoint's) whose `embed` is
the projection above, so rope, attention, the feed-forward, the final norm and the head are the family's code.
Only the first prediction layer is read (SGLang and vLLM chain that one layer too).
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
from radixlang_runtime.model.layers.hybrid_layer import HybridDecoderLayer
from radixlang_runtime.model.models.qwen3_next import GatedAttention, HybridForCausalLM

# the decoder's architecture -> its prediction layer's (the registry holds both)
NEXTN_ARCHS = {"DeepseekV3ForCausalLM": "DeepseekV3ForCausalLMNextN", "Glm4MoeForCausalLM": "Glm4MoeForCausalLMNextN",
               "Qwen3NextForCausalLM": "Qwen3NextForCausalLMMTP", "Qwen3_5ForCausalLM": "Qwen3_5ForCausalLMMTP"}


@dataclass(frozen=True)
class NextNLayer:
    """ModelConfig.family_options of a prediction layer: where its tensors are (`layer`: its decoder layer's prefix,
    `module`: the prefix of its own tensors) and whether its norms are zero-centred (1 + w)."""

    layer: str  # "model.layers.61." / "mtp.layers.0."
    module: str  # "model.layers.61." / "mtp."
    centred: bool = False


def nextn_parse(base: Callable[[dict], ModelConfig], arch: str) -> Callable[[dict], ModelConfig]:
    """DeepSeek V3 / GLM-4.5: config.json -> the prediction layer's ModelConfig: the decoder's (parsed with that one
    more layer, so the per-layer fields cover it) cut to layer N alone."""

    def parse(cfg: dict) -> ModelConfig:
        n = int(cfg.get("num_nextn_predict_layers") or 0)
        if n < 1:
            raise ValueError(f"{arch}: num_nextn_predict_layers is {n}: the checkpoint has no multi-token-prediction "
                             "layer (speculative_algorithm NEXTN reads it)")
        layers = int(cfg["num_hidden_layers"])
        out = base({**cfg, "num_hidden_layers": layers + 1})
        cut = {f: getattr(out, f)[layers:] for f in ("layer_windows", "layer_chunks", "layer_rope") if getattr(out, f)}
        moe = None if out.moe is None else dataclasses.replace(out.moe, sparse_layers=out.moe.sparse_layers[layers:])
        own = f"model.layers.{layers}."
        return dataclasses.replace(out, architecture=arch, num_hidden_layers=1, moe=moe,
                                   family_options=NextNLayer(own, own), **cut)

    return parse


def mtp_parse(base: Callable[[dict], ModelConfig], arch: str) -> Callable[[dict], ModelConfig]:
    """Qwen3-Next / Qwen3.5: config.json -> the prediction layer's ModelConfig: one full-attention layer (no
    recurrent state), a MoE block where the decoder has experts."""

    def parse(cfg: dict) -> ModelConfig:
        n = int(cfg.get("mtp_num_hidden_layers") or 0)
        if n < 1:
            raise ValueError(f"{arch}: mtp_num_hidden_layers is {n}: the checkpoint has no multi-token-prediction "
                             "layer (speculative_algorithm NEXTN reads it)")
        if cfg.get("mtp_use_dedicated_embeddings"):
            raise ValueError(f"{arch}: mtp_use_dedicated_embeddings true is not supported (the layer reads the "
                             "decoder's embedding)")
        out = base(cfg)
        moe = None if out.moe is None else dataclasses.replace(out.moe, sparse_layers=(True,))
        return dataclasses.replace(out, architecture=arch, num_hidden_layers=1, moe=moe, linear_attn=None,
                                   family_options=NextNLayer("mtp.layers.0.", "mtp.", centred=True))

    return parse


class NextNTensors:
    """The checkpoint under the names a one-layer decoder reads: layer 0 is the prediction layer's, the final norm
    its own (shared_head.norm / mtp.norm), the head and the embedding its own where the file has them."""

    def __init__(self, tensors, where: NextNLayer):
        self.tensors = tensors
        self.path = tensors.path
        self._layer = where.layer
        self._module = own = where.module
        self._names = {"model.norm.weight": own + ("norm.weight" if where.centred else "shared_head.norm.weight")}
        for name, alt in (("lm_head.weight", own + "shared_head.head.weight"),
                          ("model.embed_tokens.weight", own + "embed_tokens.weight")):
            self._names[name] = alt if alt in tensors else name

    def _name(self, name: str) -> str:
        if name.startswith("model.layers.0."):
            return self._layer + name[len("model.layers.0."):]
        if name.startswith("model.layers."):
            raise ValueError(f"{name}: the prediction layer's model reads layer 0 only")
        return self._names.get(name, name)

    def __contains__(self, name: str) -> bool:
        return self._name(name) in self.tensors

    def own(self, name: str) -> torch.Tensor:
        """The layer's own tensor `name` (after NextNLayer.module: its projections and norms)."""
        return self.tensors.get(self._module + name)

    def same_as_decoder(self, name: str) -> bool:
        """Whether the layer's `name` (lm_head.weight, model.embed_tokens.weight) holds the decoder's values: read
        from the decoder's own tensor, or a copy equal to it."""
        own = self._names[name]
        return own == name or (name in self.tensors and torch.equal(self.tensors.get(own), self.tensors.get(name)))

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

    # the parameter -> its tensor's name after NextNLayer.module (DeepSeek / GLM; Qwen's below)
    extra_names = {"enorm": "enorm.weight", "hnorm": "hnorm.weight", "eh_proj": "eh_proj.weight"}

    def load_hf_state_dict(self, tensors) -> None:
        view = NextNTensors(tensors, self.cfg.family_options)
        super().load_hf_state_dict(view)
        # what the draft may take from the decoder instead of its own copy (NextNDraft.share_decoder_weights)
        self.same_embedding = view.same_as_decoder("model.embed_tokens.weight")
        self.same_head = self.same_embedding if self.lm_head is None else view.same_as_decoder("lm_head.weight")

    def load_layer_extras(self, i: int, tensors, put) -> None:
        super().load_layer_extras(i, tensors, put)
        centred = self.cfg.family_options.centred
        for param, name in self.extra_names.items():
            w = tensors.own(name)  # tensors: the NextNTensors view load_hf_state_dict hands the decoder's loader
            put(param + ".weight", 1.0 + w.float() if centred and param != "eh_proj" else w)

    def use_gguf_blocks(self, blocks: dict) -> int:
        raise ValueError("the prediction layer runs on float weights (its checkpoint's safetensors)")


class DeepseekNextN(NextNModel, DeepseekForCausalLM):
    """DeepSeek V3's prediction layer: multi-head latent attention and a MoE block."""


class Glm4MoeNextN(NextNModel, MoEForCausalLM):
    """GLM-4.5's prediction layer: GQA attention with partial rotary and a MoE block."""


class HybridMTP(NextNModel, HybridForCausalLM):
    """Qwen3-Next's / Qwen3.5's prediction layer: one gated full-attention layer (partial rotary, q / k norms, the
    output gate) with Qwen3-Next's MoE block or Qwen3.5's dense MLP, zero-centred norms."""

    extra_names = {"enorm": "pre_fc_norm_embedding.weight", "hnorm": "pre_fc_norm_hidden.weight",
                   "eh_proj": "fc.weight"}

    def make_layers(self, cfg: ModelConfig, backend, shard, reduce) -> list[nn.Module]:
        return [HybridDecoderLayer(GatedAttention(cfg, 0, backend, shard, reduce), self.make_mlp(cfg, 0, shard, reduce),
                                   cfg)]

