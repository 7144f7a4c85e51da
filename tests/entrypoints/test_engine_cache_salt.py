"""Engine.generate's cache_salt: the prefix cache is shared within a salt only; outputs do not change."""

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
