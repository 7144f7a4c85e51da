"""NEXTN speculative decoding (the checkpoint's multi-token-prediction layer drafts; docs/SPECULATIVE.md): a tiny
random DeepSeek V3 written by transformers, with a prediction layer (model.layers.3.*) added to its safetensors.

The layer's predictions are checked against a reference built from transformers' own code: a one-layer
DeepseekV3ForCausalLM holding the layer's decoder block, final norm and head, run on
inputs_embeds = eh_proj([enorm(embed(t_{i+1})), hnorm(h_i)]) over transformers' last_hidden_state h. With one draft
token per step, the tokens the engine accepts follow from those predictions alone, so the accepted counts must equal
the reference's, request by request; with three, the chain runs and the text is unchanged. Greedy text equals
transformers' in every case, through chunked prefills, a radix-cache hit and a pool that retracts; the KV whole after.
"""

from __future__ import annotations

import pytest
import torch

from radixlang_runtime.server_args import ServerArgs
from tiny_checkpoints import HYBRID_CASES, HYBRID_TINY

COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, bos_token_id=1, eos_token_id=2,
              tie_word_embeddings=False, initializer_range=0.3, max_position_embeddings=256, n_routed_experts=8,
              num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
              num_nextn_predict_layers=1)
# name -> (transformers config class, its fields, the reference's one-layer config, the checkpoint's layout):
# DeepSeek V3 (multi-head latent attention) and GLM-4.5 (GQA with partial rotary, q / k norms and biases), each with
# DeepSeek's MoE blocks, their layer at model.layers.3; Qwen3-Next (hybrid: Gated DeltaNet and gated attention, MoE
# with a gated shared expert) and Qwen3.5 (its dense MLPs), the layer under mtp.* with zero-centred norms
FAMILIES = {
    "deepseek_v3": ("DeepseekV3Config", {**COMMON, **dict(
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=12, n_group=4, topk_group=2)},
        {"num_hidden_layers": 1, "first_k_dense_replace": 0}, "nextn"),
    "glm4_moe": ("Glm4MoeConfig", {**COMMON, **dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, n_group=2, topk_group=1, use_qk_norm=True,
        attention_bias=True)}, {"num_hidden_layers": 1, "first_k_dense_replace": 0}, "nextn"),
    "qwen3_next": ("Qwen3NextConfig", {**HYBRID_TINY, **HYBRID_CASES["qwen3_next"][1], "tie_word_embeddings": False,
                                       "mtp_num_hidden_layers": 1},
                   {"num_hidden_layers": 1, "layer_types": ["full_attention"], "mlp_only_layers": []}, "mtp"),
    "qwen3_5": ("Qwen3_5TextConfig", {**HYBRID_TINY, **HYBRID_CASES["qwen3_5"][1], "tie_word_embeddings": False,
                                      "mtp_num_hidden_layers": 1},
                {"num_hidden_layers": 1, "layer_types": ["full_attention"]}, "mtp"),
}
PROMPTS = [[(i * 131 + 7 * j) % 40000 + 100 for i in range(n)] for j, n in enumerate((20, 37, 44, 9, 26))]
NEW = 24
TARGET_SCALE = 0.01
SHRUNK = ("o_proj", "down", "out_proj")  # the blocks' output projections (attention, MLP / experts, DeltaNet)
HIDDEN_MIX = 0.03


def test_flags_refused_by_name():
    with pytest.raises(ValueError, match="speculative_draft_model_path set with speculative_algorithm NEXTN"):
        ServerArgs(speculative_algorithm="NEXTN", speculative_draft_model_path="/x")
    with pytest.raises(ValueError, match="separate EAGLE draft heads"):
        ServerArgs(model_path="/m", speculative_algorithm="EAGLE", speculative_draft_model_path="/x")
    with pytest.raises(ValueError, match="speculative_eagle_topk 2"):
        ServerArgs(speculative_algorithm="NEXTN", speculative_eagle_topk=2)
    with pytest.raises(ValueError, match="speculative_eagle_topk set without speculative_algorithm"):
        ServerArgs(speculative_eagle_topk=1)
    with pytest.raises(ValueError, match="speculative_eagle_topk set with speculative_algorithm NGRAM"):
        ServerArgs(speculative_algorithm="NGRAM", speculative_eagle_topk=1)
    with pytest.raises(ValueError, match="speculative_num_draft_tokens must be speculative_num_steps \\+ 1 = 2"):
        ServerArgs(speculative_algorithm="NEXTN", speculative_num_steps=1, speculative_num_draft_tokens=4)
    with pytest.raises(ValueError, match="NEXTN with tp_size > 1"):
        ServerArgs(speculative_algorithm="NEXTN", tp_size=2)
    # SGLang's spelling for DeepSeek V3: EAGLE, topk 1, no draft path (or the target's own)
    args = ServerArgs(model_path="/m", speculative_algorithm="EAGLE", speculative_draft_model_path="/m",
                      speculative_num_steps=1, speculative_eagle_topk=1, speculative_num_draft_tokens=2)
    assert args.speculative_algorithm == "NEXTN" and args.speculative_draft_model_path is None
    assert args.speculative_chain_settings() == (1, 2, 0)


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def tiny(request, tmp_path_factory):
    """(directory, the decoder, the prediction layer's reference model, its enorm / hnorm / eh_proj weights)."""
    import transformers
    from safetensors.torch import load_file, save_file

    from tiny_checkpoints import REFERENCE_ATTENTION, build_tiny

    cls_name, fields, one_layer, layout = FAMILIES[request.param]
    path = tmp_path_factory.mktemp(f"tiny_nextn_{request.param}")
    model = build_tiny(path, cls_name, fields, {})
    torch.manual_seed(1)
    with torch.no_grad():
        for m in model.modules():  # a correction bias that moves the routing (transformers initialises zeros)
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.copy_(torch.randn_like(m.e_score_correction_bias) * 0.5)
        for name, p in model.named_parameters():  # blocks that mostly carry the token through: the next token
            if any(k in name for k in SHRUNK):  # depends on the last one most, which the layer can learn
                p.mul_(TARGET_SCALE)
    model.save_pretrained(path, safe_serialization=True)
    # the layer: its own block (MoE), shrunk too, and the decoder's head: it proposes the token the decoder would
    # write after the token it reads, so some drafts are accepted and some are not
    cfg = getattr(transformers, cls_name)(**{**model.config.to_dict(), **one_layer})
    torch.manual_seed(2)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32,
                                                         attn_implementation=REFERENCE_ATTENTION).eval()
    h = fields["hidden_size"]
    centred = layout == "mtp"  # zero-centred norms: the checkpoint holds w, the norm multiplies by 1 + w
    with torch.no_grad():
        for name, p in ref.model.layers[0].named_parameters():
            if any(k in name for k in SHRUNK):
                p.mul_(TARGET_SCALE)
        for m in ref.modules():
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.copy_(torch.randn_like(m.e_score_correction_bias))
        ref.lm_head.weight.copy_(model.lm_head.weight)
        ref.model.norm.weight.copy_(0.02 * torch.randn(h) + (0.0 if centred else 1.0))
    extra = {"enorm": 1 + 0.02 * torch.randn(h), "hnorm": 1 + 0.1 * torch.randn(h),  # the multipliers
             "eh_proj": torch.cat([torch.eye(h) + 0.01 * torch.randn(h, h), HIDDEN_MIX * torch.randn(h, h)], dim=1)}
    tensors = load_file(str(path / "model.safetensors"))
    if layout == "nextn":
        own = layer = f"model.layers.{fields['num_hidden_layers']}."
        names = {"enorm": own + "enorm.weight", "hnorm": own + "hnorm.weight", "eh_proj": own + "eh_proj.weight",
                 "norm": own + "shared_head.norm.weight"}
        tensors[own + "shared_head.head.weight"] = ref.lm_head.weight.detach().clone()
        tensors[own + "embed_tokens.weight"] = model.model.embed_tokens.weight.detach().clone()
    else:
        own, layer = "mtp.", "mtp.layers.0."
        names = {"enorm": own + "pre_fc_norm_embedding.weight", "hnorm": own + "pre_fc_norm_hidden.weight",
                 "eh_proj": own + "fc.weight", "norm": own + "norm.weight"}
    for name, t in ref.state_dict().items():
        if name.startswith("model.layers.0."):
            tensors[layer + name[len("model.layers.0."):]] = t.contiguous()
    for key in ("enorm", "hnorm"):
        tensors[names[key]] = (extra[key] - 1 if centred else extra[key]).contiguous()
    tensors[names["eh_proj"]] = extra["eh_proj"].contiguous()
    tensors[names["norm"]] = ref.model.norm.weight.detach().clone()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return str(path), model, ref, extra


def _reference_logits(model, ref, extra, seq: list[int]) -> torch.Tensor:
    """[len(seq) - 1, V]: the layer's logits at each position i < len(seq) - 1 (the token it expects at i + 2)."""
    with torch.no_grad():
        ids = torch.tensor([seq])
        hidden = model.model(ids).last_hidden_state[0]  # after the final norm
        emb = model.model.embed_tokens(ids[0, 1:])
        x = torch.cat([_rms(emb, extra["enorm"]), _rms(hidden[:-1], extra["hnorm"])], dim=-1) @ extra["eh_proj"].T
        return ref(inputs_embeds=x[None]).logits[0]


def _predictions(model, ref, extra, seq: list[int]) -> list[int]:
    return _reference_logits(model, ref, extra, seq).argmax(-1).tolist()


def test_layer_logits_equal_the_reference(tiny):
    """The prediction layer's runner alone (NextNRunner over the checkpoint), one extend over a whole sequence with
    transformers' hidden states: its logits at every position are the reference's."""
    from radixlang_runtime.model.executor.runner import StepInputs
    from radixlang_runtime.speculative.nextn_draft import NextNRunner
    from tiny_checkpoints import hf_greedy

    path, model, ref, extra = tiny
    runner = NextNRunner(ServerArgs(model_path=path, dtype="float32", max_total_tokens=512, max_running_requests=2),
                         path)
    assert runner.cfg.num_hidden_layers == 1 and runner.cfg.linear_attn is None
    seq = PROMPTS[1] + hf_greedy(model, PROMPTS[1], NEW)
    n = len(seq)
    with torch.no_grad():
        runner.model.hidden_in = model.model(torch.tensor([seq])).last_hidden_state[0, :-1].clone()
    got = runner.run_step(StepInputs("extend", seq[1:], list(range(n - 1)), [0], [0], [n - 1], [], list(range(n - 1))))
    want = _reference_logits(model, ref, extra, seq)
    assert torch.allclose(got, want, atol=1e-3, rtol=0), (got - want).abs().max()  # float32 sums, other orders
    runner.model.hidden_in = None
    other = runner.run_step(StepInputs("extend", seq[1:], list(range(n - 1)), [0], [0], [n - 1], [], [n - 2]))
    assert not torch.allclose(other[0], want[-1], atol=1e-2)  # the hidden states matter (zeros: other logits)


def _accepted(pred: list[int], seq: list[int], prompt_len: int, new: int) -> tuple[int, int]:
    """(drafted, accepted) tokens of one greedy request with one draft token a step: the draft after the token at
    q is pred[q - 1], accepted when the next token is that; no draft once one token is left to produce."""
    q, drafted, accepted = prompt_len, 0, 0  # q: the position of the newest token
    while q - prompt_len + 1 < new:
        if new - (q - prompt_len + 1) - 1 >= 1:
            drafted += 1
            if seq[q + 1] == pred[q - 1]:
                accepted += 1
                q += 1
        q += 1
    return drafted, accepted


def _engine(path: str, **kw):
    from radixlang_runtime import Engine

    eng = Engine(path, dtype="float32", debug_check_integrity=True, speculative_algorithm="NEXTN", **kw)
    eng._loop.call(lambda s: setattr(s.drafts.drafter.cfg, "row_cost", 0.0))  # every draft verified: no cost rule
    return eng


def test_one_step_drafts_are_the_layers_predictions(tiny):
    """One draft token a step: greedy ids equal transformers'; each request's drafted and accepted counts equal the
    reference layer's (so every proposal was the layer's prediction there), some accepted and some not."""
    from conftest import assert_whole
    from tiny_checkpoints import hf_greedy

    path, model, ref, extra = tiny
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    counts = [_accepted(_predictions(model, ref, extra, p + w), p + w, len(p), NEW) for p, w in zip(PROMPTS, want)]
    total = sum(a for _, a in counts)
    assert 0 < total < sum(d for d, _ in counts)  # the reference accepts some drafts, not all
    sp = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
    with _engine(path, speculative_num_steps=1, max_total_tokens=2048, chunked_prefill_size=16,
                 max_prefill_tokens=64) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=sp)
        assert [o["output_ids"] for o in outs] == want
        got = [(o["meta_info"]["spec_draft_tokens"], o["meta_info"]["spec_accepted_tokens"]) for o in outs]
        assert got == counts
        again = eng.generate(input_ids=PROMPTS[2], sampling_params=sp)  # a radix-cache hit
        assert again["output_ids"] == want[2] and again["meta_info"]["cached_tokens"] > 0
        stats = eng.get_stats()["spec_draft_model"]
        assert stats["mirrored_steps"] > 0 and stats["proposals"] > 0
        # the layer's embedding and head are the decoder's modules (its checkpoint's copies are equal to them)
        assert eng._loop.call(lambda s: (s.runner.draft_model.runner.model.embed_tokens is s.runner.model.embed_tokens,
                                         s.runner.draft_model.runner.model.head is s.runner.model.head,
                                         s.runner.draft_model.runner.model.lm_head is s.runner.model.lm_head)) == (
            True, True, True)
        assert_whole(eng)


def test_three_step_chain_identical_on_a_pool_that_retracts(tiny):
    """Three draft tokens a step (the layer chained on its own hidden states): the same greedy ids, drafts accepted,
    on a pool small enough to retract; the KV whole after."""
    from conftest import assert_whole
    from tiny_checkpoints import hf_greedy

    path, model, _, _ = tiny
    many = [p + [11 * j % 4000 + 10] for j in range(4) for p in PROMPTS]  # 20 prompts
    want = [hf_greedy(model, p, NEW) for p in many]
    sp = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
    with _engine(path, speculative_num_steps=3, max_total_tokens=512, page_size=16, chunked_prefill_size=32,
                 new_token_ratio_init=0.05, new_token_ratio_min=0.05) as eng:
        outs = eng.generate(input_ids=many, sampling_params=sp)
        assert [o["output_ids"] for o in outs] == want
        stats = eng.get_stats()
        assert stats["num_retractions"] > 0, "the pool was meant to force retractions"
        assert stats["spec_accepted_tokens"] > 0
        assert max(o["meta_info"]["spec_accepted_tokens"] for o in outs) >= 2
        assert_whole(eng)


def test_refused_without_a_prediction_layer(tmp_path):
    """A checkpoint whose config has no prediction layer, and an architecture with none served, are refused by name."""
    from radixlang_runtime import Engine
    from tiny_checkpoints import build_tiny

    cls_name, fields, _, _ = FAMILIES["deepseek_v3"]
    build_tiny(tmp_path, cls_name, {**fields, "num_nextn_predict_layers": 0}, {})
    with pytest.raises(ValueError, match="num_nextn_predict_layers is 0"):
        Engine(str(tmp_path), dtype="float32", speculative_algorithm="NEXTN")
    llama = tmp_path / "llama"
    build_tiny(llama, "LlamaConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1), {})
    with pytest.raises(ValueError, match="LlamaForCausalLM has no multi-token-prediction layer"):
        Engine(str(llama), dtype="float32", speculative_algorithm="NEXTN")


@pytest.mark.parametrize("tiny", ["deepseek_v3"], indirect=True)
def test_server_with_sglangs_eagle_flags(tiny):
    """A real server started with SGLang's spelling for DeepSeek V3's MTP (EAGLE, one step, topk 1, two draft
    tokens): transformers' greedy ids, the counters in meta_info and /metrics, NEXTN in /server_info."""
    import httpx

    from server_utils import ServerProcess
    from tiny_checkpoints import hf_greedy

    path, model, ref, extra = tiny
    want = hf_greedy(model, PROMPTS[1], NEW)
    drafted, accepted = _accepted(_predictions(model, ref, extra, PROMPTS[1] + want), PROMPTS[1] + want,
                                  len(PROMPTS[1]), NEW)
    srv = ServerProcess("--model-path", path, "--dtype", "float32", "--max-total-tokens", "2048", "--enable-metrics",
                        "--debug-check-integrity", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
                        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2")
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            r = c.post("/generate", json={"input_ids": PROMPTS[1], "sampling_params": {
                "temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["output_ids"] == want
            assert (body["meta_info"]["spec_draft_tokens"], body["meta_info"]["spec_accepted_tokens"]) == (
                drafted, accepted)
            lines = c.get("/metrics").text.splitlines()
            assert any(x.startswith("radixlang:spec_accept_length ") for x in lines)
            info = c.get("/server_info").json()
            assert info["speculative_algorithm"] == "NEXTN" and info["speculative_num_steps"] == 1
    finally:
        assert srv.stop() in (0, 143), srv.tail()


def test_a_layer_copy_that_differs_is_not_shared():
    """NextNTensors: an own copy equal to the decoder's tensor is shared, one that differs (or the decoder's own
    name) is read as it is."""
    from radixlang_runtime.model.models.nextn import NextNLayer, NextNTensors

    class Tensors(dict):
        path = "/x"

        def get(self, name, rows=None, cols=None):
            return self[name]

    head = torch.arange(6.0).reshape(2, 3)
    own = "model.layers.3."
    same = NextNTensors(Tensors({"lm_head.weight": head, own + "shared_head.head.weight": head.clone(),
                                 "model.embed_tokens.weight": head}), NextNLayer(own, own))
    assert same.same_as_decoder("lm_head.weight") and same.same_as_decoder("model.embed_tokens.weight")
    other = NextNTensors(Tensors({"lm_head.weight": head, own + "shared_head.head.weight": head + 1}),
                        NextNLayer(own, own))
    assert not other.same_as_decoder("lm_head.weight")
    assert torch.equal(other.get("lm_head.weight"), head + 1)  # the layer reads its own head



@pytest.mark.parametrize("tiny", ["glm4_moe"], indirect=True)
def test_mixed_steps_logprobs_and_a_constrained_request_as_without_it(tiny):
    """Prefill chunks mixed with decodes (--enable-mixed-chunk), input and output logprobs, a regex request (drafted
    by its grammar, never by the layer) beside drafted ones: ids and logprobs as without speculation; KV whole."""
    from conftest import assert_whole
    from radixlang_runtime import Engine

    path = tiny[0]
    sp = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
    kw = {"return_logprob": True, "logprob_start_len": 3, "top_logprobs_num": 2}
    common = dict(max_total_tokens=2048, chunked_prefill_size=16, enable_mixed_chunk=True)
    with Engine(path, dtype="float32", debug_check_integrity=True, **common) as off:
        want = off.generate(input_ids=PROMPTS, sampling_params=sp, **kw)
    with _engine(path, speculative_num_steps=2, **common) as eng:
        got = eng.generate(input_ids=PROMPTS, sampling_params=sp, **kw)
        for a, b in zip(want, got):
            assert b["output_ids"] == a["output_ids"]
            for key in ("input_token_logprobs", "output_token_logprobs"):
                la, lb = a["meta_info"][key], b["meta_info"][key]
                assert [t for _, t, _ in lb] == [t for _, t, _ in la]
                assert [v for v, _, _ in lb] == pytest.approx([v for v, _, _ in la], abs=1e-4)
        assert sum(o["meta_info"]["spec_draft_tokens"] for o in got) > 0
        regex = {"temperature": 0, "max_new_tokens": 12, "regex": "(yes|no), [0-9]{3}"}
        texts = eng.generate(input_ids=[PROMPTS[0], PROMPTS[3]], sampling_params=[regex, sp])
        assert texts[0]["meta_info"]["spec_draft_tokens"] == 0  # the layer never drafts for a constrained request
        with Engine(path, dtype="float32", **common) as off:
            alone = off.generate(input_ids=[PROMPTS[0], PROMPTS[3]], sampling_params=[regex, sp])
        assert [o["output_ids"] for o in texts] == [o["output_ids"] for o in alone]
        assert_whole(eng)
