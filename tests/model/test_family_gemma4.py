"""Gemma 4 text (Gemma4ForCausalLM) end to end: a tiny random checkpoint written by transformers (sliding / global
layers with a window shorter than the prompts, global layers with twice the head_dim and one KV head whose V is
the key projection, the proportional rope, two KV-shared layers with double-wide MLPs, per-layer input
embeddings, random layer scalars, final logit soft-capping), served by the Engine in float32, greedy token for
token against transformers' own generate; the config fields it does not honour are refused by name."""

from __future__ import annotations

import copy

import pytest
import torch

from radixlang_runtime.model.loader.config import ModelConfig
from tiny_checkpoints import build_tiny, hf_greedy

FULL, SLIDE = "full_attention", "sliding_attention"
TINY = dict(hidden_size=64, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
            num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=8,
            layer_types=[SLIDE, FULL] * 3, sliding_window=8, final_logit_softcapping=30.0, bos_token_id=1,
            eos_token_id=2, pad_token_id=0, max_position_embeddings=256, initializer_range=0.3)
LONG_PROMPTS = [[(i * 131 + 7 * j) % 40000 + 100 for i in range(n)] for j, n in enumerate((20, 37, 26, 44, 31, 9))]
NEW = 16
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
# each of the 4 planes (layers 4 and 5 read layers 2 and 3's) at its own shape, K and V, float32: the sliding
# layers 0 and 2 two heads of 16 lanes, the global layers 1 and 3 one head of 32
KV_BYTES_PER_TOKEN = 2 * (2 * 16 + 1 * 32 + 2 * 16 + 1 * 32) * 4


def _randomise(model) -> None:
    """Layer scalars, norm weights and the router's scales away from transformers' ones (a wrong placement then
    moves the tokens)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith(("layer_scalar", "per_expert_scale", "router.scale")):
                t.copy_(0.5 + torch.rand(t.shape, generator=g))
            elif name.endswith("norm.weight"):
                t.copy_(1.0 + 0.3 * torch.randn(t.shape, generator=g))


def _build(path, global_head_dim: int, prompts: list[list[int]], **extra):
    """(path, transformers model, its greedy tokens on prompts)."""
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    vocab = len(AutoTokenizer.from_pretrained(embedded_tokenizer_dir()))
    model = build_tiny(path, "Gemma4TextConfig", TINY, {"vocab_size_per_layer_input": vocab,
                                                         "global_head_dim": global_head_dim, **extra})
    _randomise(model)
    model.save_pretrained(path, safe_serialization=True)
    return path, model, [hf_greedy(model, p, NEW) for p in prompts]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Global head_dim 32: the pool's entry fits the C attention kernels (head_dim <= 256)."""
    return _build(tmp_path_factory.mktemp("gemma4"), 32, LONG_PROMPTS)


@pytest.fixture(scope="module")
def wide_checkpoint(tmp_path_factory):
    """Global head_dim 320 (the released models' is 512): the pool's entry is past the C kernels' limit, the
    torch attention path serves it."""
    return _build(tmp_path_factory.mktemp("gemma4_wide"), 320, LONG_PROMPTS[:2])


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    """The mixture-of-experts block beside each dense MLP (gemma-4-26B-A4B's layer), 4 layers, 2 of them KV-shared."""
    return _build(tmp_path_factory.mktemp("gemma4_moe"), 32, LONG_PROMPTS[:2], num_hidden_layers=4,
                  layer_types=[SLIDE, FULL] * 2, enable_moe_block=True, num_experts=4, top_k_experts=2,
                  moe_intermediate_size=32, initializer_range=0.1)


def _forced_argmax(model, want: list[list[int]]) -> list[list[int]]:
    """Each prompt followed by its reference tokens in one forward: the argmax at every generated position."""
    out = []
    with torch.no_grad():
        for p, w in zip(LONG_PROMPTS, want):
            logits = model(torch.tensor([p + w[:-1]])).logits[0, len(p) - 1:]  # [NEW, V]
            out.append(logits.argmax(-1).tolist())
    return out


def test_each_feature_moves_transformers_tokens(checkpoint):
    """Without the window, the per-layer inputs or the layer scalars, transformers' own tokens differ: the parity
    below checks each of them."""
    _, model, want = checkpoint
    assert sum(len(set(w)) > 1 for w in want) >= 3  # not a degenerate model

    def no_window(m):
        for layer in m.model.layers:
            layer.self_attn.sliding_window = None
        m.config.sliding_window = 1000

    def no_ple(m):
        for layer in m.model.layers:
            layer.per_layer_projection.weight.zero_()

    def no_scalars(m):
        for layer in m.model.layers:
            layer.layer_scalar.fill_(1.0)

    for change in (no_window, no_ple, no_scalars):
        other = copy.deepcopy(model)
        with torch.no_grad():
            change(other)
        assert _forced_argmax(other, want[:3]) != want[:3], change.__name__
    assert _forced_argmax(model, want) == want  # the check itself: the model's own tokens come back


def test_greedy_matches_transformers(checkpoint):
    """Prompts longer than the window and than a prefill chunk (16), a pool tight enough to retract, then a
    radix-cache hit: every request token for token against transformers, the allocator whole after each step;
    the KV-shared layers hold no pool plane."""
    from radixlang_kernels import cpu_ops
    from radixlang_runtime import Engine

    path, model, want = checkpoint
    with Engine(str(path), dtype="float32", max_total_tokens=160, chunked_prefill_size=16, max_prefill_tokens=64,
                new_token_ratio_init=0.05, new_token_ratio_min=0.05, debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=LONG_PROMPTS, sampling_params=SP)
        stats = eng.get_stats()
        again = eng.generate(input_ids=LONG_PROMPTS[3], sampling_params=SP)
    assert stats["num_retractions"] > 0, "the pool was meant to force retractions"
    # the C attention kernels wherever this machine has them (else the torch path runs)
    assert stats["cpu"]["paths"]["decode_attention"].startswith("c:") == (cpu_ops.load() is not None)
    assert stats["memory"]["kv_pool"] == 160 * KV_BYTES_PER_TOKEN
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == want[3]
    assert again["meta_info"]["cached_tokens"] > 0


def test_shared_prefix_batch_matches_transformers(checkpoint):
    """Requests sharing a cached 80-token prefix in one step: the global layers (32 lanes, one KV head) run cascade
    attention on the C path beside the sliding layers (16 lanes, two KV heads), each at its own pool shape;
    token for token against transformers."""
    from radixlang_runtime import Engine

    path, model, _ = checkpoint
    system = [(17 * i + 11) % 40000 + 100 for i in range(80)]
    prompts = [system + [(29 * i + 53 * r) % 40000 + 100 for i in range(5 + r)] for r in range(3)]
    want = [hf_greedy(model, p, NEW) for p in prompts]
    with Engine(str(path), dtype="float32", max_total_tokens=512, debug_check_integrity=True) as eng:
        eng.generate(input_ids=system + [7], sampling_params={**SP, "max_new_tokens": 1, "min_new_tokens": 1})
        outs = eng.generate(input_ids=prompts, sampling_params=SP)
        eng.check_integrity()
    assert [o["output_ids"] for o in outs] == want
    assert all(o["meta_info"]["cached_tokens"] >= 64 for o in outs)


def test_wide_heads_on_the_torch_path(wide_checkpoint):
    """Global layers of head_dim 320 (past the C kernels' 256) run the torch path; the sliding layers (16) the C
    kernels wherever this machine has them."""
    from radixlang_kernels import cpu_ops
    from radixlang_runtime import Engine

    path, _, want = wide_checkpoint
    with Engine(str(path), dtype="float32", max_total_tokens=256, chunked_prefill_size=16,
                debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=LONG_PROMPTS[:2], sampling_params=SP)
        paths = eng.get_stats()["cpu"]["paths"]
    c = cpu_ops.load() is not None
    assert paths["decode_attention"].startswith("c:") == c and paths["extend_attention"].startswith("c:") == c
    if c:
        assert paths["decode_attention"].endswith(", torch:sdpa-gather (head_dim 320)")
        assert paths["extend_attention"].endswith(", torch:sdpa (head_dim 320)")
    assert [o["output_ids"] for o in outs] == want


BASE = {"architectures": ["Gemma4ForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 32,
        "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 100}


def test_config_defaults_are_transformers():
    """Without layer_types every sixth layer is global (and the last one always); the global layers' head_dim is
    512 and their rope the proportional one; each pool layer keeps its own entry shape."""
    cfg = ModelConfig.from_dict({**BASE, "num_hidden_layers": 8, "num_kv_shared_layers": 2})
    lay = cfg.family_options
    assert cfg.layer_windows == (512,) * 5 + (0, 512, 0)
    assert lay.head_dims == (16,) * 5 + (512, 16, 512) and cfg.head_dim == 512 and cfg.num_key_value_heads == 2
    assert lay.kv_plane == (0, 1, 2, 3, 4, 5, 4, 5) and cfg.kv_layer_count == 6
    assert (cfg.rope.rope_type, cfg.rope.proportion, cfg.rope.theta) == ("proportional", 0.25, 1e6)
    assert (cfg.rope_local.rope_type, cfg.rope_local.theta, cfg.rope_local.head_dim) == ("default", 1e4, 16)
    assert cfg.attn_scale == 1.0 and cfg.tie_word_embeddings
    assert cfg.kv_shapes(0, 2) == ((2, 16),) * 5 + ((2, 512),)


def test_pool_bytes_per_token_are_each_layers_own():
    """Sliding layers of head_dim 16 and 2 KV heads, a global layer of 64 lanes and 1 KV head, two KV-shared
    layers: a token's pool bytes are each KV-computing layer's own 2 x kv_heads x head_dim x 4 (float32), not the
    widest entry's for every layer; a rank of two keeps the global layer's one KV head and one of the others."""
    from radixlang_runtime.mem.kv_pool import KVPool

    cfg = ModelConfig.from_dict({**BASE, "num_hidden_layers": 8, "num_kv_shared_layers": 2, "global_head_dim": 64,
                                 "attention_k_eq_v": True, "num_global_key_value_heads": 1})
    lay = cfg.family_options
    assert lay.head_dims[:6] == (16,) * 5 + (64,) and lay.kv_heads[:6] == (2,) * 5 + (1,)
    want = sum(2 * lay.kv_heads[i] * lay.head_dims[i] * 4 for i in range(8) if lay.owns_kv(i))
    assert want == 2 * (5 * 2 * 16 + 64) * 4 < 2 * 6 * 2 * 64 * 4  # the widest entry for every layer: padding
    shapes = cfg.kv_shapes(0, cfg.num_key_value_heads)
    assert shapes == ((2, 16),) * 5 + ((1, 64),)
    pool = KVPool(16, cfg.kv_layer_count, cfg.num_key_value_heads, cfg.head_dim, torch.float32,
                  torch.device("cpu"), 1, 16, shapes=shapes)
    assert pool.nbytes == 16 * want
    assert KVPool.bytes_per_token(cfg.kv_layer_count, 0, 0, torch.float32, shapes=shapes) == want
    assert [tuple(pool.k_buffers[i].shape) for i in (0, 5)] == [(2, 16, 16), (1, 16, 64)]
    assert cfg.kv_shapes(1, 1) == ((1, 16),) * 5 + ((1, 64),)


def test_proportional_rope_matches_transformers():
    from transformers import Gemma4TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from radixlang_runtime.model.layers.rotary import inv_freq

    text = Gemma4TextConfig(**{k: v for k, v in BASE.items() if k != "architectures"}, global_head_dim=64)
    want, _ = ROPE_INIT_FUNCTIONS["proportional"](text, None, layer_type=FULL)
    got, attention = inv_freq(ModelConfig.from_dict({**BASE, "global_head_dim": 64}).rope)
    assert attention == 1.0 and torch.equal(got, want)


@pytest.mark.parametrize("extra,needle", [
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2}, "enable_moe_block needs"),
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention 'all'"),
    ({"hidden_activation": "silu"}, "hidden_activation 'silu'"),
    ({"attention_bias": True}, "attention_bias"),
    ({"num_kv_shared_layers": 6}, "num_kv_shared_layers 6"),
    ({"num_kv_shared_layers": 1, "layer_types": [SLIDE] * 5 + [FULL]}, "layer 5 \\(full_attention\\) shares K/V"),
    ({"per_layer_config": {"5": {"num_key_value_heads": 3}}}, "KV heads per layer \\[2, 3\\]"),
    ({"per_layer_config": {"5": {"head_dim": 32, "sliding_window": 4}}}, "per_layer_config field 'sliding_window'"),
    ({"rope_parameters": {"chunked_attention": {"rope_type": "default"}}}, "rope_parameters entry"),
    ({"layer_types": ["chunked_attention"] * 6}, "layer_types entry 'chunked_attention'"),
])
def test_unhonoured_fields_are_refused_by_name(extra, needle):
    with pytest.raises(ValueError, match=needle):
        ModelConfig.from_dict({**BASE, **extra})


def test_moe_block_matches_transformers(moe_checkpoint):
    """Routed experts beside the dense MLP: without the per-expert scales transformers' own tokens differ; the
    Engine's are transformers' token for token."""
    from radixlang_runtime import Engine

    path, model, want = moe_checkpoint
    other = copy.deepcopy(model)
    with torch.no_grad():
        for layer in other.model.layers:
            layer.router.per_expert_scale.fill_(1.0)
    assert all(len(set(w)) > 1 for w in want) and _forced_argmax(other, want) != want
    with Engine(str(path), dtype="float32", max_total_tokens=256, chunked_prefill_size=16,
                debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=LONG_PROMPTS[:2], sampling_params=SP)
    assert [o["output_ids"] for o in outs] == want


def test_tensor_parallel_matches_transformers(moe_checkpoint):
    """Two gloo ranks on the MoE checkpoint (every Gemma 4 feature: per-layer head sizes, K = V global layers,
    KV-shared layers with double-wide MLPs, per-layer inputs, experts): 2 query heads and 1 pool KV head each; the
    global layers' single KV head computed on both ranks, the KV-shared layers reading their source's plane on
    each rank, the MLPs' and the experts' intermediate columns split, the vocabulary and the per-layer input
    table split (a prompt of ids in the second rank's rows); prompts longer than the window and a prefill chunk,
    then a radix-cache hit; token for token."""
    from radixlang_runtime import Engine

    path, model, want = moe_checkpoint
    high = [48000 + 37 * i for i in range(30)]  # past half the vocabulary: rank 1's rows
    assert max(high) < model.config.vocab_size
    with Engine(str(path), dtype="float32", tp_size=2, max_total_tokens=512, chunked_prefill_size=16,
                debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=LONG_PROMPTS[:2] + [high], sampling_params=SP)
        again = eng.generate(input_ids=LONG_PROMPTS[1], sampling_params=SP)
    assert [o["output_ids"] for o in outs] == want + [hf_greedy(model, high, NEW)]
    assert again["output_ids"] == want[1] and again["meta_info"]["cached_tokens"] > 0


def test_hierarchical_cache_round_trips_the_per_layer_pool(checkpoint, tmp_path):
    """The tiers' records of the pool's groups (sliding and global entries): a restart loads the prompt's first
    record from disk (L2) into every layer at its own shape; outputs equal transformers', the pools whole."""
    from radixlang_runtime import Engine

    path, _, want = checkpoint
    kw = dict(dtype="float32", max_total_tokens=256, enable_hierarchical_cache=True, hicache_size=0.01,
              hicache_storage_dir=str(tmp_path / "l2"), hicache_load_policy="always", debug_check_integrity=True)
    with Engine(str(path), **kw) as first:  # write_back: shutdown stores what only L1 held
        assert first.generate(input_ids=LONG_PROMPTS[3], sampling_params=SP)["output_ids"] == want[3]
        first.check_integrity()
    with Engine(str(path), **kw) as eng:
        out = eng.generate(input_ids=LONG_PROMPTS[3], sampling_params=SP)
        assert out["meta_info"]["cached_tokens"] == 32  # one record of 32 tokens, read from L2
        assert out["output_ids"] == want[3]
        assert eng.get_stats()["hicache"]["bytes_loaded"] == 32 * KV_BYTES_PER_TOKEN
        eng.check_integrity()


def test_tensor_parallel_hierarchical_cache_round_trips_the_per_layer_pool(moe_checkpoint, tmp_path):
    """Two gloo ranks: the tiers' records are a tp_size 1 pool's (the sliding layer's two KV heads from both
    ranks, the global layer's one head), stored at shutdown and loaded by a restart into each rank's heads of
    each layer; outputs equal transformers'."""
    from radixlang_runtime import Engine

    path, _, want = moe_checkpoint
    kw = dict(dtype="float32", tp_size=2, max_total_tokens=256, enable_hierarchical_cache=True, hicache_size=0.01,
              hicache_storage_dir=str(tmp_path / "l2"), hicache_load_policy="always", debug_check_integrity=True)
    with Engine(str(path), **kw) as first:
        assert first.generate(input_ids=LONG_PROMPTS[1], sampling_params=SP)["output_ids"] == want[1]
    with Engine(str(path), **kw) as eng:
        out = eng.generate(input_ids=LONG_PROMPTS[1], sampling_params=SP)
        assert out["meta_info"]["cached_tokens"] == 32
        assert out["output_ids"] == want[1]
        # 2 planes: the sliding layer's 2 heads of 16 lanes, the global layer's 1 of 32; K and V, float32
        assert eng.get_stats()["hicache"]["bytes_loaded"] == 32 * 2 * (2 * 16 + 32) * 4
        eng.check_integrity()


def test_kv_share_of_a_rank():
    from radixlang_runtime.model.models.gemma4_config import kv_share, rank_kv_heads

    assert kv_share(4, 1, 2, 2) == (0, (2,))  # one layer head serving both of the rank's wide heads
    assert kv_share(4, 2, 2, 2) == (1, (2,))
    assert kv_share(4, 4, 2, 2) == (2, (1, 1))
    assert kv_share(6, 2, 2, 2) == (0, (1, 1))  # wide heads 2 and 3: layer heads 0 (0-2) and 1 (3-5)
    # the pool stores each layer head once, unless the rank's share cuts two heads' groups unequally
    assert [rank_kv_heads(4, 1, 2, 2), rank_kv_heads(4, 2, 2, 2), rank_kv_heads(4, 4, 2, 2)] == [1, 1, 2]
    assert kv_share(6, 3, 0, 3) == (0, (2, 1)) and rank_kv_heads(6, 3, 0, 3) == 3


def test_lora_is_refused_by_name(checkpoint):
    from radixlang_runtime import Engine

    path, _, _ = checkpoint
    with pytest.raises(ValueError, match="enable_lora is not supported for Gemma 4"):
        Engine(str(path), dtype="float32", max_total_tokens=64, enable_lora=True, max_lora_rank=8)


def test_multimodal_checkpoint_serves_its_text_model(checkpoint, tmp_path):
    """Gemma4ForConditionalGeneration's directory (text weights under model.language_model., config.json's
    text_config): transformers' multimodal model and the Engine both give the text model's tokens."""
    import json
    import shutil

    from safetensors.torch import save_file
    from transformers import Gemma4ForConditionalGeneration

    from radixlang_runtime import Engine

    path, model, want = checkpoint
    tensors = {"model.language_model." + k[len("model."):]: v.clone().contiguous()
               for k, v in model.state_dict().items() if k.startswith("model.")}
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
              "text_config": model.config.to_dict(), "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for f in path.iterdir():
        if "token" in f.name:
            shutil.copy(f, tmp_path / f.name)
    hf = Gemma4ForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        for p, w in zip(LONG_PROMPTS[:2], want):
            assert hf(torch.tensor([p + w[:-1]])).logits[0, len(p) - 1:].argmax(-1).tolist() == w
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=256) as eng:
        outs = eng.generate(input_ids=LONG_PROMPTS[:2], sampling_params=SP)
    assert [o["output_ids"] for o in outs] == want[:2]


def test_bfloat16_runs(checkpoint):
    """bfloat16 serving: the packed linears, the C norms where the CPU has them, the per-layer pool entries."""
    from radixlang_runtime import Engine

    path, _, _ = checkpoint
    with Engine(str(path), dtype="bfloat16", max_total_tokens=256, chunked_prefill_size=16) as eng:
        outs = eng.generate(input_ids=LONG_PROMPTS[:3], sampling_params={**SP, "max_new_tokens": 4,
                                                                        "min_new_tokens": 4})
        stats = eng.get_stats()
    assert [len(o["output_ids"]) for o in outs] == [4] * 3
    assert stats["memory"]["kv_pool"] == 256 * KV_BYTES_PER_TOKEN // 2  # 2-byte lanes
