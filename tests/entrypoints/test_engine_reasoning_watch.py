"""The reasoning watch in-process (float32 Engine, the embedded SmolLM2, `reasoning_parser="deepseek-r1"`, so the
output starts inside the reasoning block): a thinking budget gives the first B greedy tokens, the end marker as
the tokenizer encodes it, then greedy decoding from that text (checked token for token against the shared
float32 Engine without a parser), a budget holds a JSON schema until the marker; a budget on an Engine without
a reasoning parser is refused by name; the allocator whole after."""

from __future__ import annotations

import json

import pytest

from conftest import PROMPTS, assert_whole, running_engine

SCHEMA = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})


@pytest.fixture(scope="module")
def engine_r1():
    yield from running_engine(dtype="float32", max_total_tokens=4096, debug_check_integrity=True,
                              reasoning_parser="deepseek-r1")


def test_a_budget_and_its_held_grammar_in_process(engine_r1, engine_fp32):
    end = engine_fp32.tokenizer.encode("</think>", add_special_tokens=False)
    ids = engine_fp32.tokenizer.encode(PROMPTS[2])
    greedy = {"temperature": 0}
    head = engine_fp32.generate(input_ids=ids, sampling_params={**greedy, "max_new_tokens": 4})["output_ids"] + end
    tail = engine_fp32.generate(input_ids=ids + head, sampling_params={**greedy, "max_new_tokens": 16 - len(head)})
    got = engine_r1.generate(input_ids=ids, sampling_params={**greedy, "max_new_tokens": 16,
                                                             "thinking_token_budget": 4})
    assert got["output_ids"] == head + tail["output_ids"]
    answer = engine_fp32.generate(input_ids=ids + head, sampling_params={
        **greedy, "max_new_tokens": 16, "json_schema": SCHEMA})
    held = engine_r1.generate(input_ids=ids, sampling_params={
        **greedy, "max_new_tokens": 16 + len(head), "thinking_token_budget": 4, "json_schema": SCHEMA})
    assert held["output_ids"] == head + answer["output_ids"]
    assert json.loads(answer["text"]).keys() == {"n"}
    with pytest.raises(ValueError, match="without --reasoning-parser"):
        engine_fp32.generate(PROMPTS[0], {"max_new_tokens": 2, "thinking_token_budget": 1})
    assert_whole(engine_r1)
    assert_whole(engine_fp32)
