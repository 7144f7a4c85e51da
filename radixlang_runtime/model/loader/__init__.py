"""Reading checkpoints: --model-path resolution, config parsing, safetensors, GGUF conversion, LoRA adapter
directories."""
