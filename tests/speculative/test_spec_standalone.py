"""STANDALONE speculative decoding (a draft model; docs/SPECULATIVE.md): flags refused by name; tiny random
checkpoints through the Engine (draft = target: everything accepted; a 1-layer draft: identical greedy
text with stop strings, logprobs, a tight pool); the embedded model with its own Q4_1 blocks as the draft.
The scheduler with a fake draft model (FakeDraft): tests/speculative/test_spec_scheduler.py, shared with NGRAM."""

from __future__ import annotations

import pytest

from radixlang_kernels.cpu_caps import detect
from radixlang_runtime.server_args import ServerArgs

GGUF = "/nonexistent/draft.gguf"  # ServerArgs checks no paths


# ---------------------------------------------------------------------------------------------- flags
def test_flags_refused_by_name():
    with pytest.raises(ValueError, match="speculative_draft_model_path"):
        ServerArgs(speculative_algorithm="STANDALONE")
    with pytest.raises(ValueError, match="speculative_num_steps \\+ 1 = 4"):
        ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF,
                   speculative_num_steps=3, speculative_num_draft_tokens=6)
    with pytest.raises(ValueError, match="speculative_ngram_max_match_window_size"):
        ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF,
                   speculative_ngram_max_match_window_size=3)
    with pytest.raises(ValueError, match="speculative_draft_model_path set with speculative_algorithm NGRAM"):
        ServerArgs(speculative_algorithm="NGRAM", speculative_draft_model_path=GGUF)
    with pytest.raises(ValueError, match="speculative_num_steps set without speculative_algorithm"):
        ServerArgs(speculative_num_steps=2)
    with pytest.raises(ValueError, match="tp_size"):
        ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF, tp_size=2)
    with pytest.raises(ValueError, match="enable_hierarchical_cache"):
        ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF,
                   enable_hierarchical_cache=True)
    with pytest.raises(ValueError, match="speculative_draft_model_quantization"):
        ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF,
                   speculative_draft_model_quantization="awq")
    det = ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF,
                     speculative_draft_model_quantization="gguf", enable_deterministic_inference=True)
    assert det.enable_deterministic_inference  # the draft runs without the mode (speculative/draft_model.py)
    with pytest.raises(ValueError, match="speculative_num_steps must be in"):
        ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF, speculative_num_steps=0)
    base = ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path=GGUF)
    assert base.speculative_chain_settings() == (3, 4, 0)
    assert base.replace(speculative_num_draft_tokens=6).speculative_chain_settings() == (5, 6, 0)


# ---------------------------------------------------------------------------------------------- tiny checkpoints
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3)
PROMPTS = [[(7 * i + 300 + 11 * s) % 4000 + 10 for i in range(20 + 9 * s)] for s in range(5)]
NEW = 24
DRAFT_SCALE = 0.5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-layer target and a draft of it whose last MLP is scaled by DRAFT_SCALE (close, not equal: it proposes
    the target's token often, not always), one vocabulary."""
    import torch
    from transformers import AutoTokenizer

    from tiny_checkpoints import build_tiny, with_config

    target, small = tmp_path_factory.mktemp("tiny_target"), tmp_path_factory.mktemp("tiny_draft")
    model = build_tiny(target, "LlamaConfig", TINY, {})
    draft = with_config(model, {})
    with torch.no_grad():
        draft.model.layers[-1].mlp.down_proj.weight.mul_(DRAFT_SCALE)
    draft.save_pretrained(small, safe_serialization=True)
    AutoTokenizer.from_pretrained(target).save_pretrained(small)
    return str(target), str(small), model


def _spec_engine(target: str, draft: str, **kw):
    from radixlang_runtime import Engine

    return Engine(target, dtype="float32", debug_check_integrity=True, speculative_algorithm="STANDALONE",
                  speculative_draft_model_path=draft, **kw)


def test_tiny_draft_equal_to_target_accepts_everything(tiny):
    """draft = target weights: every drafted token is accepted; the text is transformers' greedy one."""
    from conftest import assert_whole as engine_whole
    from tiny_checkpoints import hf_greedy

    target, _, model = tiny
    sp = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
    with _spec_engine(target, target, max_total_tokens=2048, speculative_num_steps=4) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=sp)
        for p, o in zip(PROMPTS, outs):
            assert o["output_ids"] == hf_greedy(model, p, NEW)
            assert o["meta_info"]["spec_draft_tokens"] > 0
            assert o["meta_info"]["spec_accepted_tokens"] == o["meta_info"]["spec_draft_tokens"]
        stats = eng.get_stats()
        assert stats["spec_accept_length"]["mean_accept_length"] > 3.0
        assert eng._loop.call(lambda s: s.runner.draft_model.copied) > 0  # verify steps reused the proposal's K/V
        engine_whole(eng)


def test_tiny_draft_steps_aside_then_catches_up(tiny):
    """While the batch is above --speculative-disable-by-batch-size the draft neither proposes nor mirrors (its
    slots are marked invalid); when the batch shrinks to the one long request, the draft first catches up the
    K/V it skipped (one extend) and its proposals (draft = target) are then all accepted: the caught-up K/V is
    the target's history. The text is transformers' greedy one; the KV whole after."""
    from conftest import assert_whole as engine_whole
    from tiny_checkpoints import hf_greedy

    target, _, model = tiny
    lens = [6, 6, 8, 10, 40]  # the last request decodes alone for its last 30 tokens
    with _spec_engine(target, target, max_total_tokens=2048, speculative_num_steps=3,
                      speculative_disable_by_batch_size=1) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=[
            {"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in lens])
        for p, n, o in zip(PROMPTS, lens, outs):
            assert o["output_ids"] == hf_greedy(model, p, n)
        long = outs[-1]["meta_info"]
        assert long["spec_draft_tokens"] >= 15  # drafted once alone (3 tokens a step over its last 30)
        assert long["spec_accepted_tokens"] == long["spec_draft_tokens"]
        assert sum(o["meta_info"]["spec_draft_tokens"] for o in outs[:-1]) == 0  # never alone: never drafted
        draft = eng.get_stats()["spec_draft_model"]
        assert draft["skipped_steps"] >= 5 and draft["caught_up_tokens"] >= 5  # batch > 1: not mirrored; then caught up
        assert draft["mirrored_steps"] > 0 and draft["proposals"] >= 5
        engine_whole(eng)


def test_tiny_small_draft_identical_with_stop_logprobs_and_a_tight_pool(tiny):
    """A perturbed draft (partly rejected): greedy ids, stop strings and logprobs as without speculation;
    a pool too small for the batch retracts, drafts dropped first; the KV whole after."""
    from conftest import assert_whole as engine_whole
    from radixlang_runtime import Engine

    target, small, _ = tiny
    sp = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
    kw = {"return_logprob": True, "top_logprobs_num": 2}
    with Engine(target, dtype="float32", max_total_tokens=2048) as off:
        want = off.generate(input_ids=PROMPTS, sampling_params=sp, **kw)
        stop = off.tokenizer.decode(want[1]["output_ids"][10:12])  # text the output reaches late
        want_stop = off.generate(input_ids=PROMPTS[1], sampling_params={**sp, "stop": [stop]})
    assert want_stop["meta_info"]["finish_reason"]["type"] == "stop"
    with _spec_engine(target, small, max_total_tokens=2048) as eng:
        got = eng.generate(input_ids=PROMPTS, sampling_params=sp, **kw)
        for a, b in zip(want, got):
            assert b["output_ids"] == a["output_ids"]
            la, lb = a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]
            assert [t for _, t, _ in lb] == [t for _, t, _ in la]
            for (va, _, _), (vb, _, _) in zip(la, lb):
                assert vb is not None and vb == pytest.approx(va, abs=1e-4)
        assert sum(o["meta_info"]["spec_accepted_tokens"] for o in got) > 0
        assert sum(o["meta_info"]["spec_accepted_tokens"] for o in got) < sum(
            o["meta_info"]["spec_draft_tokens"] for o in got)  # the small draft is sometimes wrong
        b = eng.generate(input_ids=PROMPTS[1], sampling_params={**sp, "stop": [stop]})
        assert b["text"] == want_stop["text"] and b["output_ids"] == want_stop["output_ids"]
        assert b["meta_info"]["finish_reason"] == want_stop["meta_info"]["finish_reason"]
        engine_whole(eng)
    many = [p + [11 * j % 4000 + 10] for j in range(13) for p in PROMPTS][:64]  # 64 prompts
    sp = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    with Engine(target, dtype="float32", max_total_tokens=8192) as off:
        want = off.generate(input_ids=many, sampling_params=sp)
    with _spec_engine(target, small, max_total_tokens=1280, page_size=16) as eng:
        got = eng.generate(input_ids=many, sampling_params=sp)
        assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
        stats = eng.get_stats()
        assert stats["num_retractions"] > 0 and stats["spec_accepted_tokens"] > 0
        engine_whole(eng)


@pytest.mark.skipif(detect().compiler is None, reason="the deterministic mode needs the C kernels")
def test_tiny_small_draft_identical_in_the_deterministic_mode_on_a_tight_pool(tiny):
    """--enable-deterministic-inference (float32) on the target, the perturbed draft without it: 64 greedy requests
    on a pool that retracts give exactly the tokens of the same mode without speculation."""
    from conftest import assert_whole as engine_whole
    from radixlang_runtime import Engine

    target, small, _ = tiny
    many = [p + [13 * j % 4000 + 10] for j in range(13) for p in PROMPTS][:64]
    sp = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    try:
        off = Engine(target, dtype="float32", max_total_tokens=8192, enable_deterministic_inference=True)
    except ValueError as e:  # a CPU whose float32 linears move with the batch (model/executor/deterministic.py's probe)
        if "is refused" in str(e):
            pytest.skip(f"the deterministic mode is refused on this CPU: {e}")
        raise
    with off:
        want = off.generate(input_ids=many, sampling_params=sp)
    with _spec_engine(target, small, max_total_tokens=1280, page_size=16, enable_deterministic_inference=True) as eng:
        assert not eng._loop.call(lambda s: s.runner.draft_model.runner.args.enable_deterministic_inference)
        got = eng.generate(input_ids=many, sampling_params=sp)
        stats = eng.get_stats()
        assert stats["num_retractions"] > 0 and stats["spec_accepted_tokens"] > 0
        engine_whole(eng)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]


def test_server_flags_counters_and_metrics(tiny):
    """The CLI flags through a real server (tiny target, draft = target): meta_info, /metrics (also under
    SGLang's name), /server_info."""
    import httpx

    from server_utils import ServerProcess

    target, _, _ = tiny
    srv = ServerProcess("--model-path", target, "--dtype", "float32", "--max-total-tokens", "2048",
                        "--enable-metrics", "--debug-check-integrity", "--speculative-algorithm", "STANDALONE",
                        "--speculative-draft-model-path", target, "--speculative-num-steps", "2")
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            r = c.post("/generate", json={"input_ids": PROMPTS[0],
                                          "sampling_params": {"temperature": 0, "max_new_tokens": 12,
                                                              "ignore_eos": True}})
            assert r.status_code == 200, r.text
            meta = r.json()["meta_info"]
            assert meta["spec_accepted_tokens"] == meta["spec_draft_tokens"] > 0
            lines = c.get("/metrics").text.splitlines()
            value = float(next(x for x in lines if x.startswith("radixlang:spec_accept_length ")).split()[1])
            assert value == pytest.approx(3.0, abs=0.5)  # 2 steps, all accepted: ~3 tokens a step (tail shorter)
            assert any(x.startswith("sglang:spec_accept_length{") for x in lines)
            info = c.get("/server_info").json()
            assert info["speculative_algorithm"] == "STANDALONE" and info["speculative_num_steps"] == 2
    finally:
        assert srv.stop() in (0, 143), srv.tail()


@pytest.mark.slow
def test_q4_1_self_draft_on_the_embedded_model(engine):
    """The embedded model in float32, drafted by its own .gguf's Q4_1 blocks: greedy ids, stop strings and
    logprobs as without speculation; nearly every draft token accepted (the same weights, quantized)."""
    from conftest import assert_whole as engine_whole
    from radixlang_runtime import Engine
    from radixlang_runtime.model.loader.resolve import embedded_gguf_path
    from test_spec_ngram import COPY, PROMPTS as TEXTS

    sp = {"temperature": 0, "max_new_tokens": 32}
    kw = {"return_logprob": True, "top_logprobs_num": 2}
    stop = {**sp, "max_new_tokens": 48, "stop": ["kiwi"]}
    want, want_stop = engine.generate(TEXTS, sp, **kw), engine.generate(COPY, stop)
    with Engine(dtype="float32", max_total_tokens=4096, debug_check_integrity=True,
                speculative_algorithm="STANDALONE", speculative_draft_model_path=embedded_gguf_path(),
                speculative_draft_model_quantization="gguf") as eng:
        got = eng.generate(TEXTS, sp, **kw)
        for a, b in zip(want, got):
            assert b["output_ids"] == a["output_ids"] and b["text"] == a["text"]
            la, lb = a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]
            for (va, ta, _), (vb, tb, _) in zip(la, lb):
                assert tb == ta and vb == pytest.approx(va, abs=1e-3)
        regex = {**sp, "regex": "(apple|banana|cherry), (kiwi|lemon)[.]"}  # jump-forward stays theirs
        assert eng.generate(COPY, regex)["text"] == engine.generate(COPY, regex)["text"]
        b = eng.generate(COPY, stop)
        assert b["text"] == want_stop["text"] and b["meta_info"]["finish_reason"] == want_stop["meta_info"][
            "finish_reason"]
        stats = eng.get_stats()
        assert stats["spec_accepted_tokens"] > 0.8 * stats["spec_draft_tokens"]
        assert stats["spec_accept_length"]["mean_accept_length"] > 2.5
        engine_whole(eng)
