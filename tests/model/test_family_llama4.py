"""Llama 4 text (models/llama4.py) end to end: a tiny random checkpoint written by transformers (chunked local
attention in chunks of 8 on the RoPE layers, a NoPE layer with temperature tuning, L2 qk norm, MoE layers
interleaved with dense ones), served in float32 greedy token for token against transformers with prompts longer
than a chunk and a prefill chunk, a pool tight enough to retract, a radix-cache hit and the allocator checked
after every step; the attention backend's chunk masks against a direct reference on every path; what is not
implemented refused by name."""

from __future__ import annotations

import pytest

from radixlang_runtime.model.loader.config import ModelConfig
from test_model_families import assert_windowed_parity

LLAMA4 = dict(hidden_size=64, intermediate_size=32, intermediate_size_mlp=128, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
              interleave_moe_layer_step=2, bos_token_id=1, eos_token_id=2, initializer_range=0.1,
              tie_word_embeddings=False)
FULL = ["full_attention"] * 4


@pytest.mark.parametrize("kwargs,contrasts", [
    # layers 0-2 RoPE + chunks of 8, layer 3 NoPE (temperature tuning from position 3 on), experts top-1
    ({"attention_chunk_size": 8, "floor_scale": 4, "attn_scale": 0.5},
     [{"layer_types": FULL}, {"attn_temperature_tuning": False}]),
    # chunks of 12, top-2 routing, every layer MoE, no qk norm (the contrasts above show the chunks count)
    ({"attention_chunk_size": 12, "num_experts_per_tok": 2, "interleave_moe_layer_step": 1, "use_qk_norm": False,
      "floor_scale": 8, "attn_scale": 0.3}, []),
], ids=["chunk8_top1", "chunk12_top2"])
def test_llama4_matches_transformers(kwargs, contrasts, tmp_path):
    assert_windowed_parity(tmp_path, "Llama4TextConfig", kwargs, contrasts, tiny=LLAMA4)
    parsed = ModelConfig.from_dir(str(tmp_path))
    assert parsed.architecture == "Llama4ForCausalLM" and parsed.model_impl == "native"
    assert parsed.layer_chunks[:3] == (kwargs["attention_chunk_size"],) * 3 and parsed.layer_chunks[3] == 0


def test_llama4_on_the_triton_backend_matches_transformers(tmp_path):
    """The Triton kernels' chunked attention (interpreted on CPU): prompts longer than the chunk of 8 and than a
    prefill chunk, a radix-cache hit whose cached prefix crosses chunk boundaries, decode past several chunks."""
    pytest.importorskip("triton")
    from radixlang_runtime import Engine
    from test_model_families import LONG_PROMPTS
    from tiny_checkpoints import build_tiny, hf_greedy

    model = build_tiny(tmp_path, "Llama4TextConfig", LLAMA4, {"max_position_embeddings": 256,
                                                                "attention_chunk_size": 8})
    prompts, new = LONG_PROMPTS[1:4:2], 10  # 37 and 44 tokens
    want = [hf_greedy(model, p, new) for p in prompts]
    sp = {"max_new_tokens": new, "min_new_tokens": new, "temperature": 0}
    with Engine(str(tmp_path), dtype="float32", attention_backend="triton", max_total_tokens=512,
                chunked_prefill_size=16, page_size=1, debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=prompts, sampling_params=sp)
        again = eng.generate(input_ids=prompts[1] + [5, 6, 7], sampling_params=sp)
    assert [o["output_ids"] for o in outs] == want
    assert again["meta_info"]["cached_tokens"] >= len(prompts[1])
    assert again["output_ids"] == hf_greedy(model, prompts[1] + [5, 6, 7], new)


def chunk_reference(q, k_pool, v_pool, slots, prefix, n, chunk, scale):
    """One request's attention in plain torch: query j (position prefix + j) over keys [p - p % chunk, p]."""
    import torch

    H, hkv = q.shape[1], k_pool.shape[0]
    out = []
    for j in range(n):
        p = prefix + j
        keys = slots[p - p % chunk: p + 1]
        k = k_pool[:, keys].repeat_interleave(H // hkv, 0)  # [H, L, D]
        v = v_pool[:, keys].repeat_interleave(H // hkv, 0)
        w = torch.softmax((k @ q[j].unsqueeze(-1)).squeeze(-1) * scale, -1)  # [H, L]
        out.append((w.unsqueeze(-1) * v).sum(1))
    return torch.stack(out)  # [n, H, D]


@pytest.mark.parametrize("path", ["torch", "c", "triton"])
@pytest.mark.parametrize("prefix_lens,extend_lens", [([0, 0], [13, 20]), ([5, 17, 0], [9, 1, 4]),
                                                     ([7, 16, 30], [1, 1, 1])])
def test_chunk_masks_on_every_path(prefix_lens, extend_lens, path):
    import torch

    from radixlang_kernels import cpu_ops
    from radixlang_runtime.mem.kv_pool import KVPool
    from radixlang_runtime.model.layers.attention.torch_backend import TorchAttentionBackend
    from radixlang_runtime.model.executor.forward_batch import ForwardBatch

    H, hkv, D, chunk = 4, 2, 16, 8
    g = torch.Generator().manual_seed(0)
    pool = KVPool(256, 1, hkv, D, torch.float32, torch.device("cpu"), 4, 64)
    pool.k_buffers[0].copy_(torch.randn(hkv, 256, D, generator=g))
    pool.v_buffers[0].copy_(torch.randn(hkv, 256, D, generator=g))
    slots, out_loc, start = [], [], 3
    for row, (p, n) in enumerate(zip(prefix_lens, extend_lens)):
        s = torch.arange(start, start + p + n) * 2 % 256  # scattered slots
        pool.req_to_token[row, : p + n] = s
        slots.append(s)
        out_loc.append(s[p:])
        start += p + n
    T = sum(extend_lens)
    q = torch.randn(T, H, D, generator=g)
    k = torch.randn(T, hkv, D, generator=g)
    v = torch.randn(T, hkv, D, generator=g)
    seq = [p + n for p, n in zip(prefix_lens, extend_lens)]
    decode = all(n == 1 for n in extend_lens)
    fb = ForwardBatch(phase="decode" if decode else "extend", batch_size=len(seq), input_ids=torch.zeros(T).long(),
                      positions=torch.cat([torch.arange(p, p + n) for p, n in zip(prefix_lens, extend_lens)]),
                      out_loc=torch.cat(out_loc), req_rows=torch.arange(len(seq)), seq_lens=torch.tensor(seq),
                      seq_lens_cpu=seq, prefix_lens_cpu=prefix_lens, extend_lens_cpu=extend_lens, kv_pool=pool)
    if path == "triton":  # interpreted on CPU
        pytest.importorskip("triton")
        from radixlang_runtime.model.layers.attention.triton_backend import TritonAttentionBackend

        backend = TritonAttentionBackend(H, hkv, D, D ** -0.5)
    else:
        backend = TorchAttentionBackend(H, hkv, D, D ** -0.5)
    backend.set_layer_chunks((chunk,))
    if path == "c":
        paths = cpu_ops.plan(torch.device("cpu"), torch.float32, D, H, hkv, packed_linears=False)
        backend.configure(paths)
        assert (backend.c_decode, backend.c_extend) == (paths.c_decode, paths.c_extend)
    backend.init_forward_metadata(fb)
    got = backend.forward(q, k, v, 0, fb).view(T, H, D)
    s0 = 0
    for i, (p, n) in enumerate(zip(prefix_lens, extend_lens)):
        ref = chunk_reference(q[s0:s0 + n], pool.k_buffers[0], pool.v_buffers[0], slots[i], p, n, chunk, D ** -0.5)
        torch.testing.assert_close(got[s0:s0 + n], ref, atol=1e-5, rtol=1e-5)
        s0 += n


def test_a_backend_without_chunks_refuses_them():
    from radixlang_runtime.model.layers.attention.base import AttentionBackend

    class NoChunks(AttentionBackend):
        def init_forward_metadata(self, fb):
            pass

        def forward_extend(self, q, k, v, layer, fb):
            pass

        def forward_decode(self, q, layer, fb):
            pass

    backend = NoChunks(4, 2, 16, 0.25)
    backend.set_layer_chunks((0, 0))  # none: accepted
    with pytest.raises(ValueError, match=r"the NoChunks attention backend does not implement chunked local attention "
                                         r"\(attention_chunk_size 8\): use --attention-backend torch"):
        backend.set_layer_chunks((8, 0))


BASE = {"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 32, "intermediate_size_mlp": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4}


@pytest.mark.parametrize("extra,needle", [
    ({"attention_bias": True}, "attention_bias true is not supported"),
    ({"layer_types": ["sliding_attention"] * 4}, "layer_types .* is not supported"),
    ({"no_rope_layers": [1, 0]}, "no_rope_layers has 2 entries for 4 layers"),
    ({"attention_chunk_size": 0}, "attention_chunk_size 0 must be a positive"),
    ({"output_router_logits": True}, "output_router_logits true is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"text_config": {}}, "Llama4ForCausalLM: config.json has a text_config .* must be Llama4ForConditionalGeneration"),
])
def test_unhonoured_llama4_fields_are_refused(extra, needle):
    from radixlang_runtime.model.models.llama4 import parse_llama4

    with pytest.raises(ValueError, match=needle):
        parse_llama4({**BASE, **extra})


def test_the_multimodal_checkpoint_serves_its_text_model(tmp_path):
    """Llama4ForConditionalGeneration: text_config and the language_model. weights (the vision tower is not
    loaded), greedy token for token against transformers' multimodal class on text prompts."""
    import torch
    from transformers import AutoTokenizer, Llama4Config, Llama4ForConditionalGeneration

    from radixlang_runtime import Engine
    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir
    from tiny_checkpoints import hf_greedy

    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    text = {**LLAMA4, "vocab_size": len(tok), "attention_chunk_size": 8, "max_position_embeddings": 256}
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=28,
                  patch_size=14, projector_input_dim=64, projector_output_dim=64, vision_output_dim=64)
    n = len(tok)
    cfg = Llama4Config(text_config=text, vision_config=vision, image_token_index=n - 1, boi_token_index=n - 3,
                       eoi_token_index=n - 2)
    torch.manual_seed(0)
    model = Llama4ForConditionalGeneration(cfg).eval()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    prompts = [[(i * 131 + 7 * j) % 40000 + 100 for i in range(k)] for j, k in enumerate((21, 34))]
    want = [hf_greedy(model, p, 10) for p in prompts]
    assert ModelConfig.from_dir(str(tmp_path)).architecture == "Llama4ForConditionalGeneration"
    sp = {"max_new_tokens": 10, "min_new_tokens": 10, "temperature": 0}
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=512, chunked_prefill_size=16,
                debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=prompts, sampling_params=sp)
        again = eng.generate(input_ids=prompts[1], sampling_params=sp)
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == want[1] and again["meta_info"]["cached_tokens"] > 0
