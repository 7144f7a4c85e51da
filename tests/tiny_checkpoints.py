"""Tiny random checkpoints made by transformers inside a test (config -> random weights -> save_pretrained,
the embedded tokenizer beside them) and transformers' own greedy output on them: the reference every model
family's parity test compares against (float32)."""

from __future__ import annotations

import copy
from typing import Optional

# transformers' eager attention is the reference: its SDPA path drops Gemma 2's attention logit soft-cap in some
# versions (5.17: greedy ids unchanged with the cap removed; the logprobs 2.3e-4 off ours), eager honours it in all
REFERENCE_ATTENTION = "eager"


_BUILT: dict = {}


def built_tiny(name: str, cases: dict, tiny: dict, tmp_path_factory):
    """(directory, transformers model) of cases[name] = (config class, overrides) over `tiny`, built once per
    pytest run (module-scoped fixtures of several modules share it)."""
    if name not in _BUILT:
        path = tmp_path_factory.mktemp(name)
        cls_name, kwargs = cases[name]
        _BUILT[name] = (path, build_tiny(path, cls_name, tiny, kwargs))
    return _BUILT[name]


def build_tiny(tmp_path, cls_name: str, tiny: dict, kwargs: dict, save: Optional[dict] = None, seed: int = 0):
    """transformers' `cls_name` config (the embedded tokenizer's vocabulary, `tiny` overridden by `kwargs`)
    with random float32 weights drawn from `seed`, saved with the tokenizer to tmp_path; returns the eval-mode model."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    cfg = getattr(transformers, cls_name)(vocab_size=len(tok), **{**tiny, **kwargs})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=REFERENCE_ATTENTION).eval()
    model.save_pretrained(tmp_path, safe_serialization=True, **(save or {}))
    tok.save_pretrained(tmp_path)
    return model


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """Exactly n greedy tokens after ids (EOS id 2 does not stop it)."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=2)
    return out[0, len(ids):].tolist()


def with_config(model, change: dict):
    """The same weights under a config with `change` applied (a contrast: the parity test can fail)."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(model.config)
    for k, v in change.items():
        setattr(cfg, k, v)
    other = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=REFERENCE_ATTENTION).eval()
    other.load_state_dict(model.state_dict())
    return other


def byte_tokenizer(path):
    """A byte-level tokenizer of 259 ids saved to path: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2 (EOS),
    then one token per byte (GPT-2's byte <-> unicode table, no merges). Grammar compiles over it are
    cheap, and every output a grammar allows is some token sequence."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(specials)} | {c: i + len(specials) for i, c in enumerate(alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=specials[0], eos_token=specials[2],
                                  additional_special_tokens=specials[1:2])
    tok.save_pretrained(path)
    return tok


def build_tiny_bytes(path, tiny: dict):
    """A tiny random Llama over byte_tokenizer's 259 ids, saved with it to path; returns the model."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    tok = byte_tokenizer(path)
    cfg = transformers.LlamaConfig(vocab_size=len(tok), **tiny)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=REFERENCE_ATTENTION).eval()
    model.save_pretrained(path, safe_serialization=True)
    return model


# hybrid families (Qwen3-Next, Qwen3.5 text): Gated DeltaNet layers with 2 key / 4 value heads, full attention
HYBRID_TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   bos_token_id=1, eos_token_id=2, initializer_range=0.3, max_position_embeddings=512,
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
                   linear_conv_kernel_dim=4)
HYBRID_CASES = {
    # layer 0 dense (mlp_only_layers), the others MoE with the gated shared expert; layer 3 full attention
    "qwen3_next": ("Qwen3NextConfig", {"intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 4,
                                       "num_experts_per_tok": 2, "shared_expert_intermediate_size": 48,
                                       "mlp_only_layers": [0]}),
    "qwen3_5": ("Qwen3_5TextConfig", {"intermediate_size": 96, "layer_types": [
        "linear_attention", "full_attention", "linear_attention", "full_attention"]}),
}

# Granite 4.0-H (Mamba2 hybrid): Mamba2 layers of 8 heads x 16 (2 groups of B / C, chunks of 16 tokens), one
# attention layer; Granite's multipliers away from 1
GRANITE_TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                    bos_token_id=1, eos_token_id=2, initializer_range=0.3, max_position_embeddings=512,
                    mamba_n_heads=8, mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=16,
                    layer_types=["mamba", "attention", "mamba", "mamba"], embedding_multiplier=2.0,
                    residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=3.0, intermediate_size=32,
                    shared_intermediate_size=48)
GRANITE_CASES = {
    # MoE (4 experts, top 2) beside the shared MLP; attention without positions
    "granite_moe_nope": ("GraniteMoeHybridConfig", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                                    "position_embedding_type": "nope"}),
    # the shared MLP alone; rope; biases on the attention and Mamba2 projections, none on the convolution; one
    # group of B / C; tied embeddings
    "granite_dense_rope": ("GraniteMoeHybridConfig", {"num_local_experts": 0, "position_embedding_type": "rope",
                                                      "attention_bias": True, "mamba_proj_bias": True,
                                                      "mamba_conv_bias": False, "mamba_n_groups": 1,
                                                      "tie_word_embeddings": True,
                                                      "layer_types": ["attention", "mamba", "mamba", "attention"]}),
}

# Nemotron-H (Mamba2 hybrid of single-mixer blocks): Mamba2, attention, relu^2 MLP and MoE blocks
NEMOTRON_TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, bos_token_id=1,
                     eos_token_id=2, initializer_range=0.3, max_position_embeddings=512, mamba_num_heads=8,
                     mamba_head_dim=16, ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=16,
                     intermediate_size=48, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                     moe_shared_expert_intermediate_size=24, n_group=2, topk_group=1, routed_scaling_factor=2.5)
NEMOTRON_CASES = {
    "nemotron_h": ("NemotronHConfig", {"layers_block_type": [
        "linear_attention", "full_attention", "mlp", "linear_attention", "moe"]}),
    # the MoE through latent projections; biases on the MLPs and the Mamba2 projections; one group of B / C
    "nemotron_h_latent": ("NemotronHConfig", {"layers_block_type": ["linear_attention", "moe", "full_attention", "mlp"],
                                             "moe_latent_size": 40, "mlp_bias": True, "use_bias": True, "n_groups": 1}),
}
