"""llama.cpp's own converter against the GGUF loader: a tiny random transformers checkpoint per natively served
architecture (deepseek2 as V3 and as V2-Lite, glm4moe, gpt-oss, granitehybrid, llama4, nemotron_h_moe, qwen3next)
converted by llama.cpp's
convert_hf_to_gguf.py (--outtype f32), served by the Engine from the .gguf path (the whole path: config,
tensors and tokenizer read from the file, float32), greedy tokens compared token for token with transformers
on the checkpoint.

    python benchmarks/check_gguf_converter.py LLAMA_CPP_DIR [--cases deepseek_v3,glm4moe,...]

LLAMA_CPP_DIR holds convert_hf_to_gguf.py and gguf-py (a llama.cpp checkout, or llama-cpp-python's sdist's
vendor/llama.cpp). The checkpoints carry the embedded model's tokenizer: GLM's vocabulary step (which needs
GLM's own special tokens) is replaced by the converter's GPT-2 one, nothing else of the converter is changed;
Qwen3-Next's with --no-mtp (its converter otherwise requires the prediction layers the tiny checkpoint lacks);
the Mamba2 hybrids' config.json names the layer types as their hub configs do (mamba / attention: the converter
reads those names, transformers 5 saves linear_attention / full_attention).
Not part of CI (tests/model/test_gguf_native_families.py writes the same layout with gguf-py in CI).
Exit status 1 when a case differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

TINY = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, bos_token_id=1,
            eos_token_id=2, tie_word_embeddings=False, initializer_range=0.3, max_position_embeddings=256)
CASES = {  # name -> (transformers config class, kwargs: what the hub configs of the family say)
    "deepseek_v3": ("DeepseekV3Config", dict(num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=32,
                                             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=8,
                                             n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                             n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                                             routed_scaling_factor=2.5, scoring_func="sigmoid",
                                             topk_method="noaux_tc")),
    "deepseek_v2_lite": ("DeepseekV2Config", dict(num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None,
                                                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=8,
                                                  n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                                  n_shared_experts=2, first_k_dense_replace=1,
                                                  routed_scaling_factor=1.0, topk_method="greedy")),
    "glm4moe": ("Glm4MoeConfig", dict(num_key_value_heads=2, head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
                                      n_group=2, topk_group=1, routed_scaling_factor=1.5, use_qk_norm=True,
                                      attention_bias=True, num_nextn_predict_layers=0)),
    "gpt_oss": ("GptOssConfig", dict(num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                     intermediate_size=32, sliding_window=8,
                                     layer_types=["sliding_attention", "full_attention"])),
    "llama4": ("Llama4TextConfig", dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                        num_experts_per_tok=1, intermediate_size=32, intermediate_size_mlp=96,
                                        interleave_moe_layer_step=2, attention_chunk_size=8192)),
    "qwen3next": ("Qwen3NextConfig", dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=16,
                                          linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                          linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=32, shared_expert_intermediate_size=32)),
    "granitehybrid": ("GraniteMoeHybridConfig", dict(num_hidden_layers=4, num_key_value_heads=2, mamba_n_heads=8,
                                                     mamba_d_state=16, mamba_n_groups=2, mamba_chunk_size=16,
                                                     layer_types=["mamba", "attention", "mamba", "mamba"],
                                                     embedding_multiplier=2.0, residual_multiplier=0.5,
                                                     attention_multiplier=0.2, logits_scaling=3.0,
                                                     intermediate_size=32, shared_intermediate_size=48,
                                                     num_local_experts=4, num_experts_per_tok=2,
                                                     position_embedding_type="nope")),
    "nemotron_h_moe": ("NemotronHConfig", dict(num_key_value_heads=2, head_dim=16, mamba_num_heads=8, mamba_head_dim=16,
                                               ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=16,
                                               n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                               moe_shared_expert_intermediate_size=24, n_group=2, topk_group=1,
                                               routed_scaling_factor=2.5, moe_latent_size=40,
                                               layers_block_type=["mamba", "moe", "attention", "moe"])),
}
NO_MTP = {"qwen3next": ["--no-mtp"]}
HUB_TYPES = {"linear_attention": "mamba", "full_attention": "attention"}  # the Mamba2 hybrids' hub names
PROMPTS = [list(range(300, 320)), [5, 77, 1200, 9, 4000, 31]]
NEW = 8
# runs the converter unchanged but for GLM's vocabulary step (the tiny checkpoints carry a GPT-2 style tokenizer)
_RUN = """import runpy, sys
sys.path[:0] = [{d!r}, {d!r} + '/gguf-py']
import conversion.glm as glm
glm.Glm4MoeModel.set_vocab = lambda self: self._set_vocab_gpt2()
sys.argv = ['convert_hf_to_gguf.py', {src!r}, '--outtype', 'f32', '--outfile', {out!r}] + {flags!r}
runpy.run_path({d!r} + '/convert_hf_to_gguf.py', run_name='__main__')
"""


def _tiny(path: str, cls_name: str, kwargs: dict):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    cfg = getattr(transformers, cls_name)(vocab_size=len(tok), **{**TINY, **kwargs})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():  # transformers zeroes the biases (routers, experts, correction bias): make them count
        for _, p in list(model.named_parameters()) + list(model.named_buffers()):
            if p.is_floating_point() and p.dim() > 0 and not p.any():
                p.normal_(0.0, 0.3)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    with open(os.path.join(path, "config.json")) as f:
        saved = json.load(f)
    for key in ("layer_types", "layers_block_type"):
        if cls_name in ("GraniteMoeHybridConfig", "NemotronHConfig") and key in saved:
            saved[key] = [HUB_TYPES.get(t, t) for t in saved[key]]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(saved, f)
    return model


def _greedy(model, ids: list[int]) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, eos_token_id=2,
                             pad_token_id=2)
    return out[0, len(ids):].tolist()


def check(llama_cpp: str, name: str, work: str) -> bool:
    from radixlang_runtime import Engine

    cls_name, kwargs = CASES[name]
    src, out = os.path.join(work, name), os.path.join(work, name + ".gguf")
    model = _tiny(src, cls_name, kwargs)
    subprocess.run([sys.executable, "-c", _RUN.format(d=os.path.abspath(llama_cpp), src=src, out=out,
                                                              flags=NO_MTP.get(name, []))], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    want = [_greedy(model, p) for p in PROMPTS]
    sp = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
    with Engine(out, dtype="float32", max_total_tokens=512, model_impl="native") as eng:
        got = [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=sp)]
    print(f"{name}: {'match' if got == want else 'DIFFER'} ({sum(len(w) for w in want)} tokens)")
    return got == want


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("llama_cpp")
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        os.environ.setdefault("RADIXLANG_CACHE_DIR", os.path.join(work, "cache"))
        ok = [check(args.llama_cpp, name, work) for name in args.cases.split(",")]
    sys.exit(0 if all(ok) else 1)


if __name__ == "__main__":
    main()
