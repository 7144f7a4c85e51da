"""gpt-oss (GptOssForCausalLM) end to end: a tiny random checkpoint written by transformers (alternating sliding /
full layers with a window shorter than the prompts, 4 experts top-2, yarn RoPE, random sinks and biases), served
by the Engine in float32, greedy token for token against transformers' own generate; the config fields it does not
honour are refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from radixlang_runtime.model.loader.config import ModelConfig
from tiny_checkpoints import build_tiny, hf_greedy

FULL, SLIDE = "full_attention", "sliding_attention"
TINY = dict(hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, initializer_range=0.3,
            num_local_experts=4, num_experts_per_tok=2, sliding_window=8, max_position_embeddings=256,
            rope_parameters={"rope_type": "yarn", "factor": 16.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "truncate": False, "original_max_position_embeddings": 16, "rope_theta": 150000.0})
LONG_PROMPTS = [[(i * 131 + 7 * j) % 40000 + 100 for i in range(n)] for j, n in enumerate((20, 37, 26, 44, 31, 9))]
NEW = 16
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}


def _randomise(model) -> None:
    """Sinks, router and expert biases drawn large enough to move the tokens (transformers initialises the
    expert biases to zero and the sinks small)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("sinks", "_bias", "router.bias")):
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 if name.endswith("sinks") else 0.5))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(path, transformers model, its greedy tokens on LONG_PROMPTS)."""
    path = tmp_path_factory.mktemp("gpt_oss")
    model = build_tiny(path, "GptOssConfig", TINY, {})
    _randomise(model)
    model.save_pretrained(path, safe_serialization=True)
    return path, model, [hf_greedy(model, p, NEW) for p in LONG_PROMPTS]


def _variant(model, change):
    """The same weights with `change(model)` applied in place to a copy (a contrast: the parity can fail)."""
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        change(other)
    return other


def test_each_feature_moves_transformers_tokens(checkpoint):
    """Without the sinks, the window, the router bias or the clamp, transformers' own tokens differ: the parity
    below checks each of them."""
    _, model, want = checkpoint
    assert sum(len(set(w)) > 1 for w in want) >= 3  # not a degenerate model

    def no_sinks(m):
        for layer in m.model.layers:
            layer.self_attn.sinks.fill_(-1e4)

    def no_window(m):
        m.config.layer_types = [FULL] * TINY["num_hidden_layers"]
        for layer in m.model.layers:
            layer.self_attn.sliding_window = None

    def no_router_bias(m):
        for layer in m.model.layers:
            layer.mlp.router.bias.zero_()

    def loose_clamp(m):
        for layer in m.model.layers:
            layer.mlp.experts.limit = 1e9

    for change in (no_sinks, no_window, no_router_bias, loose_clamp):
        assert _forced_argmax(_variant(model, change), want) != want, change.__name__
    assert _forced_argmax(model, want) == want  # the check itself: the model's own tokens come back


def _forced_argmax(model, want: list[list[int]]) -> list[list[int]]:
    """Each prompt followed by its reference tokens in one forward: the argmax at every generated position
    (equal to `want` exactly when greedy decoding would reproduce it)."""
    out = []
    with torch.no_grad():
        for p, w in zip(LONG_PROMPTS, want):
            logits = model(torch.tensor([p + w[:-1]])).logits[0, len(p) - 1:]  # [NEW, V]
            out.append(logits.argmax(-1).tolist())
    return out


def test_greedy_matches_transformers(checkpoint):
    """Prompts longer than the window and than a prefill chunk (16), a pool tight enough to retract, then a
    radix-cache hit: every request token for token against transformers, the allocator whole after each step."""
    from radixlang_kernels import cpu_ops
    from radixlang_runtime import Engine

    path, model, want = checkpoint
    with Engine(str(path), dtype="float32", max_total_tokens=160, chunked_prefill_size=16, max_prefill_tokens=64,
                new_token_ratio_init=0.05, new_token_ratio_min=0.05, debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=LONG_PROMPTS, sampling_params=SP)
        stats = eng.get_stats()
        assert stats["num_retractions"] > 0, "the pool was meant to force retractions"
        # the C attention kernels take the sinks wherever this machine has them (else the torch path runs)
        assert stats["cpu"]["paths"]["decode_attention"].startswith("c:") == (cpu_ops.load() is not None)
        again = eng.generate(input_ids=LONG_PROMPTS[3], sampling_params=SP)
        first = eng.generate(input_ids=LONG_PROMPTS[3], sampling_params={**SP, "max_new_tokens": 1,
                                                                         "min_new_tokens": 1}, return_logprob=True)
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == want[3]
    assert again["meta_info"]["cached_tokens"] > 0
    with torch.no_grad():
        ref = model(torch.tensor([LONG_PROMPTS[3]])).logits[0, -1].log_softmax(-1)[want[3][0]].item()
    assert abs(first["meta_info"]["output_token_logprobs"][0][0] - ref) < 1e-4


def test_tp2_matches_transformers(checkpoint):
    """Two gloo ranks: query heads (and their sinks), KV heads and each expert's intermediate columns split; the
    o and down biases added once."""
    from radixlang_runtime import Engine

    path, _, want = checkpoint
    with Engine(str(path), dtype="float32", tp_size=2, max_total_tokens=1024) as eng:
        outs = eng.generate(input_ids=LONG_PROMPTS[:3], sampling_params=SP)
    assert [o["output_ids"] for o in outs] == want[:3]


BASE = {"architectures": ["GptOssForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 32,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_local_experts": 4, "num_experts_per_tok": 2}


def test_config_defaults_are_transformers():
    cfg = ModelConfig.from_dict(BASE)
    assert cfg.layer_windows == (128, 0, 128, 0)  # even layers slide, window 128
    assert cfg.attention_sinks and cfg.attention_bias
    assert (cfg.rope.rope_type, cfg.rope.factor, cfg.rope.theta, cfg.rope.truncate) == ("yarn", 32.0, 150000.0, False)
    assert cfg.rope.original_max_position_embeddings == 4096
    spec = cfg.moe
    assert (spec.num_experts, spec.top_k, spec.swiglu_limit, spec.swiglu_alpha) == (4, 2, 7.0, 1.702)
    assert spec.router_bias and spec.softmax_after_topk and spec.expert_bias
    layers = ModelConfig.from_dict({**BASE, "layer_types": [FULL, FULL, SLIDE, FULL], "sliding_window": 5})
    assert layers.layer_windows == (0, 0, 5, 0)
    renamed = {k: v for k, v in BASE.items() if k != "num_local_experts"}
    assert ModelConfig.from_dict({**renamed, "num_experts": 8}).moe.num_experts == 8  # transformers' alias
    # transformers never reads hidden_act for gpt-oss (the experts' activation is their own); training-only fields
    assert ModelConfig.from_dict({**BASE, "hidden_act": "gelu", "router_aux_loss_coef": 0.1,
                                  "attention_dropout": 0.1}).moe.swiglu_limit == 7.0


def test_hub_config_shape_is_read():
    """The shape of openai/gpt-oss-20b's config.json (its quantization_config left out: the bf16 conversions'),
    with the older rope_scaling + rope_theta spelling and fields transformers does not read."""
    hub = {"architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
           "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
           "initial_context_length": 4096, "intermediate_size": 2880, "max_position_embeddings": 131072,
           "layer_types": [SLIDE, FULL] * 12, "num_attention_heads": 64, "num_experts_per_tok": 4,
           "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": False,
           "pad_token_id": 199999, "rms_norm_eps": 1e-05, "rope_theta": 150000, "router_aux_loss_coef": 0.9,
           "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "truncate": False,
                            "original_max_position_embeddings": 4096, "rope_type": "yarn"},
           "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False, "vocab_size": 201088}
    cfg = ModelConfig.from_dict(hub)
    assert cfg.layer_windows == (128, 0) * 12 and cfg.eos_token_ids == (200002,)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (64, 8, 64)
    assert (cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.swiglu_alpha) == (32, 4, 1.702)
    assert (cfg.rope.rope_type, cfg.rope.theta, cfg.rope.truncate) == ("yarn", 150000.0, False)
    assert not ModelConfig.from_dict({**BASE, "attention_bias": False}).attention_bias


@pytest.mark.parametrize("extra,needle", [
    ({"quantization_config": {"quant_method": "mxfp4"}}, "quantization_config \\(mxfp4\\)"),
    ({"output_router_logits": True}, "output_router_logits"),
    ({"layer_types": ["chunked_attention"] * 4}, "layer_types entry 'chunked_attention'"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok 5"),
    ({"swiglu_limit": None}, "swiglu_limit"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "low_freq_factor": 1.0}}, "low_freq_factor"),
    ({"num_local_experts": 0}, "num_local_experts 0"),
])
def test_unhonoured_fields_are_refused_by_name(extra, needle):
    with pytest.raises(ValueError, match=needle):
        ModelConfig.from_dict({**BASE, **extra})


def test_sinks_are_refused_by_a_backend_without_them():
    from radixlang_runtime.model.layers.attention.base import AttentionBackend
    from radixlang_runtime.model.layers.attention.torch_backend import TorchAttentionBackend

    class NoSinks(AttentionBackend):  # a backend that does not declare supports_sinks
        def init_forward_metadata(self, fb):
            pass

        def forward_extend(self, q, k, v, layer, fb):
            pass

        def forward_decode(self, q, layer, fb):
            pass

    with pytest.raises(ValueError, match="attention sinks are not supported by the NoSinks"):
        NoSinks(4, 2, 16, 0.25).set_sinks(0, torch.zeros(4))
    with pytest.raises(ValueError, match=r"attention sinks of layer 0: expected shape \(4,\), got \(8,\)"):
        TorchAttentionBackend(4, 2, 16, 0.25).set_sinks(0, torch.zeros(8))


# ------------------------------------------------------------------------------------------ harmony
# the system / generation-prompt part of gpt-oss's chat template (the checkpoint's renders the same header)
HARMONY_TEMPLATE = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Reasoning: {{ reasoning_effort if reasoning_effort is defined else 'medium' }}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
    "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}")


@pytest.mark.parametrize("effort", ["low", "high"])
def test_reasoning_effort_reaches_the_template(effort):
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir
    from radixlang_runtime.server.chat_render import render_chat, template_kwargs

    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    body = {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": effort}
    text, _ = render_chat(tok, body["messages"], HARMONY_TEMPLATE, None, template_kwargs(body))
    assert f"Reasoning: {effort}\n" in text
    assert text.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")


def test_harmony_reasoning_then_tool_call():
    """The reasoning parser keeps a call's message whole in the content; the gpt-oss tool parser reads it there."""
    from radixlang_runtime.reasoning_parser import get_reasoning_parser
    from radixlang_runtime.tool_parsers import get_parser

    call = ('<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
            '{"city": "Tokyo"}<|call|>')
    out = get_reasoning_parser("gpt-oss").parse("<|channel|>analysis<|message|>Use get_weather.<|end|>" + call)
    assert out.reasoning == "Use get_weather."
    got = get_parser("gpt-oss").parse(out.content, ["get_weather"])
    assert [(c.name, json.loads(c.arguments)) for c in got.calls] == [("get_weather", {"city": "Tokyo"})]
    assert got.content == ""


def test_forced_call_may_follow_the_analysis_message():
    import re

    from radixlang_runtime.reasoning_parser import get_reasoning_parser
    from radixlang_runtime.server.openai_reasoning import ReasoningPlan

    prefix = ReasoningPlan(get_reasoning_parser("gpt-oss")).regex_prefix()
    call = r"<\|channel\|>commentary to=functions\.f <\|constrain\|>json<\|message\|>\{\}<\|call\|>"
    rx = re.compile(prefix + call)
    tail = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>"
    assert rx.fullmatch("<|channel|>analysis<|message|>Call f.<|end|><|start|>assistant" + tail)
    assert rx.fullmatch(tail)
    assert not rx.fullmatch("<think>x</think>" + tail)


def test_deterministic_mode_is_refused_by_name():
    from types import SimpleNamespace

    from radixlang_runtime.model.executor import deterministic

    with pytest.raises(ValueError, match="GptOssForCausalLM's expert GEMMs .* not batch-invariant"):
        deterministic.enable(SimpleNamespace(cfg=ModelConfig.from_dict(BASE)), None, None, torch.device("cpu"),
                             torch.float32)


def test_bfloat16_runs(checkpoint):
    """bf16: the packed experts carry their biases (pack_experts), the kernels the sinks."""
    from radixlang_runtime import Engine

    path, _, _ = checkpoint
    with Engine(str(path), dtype="bfloat16", max_total_tokens=512, chunked_prefill_size=16) as eng:
        outs = eng.generate(input_ids=LONG_PROMPTS[:3], sampling_params={**SP, "max_new_tokens": 4,
                                                                        "min_new_tokens": 4})
    assert [len(o["output_ids"]) for o in outs] == [4] * 3
