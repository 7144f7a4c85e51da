"""GGUF -> HF directory (config.json + model.safetensors + tokenizer files).

The `gguf` package reads and dequantizes the tensors (BLOCK_TYPES: F32 / F16 / BF16, Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4; others refused by name) to float32; the runtime then
serves a .gguf on its blocks by default (gguf_blocks below, model/layers/gguf_block_linear.py). Architectures:
gguf_families.ARCHS (what each adds to the llama mapping below is there). llama.cpp's converter permutes
the rows of Llama's (and SmolLM3's: its LlamaModel subclass) q/k projections (interleaved rotary pairs); we
undo that so the weights are the HF layout our model (and transformers) expects. The result is written atomically into
a cache directory keyed by the GGUF file's identity, so the second start skips all of this.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile

import numpy as np

from radixlang_runtime.model.loader.gguf_family import per_layer_count, unread_block
from radixlang_runtime.model.loader.gguf_families import (ARCHS, FAMILIES, HF_MODEL_TYPES, NORM_PLUS_ONE, PERMUTED_QK,
                                                          ROPE_TENSORS, family_config, join_experts, layer_names,
                                                          refuse_unknown_keys, tensor_rope)

# the block types gguf.quants.dequantize reads that tests/test_gguf_quants.py checks (one-line additions); the
# quantized ones but MXFP4 (gpt-oss's experts, dequantized at load) are those the kernels run on their blocks
# (radixlang_kernels.quant_ops.GGUF_TYPES)
BLOCK_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
               "IQ4_NL", "IQ4_XS", "MXFP4")

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    names = {**_LAYER_NAMES, **layer_names(arch)}
    if not m or m.group(2) not in names:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
    return f"model.layers.{m.group(1)}.{names[m.group(2)]}"


def dequantize_tensor(t) -> np.ndarray:
    """One GGUF tensor as float32 (numpy shape: ggml's dimensions reversed); a block type outside BLOCK_TYPES
    is refused by name."""
    from gguf.quants import dequantize

    kind = t.tensor_type.name
    if kind not in BLOCK_TYPES:
        raise ValueError(f"GGUF tensor {t.name!r} is stored as {kind}: supported block types are "
                         f"{', '.join(BLOCK_TYPES)}")
    return np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)


def unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: per head, rows (pair, half) -> (half, pair).

    w: [n_heads * head_dim, ...] -> same shape, rows in HF (rotate_half) order.
    """
    head_dim = w.shape[0] // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


_ROPE_SCALING_KEYS = ("type", "factor", "original_context_length", "finetuned")  # finetuned: informational


def gguf_rope_fields(reader, arch: str, head_dim: int) -> dict:
    """llama.cpp's rope keys -> config.json's rope fields (rope_scaling, partial_rotary_factor); what has no
    mapping is refused by name (ModelConfig then refuses what the model does not honour)."""
    a = lambda k, d=None: _field(reader, f"{arch}.{k}", d)  # noqa: E731
    from_tensors = tensor_rope(reader, arch, a, head_dim)  # llama3 (rope_freqs) / longrope (rope_factors_*)
    known = _ROPE_SCALING_KEYS + (("attn_factor",) if from_tensors else ())
    known += FAMILIES[arch].rope_scaling_keys if arch in FAMILIES else ()
    prefix = f"{arch}.rope.scaling."
    extra = sorted(k for k in reader.fields if k.startswith(prefix) and k[len(prefix):] not in known)
    if extra:
        raise ValueError(f"GGUF key {extra[0]!r} is not supported")
    out: dict = {}
    dims = a("rope.dimension_count")
    if dims is not None and int(dims) != head_dim:
        out["partial_rotary_factor"] = int(dims) / head_dim
    if from_tensors is not None:
        if from_tensors["rope_type"] == "longrope":  # Phi3Config reads the top-level one (it wins)
            out["original_max_position_embeddings"] = from_tensors["original_max_position_embeddings"]
        out["rope_scaling"] = from_tensors
        return out
    kind = a("rope.scaling.type", "none")
    if kind == "none":
        return out
    if kind not in ("linear", "yarn"):
        raise ValueError(f"GGUF {arch}.rope.scaling.type {kind!r} is not supported (supported: linear, yarn)")
    scaling = {"rope_type": kind, "factor": float(a("rope.scaling.factor", 1.0))}
    if kind == "yarn":
        scaling["original_max_position_embeddings"] = int(a("rope.scaling.original_context_length",
                                                             a("context_length", 4096)))
    out["rope_scaling"] = scaling
    return out


def gguf_to_hf_config(reader) -> dict:
    arch = _field(reader, "general.architecture")
    if arch not in ARCHS:
        raise ValueError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHS)})")
    refuse_unknown_keys(reader.fields, arch)
    a = lambda k, d=None: _field(reader, f"{arch}.{k}", d)  # noqa: E731
    names = {t.name for t in reader.tensors}
    heads = int(a("attention.head_count"))
    hidden = int(a("embedding_length"))
    vocab = int(a("vocab_size", len(_field(reader, "tokenizer.ggml.tokens", []))))
    head_dim = int(a("attention.key_length", hidden // heads))
    layers = int(a("block_count"))
    family = FAMILIES.get(arch)
    return family_config(arch, a, names, {
        "architectures": [ARCHS[arch]],
        "model_type": HF_MODEL_TYPES.get(arch, arch),
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": per_layer_count("feed_forward_length", a("feed_forward_length"),
                                             a("expert_feed_forward_length"), arch, family),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": per_layer_count("attention.head_count_kv", a("attention.head_count_kv"), heads, arch,
                                               family),
        "head_dim": head_dim,
        "rms_norm_eps": float(a("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(a("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(a("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "hidden_act": "silu",
        "torch_dtype": "float32",
        **gguf_rope_fields(reader, arch, head_dim),
    })


def gguf_state_dict(reader, config: dict) -> dict[str, np.ndarray]:
    """Dequantized float32 tensors under HF names."""
    arch = _field(reader, "general.architecture")
    permute_qk = config["model_type"] in PERMUTED_QK
    out = {}
    for t in reader.tensors:
        if t.name in ROPE_TENSORS or unread_block(FAMILIES.get(arch), t.name, config):  # rope: config.json's
            continue
        w = dequantize_tensor(t)
        name = t.name
        if permute_qk and name.endswith("attn_q.weight"):
            w = unpermute_rotary_rows(w, config["num_attention_heads"])
        elif permute_qk and name.endswith("attn_k.weight"):
            w = unpermute_rotary_rows(w, config["num_key_value_heads"])
        elif arch in NORM_PLUS_ONE and name.endswith("norm.weight"):
            w = w - np.float32(1.0)  # llama.cpp stored 1 + w (Gemma's norm multiplies by 1 + w)
        out[hf_tensor_name(name, arch)] = w
    join_experts(out)
    if arch in FAMILIES and FAMILIES[arch].tensors is not None:
        FAMILIES[arch].tensors(out, config)
    return out


def gguf_blocks(gguf_path: str, config: dict,
                formats: tuple[str, ...] = ("Q4_1", "Q8_0")) -> dict[str, tuple[np.ndarray, str]]:
    """The file's quantized tensors in `formats`, as they are: HF name -> (blocks [rows, row bytes]
    uint8, format). q / k rows are unpermuted like gguf_state_dict's (rows are independent: a row's
    blocks run along the input dimension), so block row n dequantizes to row n of the converted weight."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    arch = _field(reader, "general.architecture")
    permute_qk = config["model_type"] in PERMUTED_QK
    out = {}
    for t in reader.tensors:
        fmt = t.tensor_type.name
        if fmt not in formats or t.name in ROPE_TENSORS or unread_block(FAMILIES.get(arch), t.name, config):
            continue
        rows = np.asarray(t.data)  # [rows, row bytes] uint8, a view of the mapped file
        name = t.name
        if permute_qk and name.endswith("attn_q.weight"):
            rows = unpermute_rotary_rows(rows, config["num_attention_heads"])
        elif permute_qk and name.endswith("attn_k.weight"):
            rows = unpermute_rotary_rows(rows, config["num_key_value_heads"])
        out[hf_tensor_name(name, arch)] = (np.array(rows, copy=True, order="C"), fmt)  # writable, off the mapping
    return out


SOURCE_FILE = "gguf_source.json"  # in a converted directory: the .gguf it was converted from


def gguf_source(model_dir: str) -> str | None:
    """The .gguf a converted directory came from (None: not a conversion, or the file is gone).
    Conversions written before the source file existed are recognised by their cache key when they
    are the embedded model's."""
    from radixlang_runtime.model.loader.resolve import embedded_gguf_path

    src = os.path.join(model_dir, SOURCE_FILE)
    if os.path.isfile(src):
        with open(src) as f:
            path = json.load(f).get("gguf")
        return path if path and os.path.isfile(path) else None
    try:
        embedded = embedded_gguf_path()
    except FileNotFoundError:
        return None
    return embedded if os.path.basename(os.path.normpath(model_dir)) == cache_key(embedded) else None


def cache_key(gguf_path: str) -> str:
    st = os.stat(gguf_path)
    ident = f"{os.path.abspath(gguf_path)}:{st.st_size}:{int(st.st_mtime)}:v1"
    stem = os.path.splitext(os.path.basename(gguf_path))[0]
    return f"{stem}-{hashlib.sha1(ident.encode()).hexdigest()[:12]}"


def convert_gguf(gguf_path: str, out_dir: str) -> str:
    """Write an HF directory for `gguf_path` into `out_dir` (atomically). Returns out_dir."""
    import gguf
    from safetensors.numpy import save_file
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    reader = gguf.GGUFReader(gguf_path)
    config = gguf_to_hf_config(reader)
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".convert-", dir=parent)
    try:
        save_file(gguf_state_dict(reader, config), os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        with open(os.path.join(tmp, SOURCE_FILE), "w") as f:  # --quantization gguf finds the blocks here
            json.dump({"gguf": os.path.abspath(gguf_path)}, f)
        # transformers builds a fast tokenizer (vocab, merges, special tokens, chat template) from
        # the GGUF metadata; we keep its files so later starts need no GGUF parsing at all.
        # (AutoTokenizer reads the file's config too, which it refuses for the architectures in FAMILIES: their
        # tokenizer is built from the same tokenizer.ggml.* keys by the fast tokenizer itself)
        tok_cls = PreTrainedTokenizerFast if _field(reader, "general.architecture") in FAMILIES else AutoTokenizer
        tok = tok_cls.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, out_dir)
        except OSError:  # another process won the race: keep theirs
            if not os.path.exists(os.path.join(out_dir, "config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
