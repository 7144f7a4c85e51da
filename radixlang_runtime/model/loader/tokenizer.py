"""Loading a model's tokenizer in each server process.

transformers' `AutoTokenizer` picks the tokenizer's class from the model's files, and to do so imports its whole
auto machinery (every model family's import table, the config classes, torch): 2-3 s of CPU in each process
that calls it. The scheduler resolves the class once (`load_tokenizer(path)`); the HTTP process and the
detokenizer receive its `class_ref` and call that class's `from_pretrained` with the same path, which is what
`AutoTokenizer.from_pretrained` itself ends in. A class from a checkpoint's own code (trust_remote_code) has no
importable name outside transformers' dynamic-module cache: those processes go through `AutoTokenizer` too.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional


def class_ref(tokenizer: Any) -> Optional[str]:
    """"module:qualname" of a tokenizer's class when transformers itself defines it, else None."""
    cls = type(tokenizer)
    if not cls.__module__.startswith("transformers.") or "<" in cls.__qualname__:
        return None
    return f"{cls.__module__}:{cls.__qualname__}"


def preload() -> None:
    """Imports the fast tokenizers' common base (what load_tokenizer with a class name mostly spends), so a
    process can do it while it waits for the model directory."""
    import transformers.tokenization_utils_tokenizers  # noqa: F401


def load_tokenizer(path: str, ref: Optional[str] = None) -> Any:
    """The tokenizer at `path`: through the class `ref` names (class_ref of the same path's tokenizer), else
    through AutoTokenizer."""
    if ref is not None:
        module, _, name = ref.partition(":")
        if not module.startswith("transformers.") or not name:
            raise ValueError(f"not a transformers tokenizer class: {ref!r}")
        cls: Any = importlib.import_module(module)
        for part in name.split("."):
            cls = getattr(cls, part)
        return cls.from_pretrained(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
