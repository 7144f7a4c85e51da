"""Loading a model's tokenizer in each server process.

transformers' `AutoTokenizer` picks the tokenizer's class from the model's files, and to do so imports its whole
auto machinery (every model family's import table, the config classes, torch) in each process
that calls it. The scheduler resolves the class once (`load_tokenizer(path)`); the HTTP process and the
detokenizer receive its `class_ref` and call that class's `from_pretrained` with the same path, which is what
`AutoTokenizer.from_pretrained` itself ends in. A class from a checkpoint's own code (trust_remote_code) has no
importable name outside transformers' dynamic-module cache: those processes go through `AutoTokenizer` too.

The scheduler remembers the class it resolved (`load_remembered`): a small record under the cache root, keyed by
the tokenizer directory's path, the names, sizes and modification times of its files and transformers' version,
so the next start of the same files loads the class directly (docs/PERFORMANCE.md). Any change to those files or to
transformers is a new key; a record that cannot be read or used falls back to AutoTokenizer.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import tempfile
from typing import Any, Optional

logger = logging.getLogger(__name__)


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


def _record_path(path: str, cache_dir: str) -> Optional[str]:
    """Where the class of the tokenizer at `path` is remembered (None: not a directory that can be keyed)."""
    import transformers

    try:
        real = os.path.realpath(path)
        files = sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(real) if e.is_file())
    except OSError:
        return None
    key = hashlib.sha256(json.dumps([real, transformers.__version__, files]).encode()).hexdigest()[:32]
    return os.path.join(cache_dir, "tokenizer_classes", key + ".json")


def load_remembered(path: str, cache_dir: str) -> Any:
    """The tokenizer at `path`, through the class an earlier load of the same files resolved when one is
    remembered under `cache_dir`, else through AutoTokenizer (then its class is remembered)."""
    record = _record_path(path, cache_dir)
    if record is not None and os.path.isfile(record):
        try:
            with open(record) as f:
                return load_tokenizer(path, json.load(f)["class"])
        except Exception as e:  # noqa: BLE001 - a stale or damaged record: resolve it again
            logger.warning("the remembered tokenizer class in %s did not load (%s); resolving it again", record, e)
    tokenizer = load_tokenizer(path)
    ref = class_ref(tokenizer)
    if record is not None and ref is not None:
        try:
            os.makedirs(os.path.dirname(record), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(record), suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump({"class": ref, "path": os.path.realpath(path)}, f)
            os.replace(tmp, record)
        except OSError as e:  # a read-only cache: every start resolves it
            logger.debug("tokenizer class not remembered (%s)", e)
    return tokenizer
