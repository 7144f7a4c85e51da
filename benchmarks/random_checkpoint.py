"""Random checkpoints of realistic shape for the benchmarks: transformers builds the model from a config (seeded
random weights), saves it with the embedded tokenizer beside it. The figures measure the families' code paths,
not a trained model's outputs (greedy on random weights; EOS ignored by the workloads).

    python benchmarks/random_checkpoint.py moe /tmp/rand-moe        # then bench_offline.py --model-path /tmp/rand-moe
    python benchmarks/bench_offline.py --random-model gemma2 ...     # built (once) under --random-dir
"""

from __future__ import annotations

import argparse
import os

# name -> (transformers config class, its fields); vocabulary: the embedded tokenizer's (49,152)
SHAPES = {
    # Mixtral-style sparse MoE: 8 experts, top-2, hidden 1024, 8 layers, GQA 16 / 4 heads
    "moe": ("MixtralConfig", dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=8,
                                  num_attention_heads=16, num_key_value_heads=4, num_local_experts=8,
                                  num_experts_per_tok=2, max_position_embeddings=4096, sliding_window=None,
                                  tie_word_embeddings=False)),
    # a small Llama (the transformers fallback's cost against native: docs/PERFORMANCE.md)
    "llama": ("LlamaConfig", dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096,
                                  tie_word_embeddings=False)),
    # Gemma 2's layout (head_dim 256, pre + post norms, GeGLU, soft-caps, alternating 4,096-token windows)
    # at 1024 hidden, 8 layers
    "gemma2": ("Gemma2Config", dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=8,
                                    num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                    query_pre_attn_scalar=256, sliding_window=4096, max_position_embeddings=8192,
                                    tie_word_embeddings=True)),
    # DeepSeek V3's layout (multi-head latent attention, sigmoid-routed experts + a shared one) at 1024 hidden,
    # 4 layers, 16 heads: latent 256 + roped key 32 per token and layer (bench_mla.py)
    "deepseek": ("DeepseekV3Config", dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=4,
                                          num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None,
                                          kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32,
                                          v_head_dim=64, n_routed_experts=8, num_experts_per_tok=2,
                                          moe_intermediate_size=512, n_shared_experts=1, n_group=1, topk_group=1,
                                          first_k_dense_replace=1, max_position_embeddings=4096,
                                          tie_word_embeddings=False)),
    # the same with a multi-token-prediction layer (model.layers.4: a copy of layer 3's block, random projections;
    # speculative NEXTN's draft: bench_nextn.py)
    "deepseek_mtp": ("DeepseekV3Config", dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=4,
                                              num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None,
                                              kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32,
                                              v_head_dim=64, n_routed_experts=8, num_experts_per_tok=2,
                                              moe_intermediate_size=512, n_shared_experts=1, n_group=1,
                                              topk_group=1, first_k_dense_replace=1, max_position_embeddings=4096,
                                              tie_word_embeddings=False, num_nextn_predict_layers=1)),
    # Qwen3.5's hybrid layout at the small Llama's size: 6 Gated DeltaNet layers + 2 gated full-attention layers
    # (every 4th), linear heads 4 key / 8 value of 64 (docs/HYBRID_MODELS.md)
    "qwen3_5": ("Qwen3_5TextConfig", dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                                          num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                                          linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
                                          linear_value_head_dim=64, max_position_embeddings=4096,
                                          tie_word_embeddings=False)),
}


def build(name: str, out_dir: str) -> str:
    """Write the `name` checkpoint (bfloat16 safetensors + tokenizer) to out_dir unless it is there; returns it."""
    if os.path.isfile(os.path.join(out_dir, "config.json")):
        return out_dir
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    if name not in SHAPES:
        raise ValueError(f"random model {name!r}: choose one of {', '.join(SHAPES)}")
    cls_name, fields = SHAPES[name]
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    cfg = getattr(transformers, cls_name)(vocab_size=len(tok), bos_token_id=1, eos_token_id=2, pad_token_id=2,
                                          **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    tmp = out_dir.rstrip("/") + ".tmp"
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if fields.get("num_nextn_predict_layers"):
        add_prediction_layer(tmp, fields["num_hidden_layers"], fields["hidden_size"])
    os.rename(tmp, out_dir)
    return out_dir


def build_llava(out_dir: str) -> str:
    """A LLaVA-1.5-shaped checkpoint (a CLIP ViT-L/14 tower at 336 pixels: 576 positions an image, beside a
    SmolLM2-135M-shaped text model; the embedded tokenizer with an <image> token; CLIP's image processor), bfloat16,
    written to out_dir unless it is there (bench_images.py); returns it."""
    if os.path.isfile(os.path.join(out_dir, "config.json")):
        return out_dir
    import torch
    import transformers
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    text = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=576, intermediate_size=1536,
                                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                    max_position_embeddings=2048, tie_word_embeddings=True)
    vision = transformers.CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                           num_attention_heads=16, image_size=336, patch_size=14, projection_dim=768)
    cfg = transformers.LlavaConfig(text_config=text, vision_config=vision,
                                   image_token_index=tok.convert_tokens_to_ids("<image>"), tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(cfg).to(torch.bfloat16)
    tmp = out_dir.rstrip("/") + ".tmp"
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    transformers.CLIPImageProcessor(size={"shortest_edge": 336},
                                    crop_size={"height": 336, "width": 336}).save_pretrained(tmp)
    os.rename(tmp, out_dir)
    return out_dir


def add_prediction_layer(path: str, n: int, hidden: int) -> None:
    """model.layers.{n}: layer n - 1's block, enorm / hnorm / shared_head.norm at 1, a random eh_proj, the head and
    the embedding as the decoder's (DeepSeek V3's names; models/nextn.py)."""
    import glob

    import torch
    from safetensors.torch import load_file, save_file

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if len(files) != 1:
        raise ValueError(f"{path}: expected one safetensors file, found {len(files)}")
    t = load_file(files[0])
    own, last = f"model.layers.{n}.", f"model.layers.{n - 1}."
    t.update({own + k[len(last):]: v.clone() for k, v in t.items() if k.startswith(last)})
    ones = torch.ones(hidden, dtype=torch.bfloat16)
    t.update({own + "enorm.weight": ones, own + "hnorm.weight": ones.clone(), own + "shared_head.norm.weight":
              ones.clone(), own + "eh_proj.weight": (torch.randn(hidden, 2 * hidden) * 0.02).to(torch.bfloat16),
              own + "shared_head.head.weight": t["lm_head.weight"].clone(),
              own + "embed_tokens.weight": t["model.embed_tokens.weight"].clone()})
    save_file(t, files[0], metadata={"format": "pt"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", choices=sorted(SHAPES))
    ap.add_argument("out_dir")
    a = ap.parse_args()
    print(build(a.name, a.out_dir))


if __name__ == "__main__":
    main()
