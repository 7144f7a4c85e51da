"""--model-path as a hub id (model/loader/hub.py): resolved from a Hugging Face cache laid out as huggingface_hub
writes it (models--org--name/{blobs,refs/main,snapshots/<rev>/ -> blobs}) under HF_HUB_CACHE, with
HF_HUB_OFFLINE=1 so nothing reaches a network; served once through the Engine (greedy tokens equal
transformers'); org/name:TAG picks a GGUF repo's file; what is missing or ambiguous is an error that names
the id, the cache and how to fetch it."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from radixlang_runtime.model.loader.resolve import resolve_model_dir, served_name
from tiny_checkpoints import build_tiny, hf_greedy

REV = "0123456789abcdef0123456789abcdef01234567"
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3, max_position_embeddings=256)


def cache_repo(cache, repo_id: str, files: dict[str, str]) -> str:
    """files: name -> source path, stored as blobs with the snapshot's symlinks; returns the snapshot dir."""
    root = cache / ("models--" + repo_id.replace("/", "--"))
    snap = root / "snapshots" / REV
    (root / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(REV)
    for name, src in files.items():
        with open(src, "rb") as f:
            blob = root / "blobs" / hashlib.sha256(f.read()).hexdigest()
        shutil.copyfile(src, blob)
        os.symlink(os.path.relpath(blob, snap), snap / name)
    return str(snap)


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_cached_repo_is_served_offline(tmp_path, offline_cache):
    import torch

    from radixlang_runtime import Engine

    src = tmp_path / "src"
    model = build_tiny(src, "LlamaConfig", TINY, {})
    snap = cache_repo(offline_cache, "tiny-org/tiny-llama", {f: str(src / f) for f in os.listdir(src)})
    assert resolve_model_dir("tiny-org/tiny-llama") == snap
    assert served_name("tiny-org/tiny-llama") == "tiny-org/tiny-llama"
    prompt = list(range(300, 320))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny forwards on a loaded machine
    try:
        want = hf_greedy(model, prompt, 12)
    finally:
        torch.set_num_threads(threads)
    with Engine("tiny-org/tiny-llama", dtype="float32", max_total_tokens=1024) as eng:
        assert eng.model_dir == snap
        out = eng.generate(input_ids=prompt, sampling_params={"max_new_tokens": 12, "min_new_tokens": 12,
                                                              "temperature": 0})
    assert out["output_ids"] == want


def test_a_gguf_file_is_picked_by_its_tag(tmp_path, offline_cache):
    names = ["SmolThing-Q4_K_M.gguf", "SmolThing-Q4_K_S.gguf", "SmolThing-Q8_0.gguf", "README.md"]
    for n in names:
        (tmp_path / n).write_bytes(n.encode())  # the resolver reads names only
    snap = cache_repo(offline_cache, "org/SmolThing-GGUF", {n: str(tmp_path / n) for n in names})
    from radixlang_runtime.model.loader.hub import parse_hub_id, resolve_hub_id

    assert resolve_hub_id(parse_hub_id("org/SmolThing-GGUF:q8_0")) == os.path.join(snap, "SmolThing-Q8_0.gguf")
    assert resolve_hub_id(parse_hub_id("org/SmolThing-GGUF:Q4_K_M")) == os.path.join(snap, "SmolThing-Q4_K_M.gguf")
    with pytest.raises(ValueError, match=r"tag 'Q4' matches more than one .gguf file of org/SmolThing-GGUF "
                                         r"\(SmolThing-Q4_K_M.gguf, SmolThing-Q4_K_S.gguf\)"):
        resolve_model_dir("org/SmolThing-GGUF:Q4")
    with pytest.raises(ValueError, match=r"tag 'Q2_K' matches no .gguf file .*SmolThing-Q8_0.gguf"):
        resolve_model_dir("org/SmolThing-GGUF:Q2_K")
    with pytest.raises(ValueError, match=r"has no config.json; a GGUF repo: name its file with org/SmolThing-GGUF:TAG"):
        resolve_model_dir("org/SmolThing-GGUF")


def test_a_missing_repo_names_the_id_the_cache_and_the_fetch(offline_cache):
    with pytest.raises(FileNotFoundError) as err:
        resolve_model_dir("nobody/absent-model")
    msg = str(err.value)
    assert "'nobody/absent-model'" in msg and str(offline_cache) in msg and "HF_HUB_OFFLINE" in msg
    assert "hf download nobody/absent-model" in msg and "huggingface-cli download nobody/absent-model" in msg
    with pytest.raises(FileNotFoundError, match="'nobody/absent-GGUF:Q4_K_M'"):
        resolve_model_dir("nobody/absent-GGUF:Q4_K_M")


def test_hf_home_is_honoured_and_paths_win_over_ids(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "x").write_text("{}")
    snap = cache_repo(tmp_path / "home" / "hub", "org/cfg-only", {"config.json": str(tmp_path / "x")})
    assert resolve_model_dir("org/cfg-only") == snap
    local = tmp_path / "org" / "cfg-only"  # an existing relative path of the same form is a path
    local.mkdir(parents=True)
    (local / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_dir("org/cfg-only") == "org/cfg-only"
