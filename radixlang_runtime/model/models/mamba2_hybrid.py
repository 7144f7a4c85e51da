"""What a Mamba2 hybrid family's model (Granite 4.0-H, Nemotron-H) adds to the Llama decoder it builds on: the
Mamba2 decode step in C where the CPU kernels are on (mamba2.c), and what its Mamba2 layers cannot run refused by
name (batch-invariant kernels, a GGUF file's blocks kept as they are)."""

from __future__ import annotations

from radixlang_runtime.model.layers.mamba2 import Mamba2Mixer


class Mamba2Hybrid:
    """A mixin before the Llama decoder class in a Mamba2 hybrid family's bases."""

    def enable_cpu_ops(self) -> None:
        """The CPU C kernels: the norms and activations (LlamaForCausalLM's), and Mamba2's decode (mamba2.c)."""
        super().enable_cpu_ops()
        for m in self.modules():
            if isinstance(m, Mamba2Mixer):
                m.use_cpu_kernel = True

    def enable_deterministic(self) -> None:
        raise ValueError(f"{self.cfg.architecture}'s Mamba2 layers have no batch-invariant kernels")

    def use_gguf_blocks(self, blocks: dict) -> int:
        raise ValueError(f"--quantization gguf is not supported for {self.cfg.architecture} (hybrid Mamba2)")
