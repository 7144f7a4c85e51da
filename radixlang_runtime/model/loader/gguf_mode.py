"""Which weights a model runs: `--quantization` as given, or, left unset for a `.gguf` --model-path, the file's
own blocks (`gguf`, model/layers/gguf_block_linear.py) where they are served: a CPU, the native Llama-family
implementation (MoE blocks and transformers' modules refuse blocks), one rank, no --is-embedding and no
deterministic mode. `--quantization none` keeps the dequantized float weights (a .gguf's every tensor
dequantized at load). The embedded default model (no --model-path) keeps its dequantized weights."""

from __future__ import annotations

import os
from typing import Any, Optional


def resolve_quantization(args: Any, model_dir: str, model_cls: Any, device_type: str) -> Optional[str]:
    """None (float weights), "int8" or "gguf" for this runner's model (of class model_cls: the family's)."""
    from radixlang_runtime.model.loader.gguf_convert import gguf_source
    from radixlang_runtime.model.models.llama import LlamaForCausalLM

    if args.quantization == "none":
        return None
    if args.quantization is not None:
        return args.quantization
    path = args.model_path
    if not path or not path.endswith(".gguf") or gguf_source(model_dir) != os.path.abspath(path):
        return None  # a directory, the embedded model, or a draft model beside a .gguf target
    served = (device_type == "cpu" and args.tp_size == 1 and not args.is_embedding
              and not args.enable_deterministic_inference
              and getattr(model_cls, "use_gguf_blocks", None) is LlamaForCausalLM.use_gguf_blocks)
    return "gguf" if served else None


def gguf_file_blocks(model_dir: str, tensor_parallel: bool) -> dict:
    """--quantization gguf: the blocks (every quant_ops.GGUF_TYPES type) of the .gguf the model was converted
    from (the embedded one when no --model-path; a directory this runtime converted knows its source)."""
    import json

    from radixlang_kernels import quant_ops
    from radixlang_runtime.model.loader.gguf_convert import gguf_blocks, gguf_source

    path = gguf_source(model_dir)
    if path is None:
        raise ValueError(f"--quantization gguf runs on a .gguf file's blocks; model {model_dir!r} was "
                         "not converted from one")
    if tensor_parallel:
        raise ValueError("--quantization gguf is not implemented with tensor parallelism (use tp_size 1)")
    with open(os.path.join(model_dir, "config.json")) as f:
        return gguf_blocks(path, json.load(f), tuple(quant_ops.GGUF_TYPES))
