"""DeepSeek V2 / V3 (multi-head latent attention, DeepSeek MoE routing) end to end: tiny random checkpoints written
by transformers, served by the Engine in float32 greedy token for token against transformers' generate, with
prompts longer than a prefill chunk, a pool tight enough to retract, a radix-cache hit and the allocator checked
after every step; the KV pool holds one latent entry per token; the absorbed decode against the expanded one, and
through the Triton kernel (--attention-backend triton); the routers against transformers' own; config fields not
honoured refused by name."""

from __future__ import annotations

import pytest
import torch

from radixlang_runtime.model.loader.config import ModelConfig
from tiny_checkpoints import build_tiny, hf_greedy, with_config

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, initializer_range=0.3,
            max_position_embeddings=256, kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
            first_k_dense_replace=1)
PROMPTS = [[(i * 131 + 7 * j) % 40000 + 100 for i in range(n)] for j, n in enumerate((20, 37, 44, 9))]
NEW = 10
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
        "mscale": 1.0, "mscale_all_dim": 1.0}

# name -> (transformers config class, its kwargs, a config change that must change transformers' own tokens)
CASES = {
    "v2_q_lora": ("DeepseekV2Config", {"routed_scaling_factor": 1.5}, {"routed_scaling_factor": 1.0}),
    "v2_no_q_lora_grouped": ("DeepseekV2Config", {"q_lora_rank": None, "topk_method": "group_limited_greedy",
                                                  "n_group": 4, "topk_group": 2}, {"topk_group": 1}),
    "v3": ("DeepseekV3Config", {"n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5}, {"topk_group": 4}),
    # halves rotation instead of pairs, YaRN with the softmax-scale correction (mscale_all_dim), no q_lora
    "v3_yarn_halves": ("DeepseekV3Config", {"n_group": 2, "topk_group": 1, "rope_interleave": False,
                                            "q_lora_rank": None, "rope_parameters": YARN},
                       {"rope_parameters": {**YARN, "mscale_all_dim": 0.0}}),
}


def _build(tmp_path, name: str):
    cls_name, kwargs, contrast = CASES[name]
    model = build_tiny(tmp_path, cls_name, TINY, kwargs)
    if cls_name == "DeepseekV3Config":  # a correction bias that moves the choice (transformers initialises zeros)
        torch.manual_seed(1)
        for m in model.modules():
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.copy_(torch.randn_like(m.e_score_correction_bias) * 0.5)
        model.save_pretrained(tmp_path, safe_serialization=True)
    return model, contrast


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_matches_transformers(name, tmp_path):
    from radixlang_runtime import Engine

    model, contrast = _build(tmp_path, name)
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    assert sum(len(set(w)) > 1 for w in want) >= 3  # not a degenerate model (one token repeated)
    assert hf_greedy(with_config(model, contrast), PROMPTS[1], NEW) != want[1]
    sp = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
    slots = 128
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=slots, chunked_prefill_size=16,
                max_prefill_tokens=64, new_token_ratio_init=0.05, new_token_ratio_min=0.05,
                debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=sp)
        stats = eng.get_stats()
        again = eng.generate(input_ids=PROMPTS[2], sampling_params=sp)  # 44 tokens: longer than a chunk
    assert stats["num_retractions"] > 0, "the pool was meant to force retractions"
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == want[2]
    assert again["meta_info"]["cached_tokens"] > 0
    # one latent entry per token and layer: (kv_lora_rank + qk_rope_head_dim) lanes of float32
    per_token = (TINY["kv_lora_rank"] + TINY["qk_rope_head_dim"]) * TINY["num_hidden_layers"] * 4
    assert stats["memory"]["kv_pool"] == per_token * slots



def test_triton_backend_matches_transformers(tmp_path):
    """--attention-backend triton: the absorbed decode's attention is the Triton kernel (radixlang_kernels/
    mla_decode_triton.py; interpreted on CPU: TRITON_INTERPRET=1, set in conftest when there is no GPU) over pages
    of 4, a radix-cache hit included; the allocator checked after every step."""
    pytest.importorskip("triton")
    from radixlang_runtime import Engine

    model, _ = _build(tmp_path, "v3")
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    sp = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
    with Engine(str(tmp_path), dtype="float32", attention_backend="triton", max_total_tokens=256, page_size=4,
                chunked_prefill_size=16, debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=sp)
        again = eng.generate(input_ids=PROMPTS[2], sampling_params=sp)
        eng.check_integrity()
        stats = eng.get_stats()
    assert stats["cpu"]["paths"]["decode_attention"] == "mla-absorbed:triton"
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == want[2] and again["meta_info"]["cached_tokens"] > 0


def test_triton_decode_refuses_a_latent_wider_than_the_kernel():
    """A latent past the kernel's 512 lanes under --attention-backend triton: refused by name at load."""
    from types import SimpleNamespace

    from radixlang_runtime.model.models.deepseek import DeepseekForCausalLM

    cfg = ModelConfig.from_dict({**V3_MIN, "kv_lora_rank": 1024, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                                 "v_head_dim": 16})
    with pytest.raises(ValueError, match="kv_lora_rank <= 512"):
        DeepseekForCausalLM.use_triton_kernels(SimpleNamespace(cfg=cfg, layers=[]))

def _runner(path, absorbed: bool, c_kernel: bool):
    from radixlang_runtime.model.executor.runner import ModelRunner
    from radixlang_runtime.server_args import ServerArgs

    runner = ModelRunner(ServerArgs(model_path=str(path), dtype="float32", max_total_tokens=64), str(path))
    for layer in runner.model.layers:
        layer.self_attn.absorbed = absorbed
        layer.self_attn.use_cpu_kernel = c_kernel
    return runner


def test_absorbed_decode_matches_expanded(tmp_path):
    """Two requests of different lengths decoding three steps: the absorbed form's logits (the C kernel's and
    torch's) are the expanded form's, float32 rounding apart."""
    from radixlang_kernels import cpu_ops
    from radixlang_runtime.model.executor.runner import StepInputs

    if cpu_ops.load() is None:
        pytest.skip("no C kernels on this machine (no compiler)")
    _build(tmp_path, "v3")
    a, b = [1200 + i for i in range(11)], [77 + 3 * i for i in range(6)]
    logits = {}
    for absorbed, c_kernel in ((True, True), (True, False), (False, False)):
        r = _runner(tmp_path, absorbed, c_kernel)
        n = len(a) + len(b)
        r.run_step(StepInputs("extend", a + b, list(range(n)), [0, 1], [0, 0], [len(a), len(b)], [],
                              [len(a) - 1, n - 1]))
        lens, toks, got = [len(a), len(b)], [5, 9], []
        for step in range(3):
            slots = [n + 2 * step, n + 2 * step + 1]
            got.append(r.run_step(StepInputs("decode", toks, slots, [0, 1], lens, [1, 1], [], [0, 1])))
            lens = [x + 1 for x in lens]
        logits[absorbed, c_kernel] = torch.stack(got)
    expanded = logits[False, False]
    assert expanded.shape == (3, 2, 49152)
    torch.testing.assert_close(logits[True, True], expanded, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits[True, False], expanded, rtol=1e-4, atol=1e-4)


def test_routers_match_transformers():
    """route_grouped against transformers' DeepseekV2TopkRouter (greedy, group_limited_greedy) and
    DeepseekV3TopkRouter (noaux_tc with a correction bias): the same experts and weights per token."""
    import transformers
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    from radixlang_runtime.model.layers.moe_routing import RoutingSpec, route_grouped

    torch.manual_seed(0)
    x = torch.randn(40, 64)
    base = dict(hidden_size=64, n_routed_experts=16, num_experts_per_tok=3)
    cases = [
        (DeepseekV2TopkRouter, transformers.DeepseekV2Config(**base, routed_scaling_factor=1.5),
         RoutingSpec("softmax", "greedy", 1, 1, 1.5, False, False)),
        (DeepseekV2TopkRouter, transformers.DeepseekV2Config(**base, topk_method="group_limited_greedy", n_group=4,
                                                            topk_group=2),
         RoutingSpec("softmax", "group_limited_greedy", 4, 2, 1.0, False, False)),
        (DeepseekV3TopkRouter, transformers.DeepseekV3Config(**base, n_group=4, topk_group=2, norm_topk_prob=True),
         RoutingSpec("sigmoid", "noaux_tc", 4, 2, 2.5, True, True)),
    ]
    for cls, cfg, spec in cases:
        router = cls(cfg)
        torch.nn.init.normal_(router.weight, std=0.5)
        bias = None
        if spec.correction_bias:
            router.e_score_correction_bias.normal_(std=0.5)
            bias = router.e_score_correction_bias
        _, want_w, want_e = router(x)
        got_w, got_e = route_grouped(x, router.weight, bias, 3, spec)
        order_w, order_g = want_e.sort(dim=-1), got_e.sort(dim=-1)
        assert torch.equal(order_w.values, order_g.values), spec
        torch.testing.assert_close(want_w.gather(1, order_w.indices), got_w.gather(1, order_g.indices))


V3_MIN = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "kv_lora_rank": 16,
          "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "n_routed_experts": 8, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2}


@pytest.mark.parametrize("extra,needle", [
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"topk_method": "greedy"}, "topk_method"),
    ({"moe_layer_freq": 2}, "moe_layer_freq"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"n_group": 3}, "n_group"),
    ({"topk_group": 5}, "topk_group"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta": 1}}, "beta"),
    ({"architectures": ["DeepseekV2ForCausalLM"], "norm_topk_prob": True}, "norm_topk_prob"),
    ({"architectures": ["DeepseekV2ForCausalLM"], "topk_method": "noaux_tc"}, "topk_method"),
    ({"architectures": ["DeepseekV2ForCausalLM"], "rope_interleave": False}, "rope_interleave"),
])
def test_unhonoured_fields_are_refused_by_name(extra, needle):
    with pytest.raises(ValueError, match=needle):
        ModelConfig.from_dict({**V3_MIN, **extra})


def test_transformers_implementation_refuses_latent_attention():
    """--model-impl transformers on an MLA config: refused by name (its paged attention assumes one head width)."""
    with pytest.raises(ValueError, match="kv_lora_rank"):
        ModelConfig.from_dict(V3_MIN, model_impl="transformers")


SYSTEM = [(7 * i + 300) % 4000 + 10 for i in range(96)]  # 3 records of 32 tokens
SESSIONS = [SYSTEM + [(13 * i + 97 * s) % 4000 + 10 for i in range(48)] for s in range(4)]  # 144 tokens each


def test_hierarchical_tiers_move_latent_entries(tmp_path):
    """The hierarchical cache with a pool too small for the sessions: evicted latent entries come back from the
    disk tier (or its write queue) and the outputs stay transformers'."""
    from radixlang_runtime import Engine

    model, _ = _build(tmp_path / "ckpt", "v2_q_lora")
    sp = {"max_new_tokens": 4, "min_new_tokens": 4, "temperature": 0}
    want = [hf_greedy(model, p, 4) for p in SESSIONS]
    with Engine(str(tmp_path / "ckpt"), dtype="float32", max_total_tokens=256, enable_hierarchical_cache=True,
                hicache_size=0.01, hicache_storage_dir=str(tmp_path / "l2"), debug_check_integrity=True,
                hicache_load_policy="always") as eng:
        for _ in range(2):  # the second round finds the sessions' own records evicted, in the tiers
            assert [eng.generate(input_ids=p, sampling_params=sp)["output_ids"] for p in SESSIONS] == want
        stats = eng.get_stats()["hicache"]
        eng.check_integrity()
    assert stats["hit_tokens"]["l2"] + stats["hit_tokens"]["queue"] >= 32
    assert stats["bytes_loaded"] > 0


def test_record_port_moves_one_entry_per_token():
    """kv_records (the tiers' and PD's transfer) on the latent layout: a record is t tokens x layers x one entry,
    read back bit for bit into other slots; V stays a view of the entry."""
    from radixlang_runtime.mem.kv_pool import KVPool
    from radixlang_runtime.mem.kv_records import KVRecordPort

    pool = KVPool(64, 3, 1, 40, torch.float32, torch.device("cpu"), 2, 64, v_view=32)
    for layer in range(3):
        pool.k_buffers[layer].copy_(torch.randn(1, 64, 40))
    assert pool.v_buffers[0].data_ptr() == pool.k_buffers[0].data_ptr() and pool.v_buffers[0].shape == (1, 64, 32)
    port = KVRecordPort(pool, 4)
    assert port.record_bytes == 4 * 3 * 40 * 4
    payloads = port.read_records(list(range(8)))
    port.write_records(list(range(32, 40)), payloads)
    for layer in range(3):
        assert torch.equal(pool.k_buffers[layer][:, 32:40], pool.k_buffers[layer][:, :8])
    assert pool.nbytes == KVPool.bytes_per_token(3, 1, 40, torch.float32, v_view=32) * 64 == 64 * 3 * 40 * 4


def test_bfloat16_runs(tmp_path):
    """bfloat16 serving (the packed linears, the C norms where the CPU has them, the routers in float32)."""
    from radixlang_runtime import Engine

    _build(tmp_path, "v3")
    sp = {"max_new_tokens": 6, "min_new_tokens": 6, "temperature": 0}
    with Engine(str(tmp_path), dtype="bfloat16", max_total_tokens=256, chunked_prefill_size=16) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=sp)
        stats = eng.get_stats()
    assert [len(o["output_ids"]) for o in outs] == [6] * len(PROMPTS)
    assert stats["memory"]["kv_pool"] == (TINY["kv_lora_rank"] + TINY["qk_rope_head_dim"]) * 3 * 2 * 256


@pytest.mark.parametrize("name", ["v3", "v2_no_q_lora_grouped"])
def test_tp2_matches_transformers(name, tmp_path):
    """Two gloo ranks: each runs 2 of the 4 query heads (q / kv_b rows, o_proj columns), the experts' and dense
    MLPs' intermediate columns split, the vocab rows split; each rank's pool holds the whole latent entry."""
    from radixlang_runtime import Engine

    model, _ = _build(tmp_path, name)
    want = [hf_greedy(model, p, NEW) for p in PROMPTS[:3]]
    sp = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
    with Engine(str(tmp_path), dtype="float32", tp_size=2, max_total_tokens=256, chunked_prefill_size=16,
                debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=PROMPTS[:3], sampling_params=sp)
        again = eng.generate(input_ids=PROMPTS[2], sampling_params=sp)
        stats = eng.get_stats()
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == want[2] and again["meta_info"]["cached_tokens"] > 0
    per_token = (TINY["kv_lora_rank"] + TINY["qk_rope_head_dim"]) * TINY["num_hidden_layers"] * 4  # replicated
    assert stats["memory"]["kv_pool"] == per_token * 256


def test_tp_shard_holds_its_heads():
    """Rank 1 of 2 builds its 2 query heads' projections and the whole latent ones."""
    from radixlang_runtime.model.executor.parallel import make_shard
    from radixlang_runtime.model.models.deepseek import MLAttention

    cfg = ModelConfig.from_dict({**V3_MIN, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
                                 "q_lora_rank": None})
    shard = make_shard(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size, 2, 1)
    attn = MLAttention(cfg, 0, shard, None)
    h = cfg.num_attention_heads // 2
    assert (attn.h, attn.head_start) == (h, h)
    assert attn.q_proj.out_features == h * 24 and attn.kv_b_proj.out_features == h * 32
    assert attn.o_proj.in_features == h * 16 and attn.kv_a_proj_with_mqa.out_features == cfg.mla.entry_dim


def test_pd_transfer_under_tp_is_refused_by_name():
    """PD's TP record port moves a split of KV heads; the latent entry is every rank's whole: refused."""
    from types import SimpleNamespace

    from radixlang_runtime.model.executor.tp_kv import TPRecordPort

    cfg = ModelConfig.from_dict({**V3_MIN, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16})
    with pytest.raises(ValueError, match="PD disaggregation with tp_size 2 is not implemented for "
                                         "DeepseekV3ForCausalLM"):
        TPRecordPort(SimpleNamespace(cfg=cfg, tp=SimpleNamespace(size=2)), 1)
