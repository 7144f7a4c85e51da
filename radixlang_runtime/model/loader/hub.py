"""Hugging Face hub ids for `--model-path`: `org/name` (a HF model repo) or `org/name:TAG` (the .gguf file of
a GGUF repo whose name holds TAG, ollama style: `org/name-GGUF:Q4_K_M`), resolved from the local HF cache and
downloaded there when the network is allowed.

The cache is huggingface_hub's: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub (read at each
call, so a server started with them set honours them). HF_HUB_OFFLINE=1 never touches the network: a repo
not in the cache is an error naming the id, the cache and the command that fetches it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+)(?::(?P<tag>[A-Za-z0-9_.+-]+))?$")
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]  # a HF checkpoint (no *.bin / *.pt copies)
TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class HubRef:
    repo_id: str  # org/name
    tag: Optional[str]  # GGUF quant tag (Q4_K_M ...); None: the repo's HF checkpoint

    @property
    def text(self) -> str:
        return self.repo_id + (f":{self.tag}" if self.tag else "")


def parse_hub_id(model_path: str) -> Optional[HubRef]:
    """`org/name` or `org/name:TAG` (None: not of that form)."""
    m = HUB_ID.match(model_path)
    if m is None or ".." in model_path:
        return None
    return HubRef(m.group("repo"), m.group("tag"))


def hub_cache_dir() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in TRUE


def _missing(ref: HubRef, cache: str, why: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"model {ref.text!r}: {why} (Hugging Face cache {cache}); fetch it with `hf download {ref.repo_id}` "
        f"(or `huggingface-cli download {ref.repo_id}`), or pass a local directory / .gguf file")


def _local_snapshot(repo_id: str, cache: str) -> Optional[str]:
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, cache_dir=cache, local_files_only=True)
    except Exception:  # huggingface_hub's LocalEntryNotFoundError and kin: not cached
        return None


def _files(path: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


def pick_gguf(ref: HubRef, names: list[str]) -> str:
    """The one .gguf whose name holds the tag (case-insensitive; a whole-word match wins over a part)."""
    ggufs = [n for n in names if n.lower().endswith(".gguf")]
    tag = ref.tag.lower()
    word = re.compile(rf"(?<![a-z0-9]){re.escape(tag)}(?![a-z0-9_])")
    hits = [n for n in ggufs if word.search(os.path.basename(n).lower())] or \
        [n for n in ggufs if tag in os.path.basename(n).lower()]
    if len(hits) != 1:
        what = "matches more than one" if hits else "matches no"
        raise ValueError(f"model {ref.text!r}: tag {ref.tag!r} {what} .gguf file of {ref.repo_id} "
                         f"({', '.join(hits or ggufs) or 'it holds none'})")
    return hits[0]


def _gguf(ref: HubRef, cache: str, offline: bool) -> str:
    local = _local_snapshot(ref.repo_id, cache)
    if local is not None:
        names = _files(local)
        try:
            return os.path.join(local, pick_gguf(ref, names))
        except ValueError:
            if offline:
                raise
    if offline:
        raise _missing(ref, cache, "not in the cache and HF_HUB_OFFLINE is set")
    from huggingface_hub import HfApi, hf_hub_download

    try:
        names = HfApi().list_repo_files(ref.repo_id)
    except Exception as e:
        raise _missing(ref, cache, f"not in the cache and the hub did not list it ({type(e).__name__}: {e})") from e
    return hf_hub_download(ref.repo_id, pick_gguf(ref, names), cache_dir=cache)


def _checkpoint(ref: HubRef, cache: str, offline: bool) -> str:
    path = _local_snapshot(ref.repo_id, cache)
    if path is None and offline:
        raise _missing(ref, cache, "not in the cache and HF_HUB_OFFLINE is set")
    if path is None or (not offline and not os.path.isfile(os.path.join(path, "config.json"))):
        from huggingface_hub import snapshot_download

        try:
            path = snapshot_download(ref.repo_id, cache_dir=cache, allow_patterns=MODEL_FILES)
        except Exception as e:
            raise _missing(ref, cache, f"the download failed ({type(e).__name__}: {e})") from e
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    ggufs = [n for n in _files(path) if n.endswith(".gguf")]
    if not ggufs and not offline:  # only the checkpoint's file kinds were fetched: ask the hub for the rest
        from huggingface_hub import HfApi

        ggufs = [n for n in HfApi().list_repo_files(ref.repo_id) if n.endswith(".gguf")]
    raise ValueError(f"model {ref.text!r}: {path} has no config.json" + (
        f"; a GGUF repo: name its file with {ref.repo_id}:TAG ({', '.join(ggufs)})" if ggufs else ""))


def resolve_hub_id(ref: HubRef) -> str:
    """A HF checkpoint directory (ref without tag) or a .gguf file path (ref with tag)."""
    cache, offline = hub_cache_dir(), hub_offline()
    return _gguf(ref, cache, offline) if ref.tag else _checkpoint(ref, cache, offline)
