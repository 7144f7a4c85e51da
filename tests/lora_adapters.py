"""A tiny random Llama with two peft LoRA adapters (ranks 8 and 16 on every projection, large random B) and the
references: transformers + peft with each adapter merged (merge_and_unload), float32 greedy."""

from __future__ import annotations

import copy

from tiny_checkpoints import build_tiny, hf_greedy

PROMPT = list(range(300, 316))
OTHER = [5, 77, 1200, 9, 4000, 31, 8, 640]
NEW = 12
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3, max_position_embeddings=256)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {"alpha": (8, 16, 1), "beta": (16, 8, 2)}  # name -> (rank, lora_alpha, seed)
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}


def make_adapter(base, path, rank: int, alpha: int, seed: int):
    """A peft adapter on a copy of base with random, large B (peft starts B at zero), saved to path;
    returns the merged reference model."""
    import torch
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=rank, lora_alpha=alpha, target_modules=ALL,
                                                           lora_dropout=0.0))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    model.save_pretrained(path)
    return model.merge_and_unload().eval()


def build_base_and_adapters(root, prompts=(PROMPT, OTHER)):
    """root/base and root/<name> per adapter; returns {adapter name ("" the base): {prompt: greedy ids}}."""
    base = build_tiny(root / "base", "LlamaConfig", TINY, {})
    refs = {"": base}
    for name, (rank, alpha, seed) in ADAPTERS.items():
        refs[name] = make_adapter(base, str(root / name), rank, alpha, seed)
    want = {name: {tuple(p): hf_greedy(m, p, NEW) for p in prompts} for name, m in refs.items()}
    return want


def record_steps(eng):
    """The lora_ids of every step the runner takes from now on."""
    seen, runner, orig = [], eng.runner, eng.runner._run

    def run(step, *rest):
        seen.append(list(step.lora_ids))
        return orig(step, *rest)

    runner._run = run
    return seen
