"""The Llama decoder with the sparse mixture-of-experts block (model/layers/moe.py) in the layers the config marks:
the base of the MoE families (Mixtral, Qwen2 / Qwen3 MoE, OLMoE, GLM-4.5, DeepSeek, gpt-oss, Qwen3-Next)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from radixlang_runtime.model.executor.parallel import Reduce, Shard
from radixlang_runtime.model.layers.mlp import MLP
from radixlang_runtime.model.layers.moe import SparseMoE
from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.model.loader.weights import SafetensorsDir
from radixlang_runtime.model.models.llama import LlamaForCausalLM


class MoEForCausalLM(LlamaForCausalLM):
    """The Llama decoder with SparseMoE blocks in the layers cfg.moe.sparse_layers marks (the others keep the
    dense MLP). Checkpoints: per-expert tensors (the hub's layout: {block}.experts.{e}.{gate,up,down names})
    or transformers 5's stacked ones ({block}.experts.gate_up_proj [E, 2I, hidden], .down_proj [E, hidden, I])."""

    @staticmethod
    def make_mlp(cfg: ModelConfig, layer_id: int, shard: Shard, reduce: Reduce) -> nn.Module:
        if cfg.moe.sparse_layers[layer_id]:
            return SparseMoE(cfg, shard, reduce)
        return MLP(cfg, shard, reduce)

    def load_mlp(self, i: int, tensors: SafetensorsDir, put: Callable[[str, torch.Tensor], None]) -> None:
        block = self.layers[i].mlp
        if not isinstance(block, SparseMoE):
            return super().load_mlp(i, tensors, put)
        spec, dst = self.cfg.moe, f"layers.{i}.mlp."
        stacked = f"model.layers.{i}.mlp.experts.gate_up_proj" in tensors  # transformers 5 names it "mlp"
        src = f"model.layers.{i}.{'mlp' if stacked else spec.block}."
        cols = (block.inter_start, block.inter_start + block.inter)
        put(dst + "router", tensors.get(src + "gate.weight"))
        if spec.routing is not None:
            block.router_float32 = tensors.get(src + "gate.weight").float().to(block.router.device)
            if spec.routing.correction_bias:
                put(dst + "correction_bias", tensors.get(src + "gate.e_score_correction_bias"))
        if stacked:  # read whole, keep this rank's columns
            full = tensors.get(src + "experts.gate_up_proj")  # [E, 2I, hidden]
            half = spec.expert_intermediate_size
            put(dst + "gate_up", torch.cat([full[:, cols[0]:cols[1]], full[:, half + cols[0]:half + cols[1]]], 1))
            put(dst + "down", tensors.get(src + "experts.down_proj")[:, :, cols[0]:cols[1]])
        else:
            g, u, d = spec.expert_names
            put(dst + "gate_up", torch.stack([torch.cat([
                tensors.get(f"{src}experts.{e}.{g}.weight", rows=cols),
                tensors.get(f"{src}experts.{e}.{u}.weight", rows=cols)]) for e in range(spec.num_experts)]))
            put(dst + "down", torch.stack([tensors.get(f"{src}experts.{e}.{d}.weight", cols=cols)
                                           for e in range(spec.num_experts)]))
        if block.shared is not None:
            s = f"{src}{spec.shared_name}."
            rows = (block.shared_start, block.shared_start + block.shared.inter)
            put(dst + "shared.gate_up_proj.weight", torch.cat([tensors.get(s + "gate_proj.weight", rows=rows),
                                                               tensors.get(s + "up_proj.weight", rows=rows)]))
            put(dst + "shared.down_proj.weight", tensors.get(s + "down_proj.weight", cols=rows))
            if spec.shared_gated:
                put(dst + "shared_gate", tensors.get(src + "shared_expert_gate.weight"))

    def use_gguf_blocks(self, blocks: dict) -> int:
        raise ValueError(f"--quantization gguf is not supported for {self.cfg.architecture} (mixture of experts)")
