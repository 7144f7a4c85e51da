"""Engine.generate's cache_salt: the prefix cache is shared within a salt only (a list of prompts takes a salt per
prompt); outputs do not change."""

from __future__ import annotations

import uuid

import pytest

GREEDY = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}


def test_engine_cache_salt_isolates_the_prefix_cache(engine):
    text = f"Entry {uuid.uuid4().hex}: the river bends twice before it reaches the sea, and the town on its bank " \
           "keeps a ferry that crosses each hour from dawn until the last light fades."
    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    outs = [engine.generate(text, GREEDY, cache_salt=s) for s in (a, a, b, None)]
    cached = [o["meta_info"]["cached_tokens"] for o in outs]
    assert cached[0] == 0 and cached[2] == 0 and cached[3] == 0, cached
    assert cached[1] > outs[1]["meta_info"]["prompt_tokens"] // 2, cached
    assert len({o["text"] for o in outs}) == 1
    with pytest.raises(ValueError, match="cache_salt"):
        engine.generate(text, GREEDY, cache_salt="")


def test_engine_salts_each_prompt_of_a_list(engine):
    text = f"Entry {uuid.uuid4().hex}: the lamp on the quay is lit at dusk, and the fishing boats steer by it past " \
           "the rocks until the tide turns and the harbour mouth opens to the sea."
    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    first = engine.generate(text, GREEDY, cache_salt=a)
    outs = engine.generate([text, text], GREEDY, cache_salt=[a, b])  # one call, a salt per prompt
    assert outs[0]["meta_info"]["cached_tokens"] > first["meta_info"]["prompt_tokens"] // 2
    assert outs[1]["meta_info"]["cached_tokens"] == 0
    assert {o["text"] for o in outs} == {first["text"]}
    with pytest.raises(ValueError, match="cache_salt has 1 entries for 2 prompts"):
        engine.generate([text, text], GREEDY, cache_salt=[a])
