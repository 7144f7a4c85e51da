"""The building blocks models are made of: attention backends, rotary embeddings, MoE, and the linear layers (packed,
int8, GGUF blocks, LoRA)."""
