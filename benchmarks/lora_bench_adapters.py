"""Random peft LoRA adapters for a checkpoint (bench_offline.py --lora): rank 16 on every projection
(q, k, v, o, gate, up, down), B non-zero, saved as adapter directories `<dir>/lora<i>`."""

from __future__ import annotations

import os

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_adapters(model_dir: str, out_dir: str, count: int, rank: int = 16) -> list[str]:
    """`name=path` entries for --lora-paths (made once; an existing directory is reused)."""
    paths = [os.path.join(out_dir, f"lora{i}") for i in range(count)]
    if all(os.path.isfile(os.path.join(p, "adapter_model.safetensors")) for p in paths):
        return [f"lora{i}={p}" for i, p in enumerate(paths)]
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    for i, path in enumerate(paths):
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS))
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.01)
        model.save_pretrained(path)
    return [f"lora{i}={p}" for i, p in enumerate(paths)]
