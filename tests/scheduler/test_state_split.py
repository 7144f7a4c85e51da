"""Hybrid models' state snapshots where prompts diverge (scheduler/state_cache.py split_at, admission's
in-round split): conversations sharing a 2-page system prompt with different user turns. A prompt that leaves
a cached path inside a node without a snapshot ends a prefill chunk at the shared prefix's last page boundary
and saves its state there, so the next conversation continues from it; prompts of one admission round do the
same for each other. Greedy outputs equal transformers (float32) token for token; pools whole after."""

from __future__ import annotations

import pytest

from tiny_checkpoints import build_tiny, hf_greedy

PAGE = 16
NEW = 5
SYSTEM = list(range(300, 337))  # 37 tokens: two whole pages (32) and a part
TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            bos_token_id=1, eos_token_id=2, initializer_range=0.3, max_position_embeddings=512,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, intermediate_size=96,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}


def _turn(seed: int, system: list[int] = SYSTEM) -> list[int]:
    """system + a 20-token user turn (its prompt end, 57, snapshots at 48: past the shared 32)."""
    return system + [1000 + 37 * seed + k for k in range(20)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_5")
    return path, build_tiny(path, "Qwen3_5TextConfig", TINY, {})


def _engine(path):
    from radixlang_runtime import Engine

    return Engine(str(path), dtype="float32", max_total_tokens=2048, page_size=PAGE, debug_check_integrity=True)


def test_a_second_conversation_snapshots_the_shared_system_prompt_for_the_next(tiny):
    path, model = tiny
    prompts = [_turn(i) for i in range(3)]
    with _engine(path) as eng:
        outs = [eng.generate(input_ids=p, sampling_params=SP) for p in prompts]
        assert [o["output_ids"] for o in outs] == [hf_greedy(model, p, NEW) for p in prompts]
        cached = [o["meta_info"]["cached_tokens"] for o in outs]
        # the first holds snapshots at 48 only (its prompt's end, its finish): the second's K/V matches 32 tokens
        # but its state none; it computes them in a chunk of their own and saves the state at 32 for the third
        assert cached == [0, 0, len(SYSTEM) // PAGE * PAGE]
        eng.check_integrity()
        stats = eng.get_stats()["state_pool"]
    assert stats["snapshot_splits"] == 1


def test_conversations_of_one_round_share_the_system_prompt_state(tiny):
    path, model = tiny
    system = list(range(600, 637))
    prompts = [_turn(i, system) for i in range(2)]
    with _engine(path) as eng:
        outs = eng.generate(input_ids=prompts, sampling_params=SP)
        assert [o["output_ids"] for o in outs] == [hf_greedy(model, p, NEW) for p in prompts]
        # the second waits a round for the first, which ends a chunk at the shared prefix's last page boundary
        assert outs[1]["meta_info"]["cached_tokens"] >= len(system) // PAGE * PAGE
        eng.check_integrity()
        stats = eng.get_stats()["state_pool"]
    assert stats["snapshot_splits"] == 1
