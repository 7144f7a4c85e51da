"""Weight updates at run time (SGLang's routes and Engine methods): two tiny random Llamas saved by transformers
with different seeds; the server serves A, takes B from disk, and then generates transformers' B tokens; a prompt
cached under A is recomputed; incompatible checkpoints are refused by name with A's weights intact. The Engine
takes B's tensors in process."""

from __future__ import annotations

import shutil

import httpx
import pytest

from server_utils import ServerProcess, assert_idle_and_whole
from tiny_checkpoints import build_tiny, hf_greedy

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
            initializer_range=0.3, max_position_embeddings=256)
PROMPT = list(range(300, 340))
NEW = 12
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A and B (same config, other seeds), B with a tensor missing, and one of another hidden size."""
    import torch
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("weights")
    a = build_tiny(root / "a", "LlamaConfig", TINY, {}, seed=1)
    b = build_tiny(root / "b", "LlamaConfig", TINY, {}, seed=2)
    build_tiny(root / "wide", "LlamaConfig", TINY, {"hidden_size": 96}, seed=3)
    shutil.copytree(root / "b", root / "missing")
    (f,) = (root / "missing").glob("*.safetensors")
    tensors = load_file(f)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, f, metadata={"format": "pt"})
    want = {"a": hf_greedy(a, PROMPT, NEW), "b": hf_greedy(b, PROMPT, NEW)}
    assert want["a"] != want["b"]  # the seeds give other tokens: every comparison below can fail
    with torch.no_grad():
        b_params = {k: v.clone() for k, v in b.state_dict().items()}
        names = sorted(b_params)
        a.load_state_dict({k: b_params[k] for k in names[: len(names) // 2]}, strict=False)  # A with half of B
    want["half"] = hf_greedy(a, PROMPT, NEW)
    assert want["half"] not in (want["a"], want["b"])
    return root, want, b_params


def _gen(c: httpx.Client) -> dict:
    r = c.post("/generate", json={"input_ids": PROMPT, "sampling_params": SP})
    assert r.status_code == 200, r.text
    return r.json()


def test_server_update_from_disk(checkpoints):
    root, want, b_params = checkpoints
    srv = ServerProcess("--model-path", str(root / "a"), "--dtype", "float32", "--max-total-tokens", "2048")
    try:
        c = httpx.Client(base_url=srv.url, timeout=120)
        assert c.get("/get_model_info").json()["weight_version"] == "default"
        assert _gen(c)["output_ids"] == want["a"]
        assert_idle_and_whole(c)
        pin = c.post("/pin_prefix", json={"input_ids": PROMPT}).json()
        assert pin["pinned_len"] > 0
        # refused: another hidden size, a missing tensor, a bad load_format; A stays served
        for path, needle, fmt in ((root / "wide", "hidden_size", None),
                                  (root / "missing", "model.layers.1.mlp.up_proj.weight", None),
                                  (root / "b", "load_format 'gguf'", "gguf")):
            r = c.post("/update_weights_from_disk", json={"model_path": str(path), "load_format": fmt})
            assert r.status_code == 400, r.text
            assert r.json()["success"] is False
            assert needle in r.json()["message"], r.json()
            again = _gen(c)
            assert again["output_ids"] == want["a"]
            assert again["meta_info"]["cached_tokens"] > 0  # a refusal keeps the cache
        pinned = c.get("/server_info").json()["stats"]
        assert pinned["num_pins"] == 1  # a refusal keeps the pin
        assert pinned["free_slots"] + pinned["cached_slots"] == pinned["total_slots"]
        r = c.post("/update_weights_from_disk", json={"model_path": str(root / "b"), "weight_version": "step-1"})
        assert r.status_code == 200, r.text
        assert r.json()["success"] is True
        assert r.json()["num_paused_requests"] == 0
        assert_idle_and_whole(c)
        st = c.get("/server_info").json()
        assert st["weight_version"] == "step-1"
        assert st["stats"]["cached_slots"] == 0  # the pin and the cached prompt are gone
        assert st["stats"]["num_pins"] == 0
        after = _gen(c)  # cached under A before the update: recomputed on B
        assert after["meta_info"]["cached_tokens"] == 0
        assert after["output_ids"] == want["b"]
        assert c.get("/get_weight_version").json() == {"weight_version": "step-1"}
        for name, rows in (("model.embed_tokens.weight", 3), ("model.layers.0.self_attn.k_proj.weight", 5),
                           ("model.layers.1.mlp.up_proj.weight", 2), ("lm_head.weight", 4),
                           ("model.layers.0.input_layernorm.weight", 10)):
            got = c.post("/get_weights_by_name", json={"name": name, "truncate_size": rows}).json()
            assert got == b_params[name][:rows].tolist(), name
        r = c.post("/get_weights_by_name", json={"name": "model.layers.9.mlp.up_proj.weight"})
        assert r.status_code == 400
        assert "model.layers.9.mlp.up_proj.weight" in r.text
        assert_idle_and_whole(c)
    finally:
        srv.stop()


def test_engine_update_from_tensor(checkpoints):
    from radixlang_runtime import Engine

    root, want, b_params = checkpoints
    with Engine(str(root / "a"), dtype="float32", max_total_tokens=1024) as eng:
        assert eng.generate(input_ids=PROMPT, sampling_params=SP)["output_ids"] == want["a"]
        for bad, named in (("model.layers.9.mlp.up_proj.weight", [("model.layers.9.mlp.up_proj.weight",
                                                                   b_params["model.norm.weight"])]),
                           ("model.norm.weight [32]", [("model.norm.weight", b_params["model.norm.weight"][:32])])):
            ok, message = eng.update_weights_from_tensor(named)
            assert ok is False and bad in message, message
        assert eng.generate(input_ids=PROMPT, sampling_params=SP)["output_ids"] == want["a"]
        # two buckets, as RL trainers send them: after the first, A with those tensors of B's
        names = sorted(b_params)
        first = [(k, b_params[k]) for k in names[: len(names) // 2]]
        ok, message = eng.update_weights_from_tensor(first)
        assert ok is True, message
        assert eng.generate(input_ids=PROMPT, sampling_params=SP)["output_ids"] == want["half"]
        ok, message = eng.update_weights_from_tensor([(k, b_params[k]) for k in names[len(names) // 2:]],
                                                     weight_version="b")
        assert ok is True, message
        assert eng.weight_version == "b"
        out = eng.generate(input_ids=PROMPT, sampling_params=SP)
        assert out["output_ids"] == want["b"]
        assert out["meta_info"]["cached_tokens"] == 0
        got = eng.get_weights_by_name("model.layers.1.self_attn.v_proj.weight", 3)
        assert got == b_params["model.layers.1.self_attn.v_proj.weight"][:3].tolist()
        ok, message, _ = eng.update_weights_from_disk(str(root / "a"))
        assert ok is True, message
        assert eng.generate(input_ids=PROMPT, sampling_params=SP)["output_ids"] == want["a"]
        stats = eng.get_stats()
        eng.check_integrity()
    assert stats["free_slots"] + stats["cached_slots"] == stats["total_slots"]
