"""Tiny GGUF files for the converter's tests, written with gguf.GGUFWriter from a tiny transformers model the way
llama.cpp's convert_hf_to_gguf.py lays them out: its tensor names, llama's (and smollm3's) q / k rows permuted, MoE
experts stacked per layer ([E, I, hidden]), Phi-3's fused qkv / gate_up kept, Gemma's norms stored as 1 + w under its
pre / post norm names, and each weight in a chosen block type."""

from __future__ import annotations

from typing import Optional

import numpy as np

_LAYER = {  # HF suffix -> GGUF suffix (the names llama.cpp writes)
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.experts.down_proj": "ffn_down_exps.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
_GEMMA_LAYER = {"post_attention_layernorm.weight": "post_attention_norm.weight",
                "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
GEMMA = ("gemma2", "gemma3")
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}


K_BLOCKS = {"Q4_K": (144, {0: 0.01, 2: 0.005}), "Q5_K": (176, {0: 0.01, 2: 0.005}),
            "Q6_K": (210, {208: 0.001})}  # K-quants: block bytes, f16 scale fields (byte offset: value)


def k_quant_blocks(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random blocks of `kind` ([rows, cols / 256 * block bytes] uint8) with finite f16 scales (gguf.quants
    cannot quantize to K-quants)."""
    size, fields = K_BLOCKS[kind]
    b = np.random.default_rng(seed).integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    for off, v in fields.items():
        b[:, :, off:off + 2] = np.frombuffer(np.float16(v).tobytes(), np.uint8)
    return b.reshape(rows, -1)


def permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's permutation of Llama's q / k rows (interleaved rotary pairs)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(state: dict, arch: str, heads: int, kv_heads: int) -> dict[str, np.ndarray]:
    """HF float32 tensors -> GGUF-named numpy arrays."""
    out = {}
    names = {**_LAYER, **(_GEMMA_LAYER if arch in GEMMA else {})}
    for name, t in state.items():
        w = t.float().numpy()
        if arch in GEMMA and name.endswith("norm.weight"):
            w = w + np.float32(1.0)  # llama.cpp's Gemma converters store the norm's 1 + w
        if name in _GLOBAL:
            out[_GLOBAL[name]] = w
            continue
        layer, rest = name.split(".", 3)[2], name.split(".", 3)[3]
        if rest == "mlp.experts.gate_up_proj":  # [E, 2I, hidden]: gate rows first
            inter = w.shape[1] // 2
            out[f"blk.{layer}.ffn_gate_exps.weight"] = w[:, :inter]
            out[f"blk.{layer}.ffn_up_exps.weight"] = w[:, inter:]
            continue
        if rest == "mlp.shared_expert_gate.weight":
            w = w.reshape(-1)  # llama.cpp stores it as [hidden]
        if arch in ("llama", "smollm3") and rest == "self_attn.q_proj.weight":  # SmolLM3Model is a LlamaModel
            w = permute(w, heads)
        elif arch in ("llama", "smollm3") and rest == "self_attn.k_proj.weight":
            w = permute(w, kv_heads)
        out[f"blk.{layer}.{names[rest]}"] = w
    return out


def write_gguf(path: str, arch: str, cfg, state: dict, kinds: Optional[dict] = None,
               rope_tensors: Optional[dict] = None, extra: Optional[dict] = None) -> dict[str, np.ndarray]:
    """Writes `state` (an HF state dict of float32 tensors) as a GGUF of `arch` with cfg's (a transformers
    config's) hyperparameters; kinds: GGUF name -> (block type, its bytes [rows, row bytes] uint8 or None to
    quantize with gguf.quants.quantize); every other tensor is F32. Returns the GGUF tensors written."""
    import gguf
    from gguf import GGMLQuantizationType as T

    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    tensors = gguf_tensors(state, arch, heads, kv)
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)  # Gemma 3: per layer type
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_vocab_size(cfg.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for key, value in (extra or {}).items():
        getattr(w, f"add_{key}")(value)
    for name, arr in (rope_tensors or {}).items():
        w.add_tensor(name, np.asarray(arr, dtype=np.float32))
    for name, arr in tensors.items():
        kind, blocks = (kinds or {}).get(name, ("F32", None))
        if kind == "F32":
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
            continue
        qtype = T[kind]
        data = blocks if blocks is not None else gguf.quants.quantize(np.ascontiguousarray(arr, np.float32), qtype)
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def blocks_like(kind: str, w: np.ndarray, seed: int = 0) -> Optional[np.ndarray]:
    """Blocks of `kind` for the float32 weight w [rows, cols]: None where gguf.quants.quantize writes the type
    (write_gguf quantizes w then), else random blocks of about w's spread (gguf.quants cannot quantize the
    K-quants and IQ4 types: their values are what the file holds, and what every reader dequantizes)."""
    from radixlang_kernels.testing import random_gguf_blocks

    if kind in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        return None
    return random_gguf_blocks(kind, w.shape[0], w.shape[1], float(w.std()), np.random.default_rng(seed))


def convert_tiny(path: str, out_dir: str, tokenizer_dir: str) -> dict:
    """gguf_convert's config and tensors for `path`, written as an HF directory with the tokenizer beside
    (the tiny files carry no tokenizer) and the source file the blocks are read from; returns the tensors."""
    import json
    import os
    import shutil

    import gguf
    from safetensors.numpy import save_file

    from radixlang_runtime.model.loader.gguf_convert import SOURCE_FILE, gguf_state_dict, gguf_to_hf_config

    reader = gguf.GGUFReader(path)
    config = gguf_to_hf_config(reader)
    state = gguf_state_dict(reader, config)
    os.makedirs(out_dir)
    save_file(state, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), out_dir)
    with open(os.path.join(out_dir, SOURCE_FILE), "w") as f:  # --quantization gguf reads the blocks there
        json.dump({"gguf": os.path.abspath(path)}, f)
    return state
