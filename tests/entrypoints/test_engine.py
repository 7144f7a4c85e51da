"""The in-process Engine on the real model: API shapes, streaming, concurrency, errors."""

from __future__ import annotations

import re
import threading
import time

import pytest

from conftest import PROMPTS, wait_idle

GREEDY = {"temperature": 0, "max_new_tokens": 16}


def test_single_and_batch_shapes(engine):
    one = engine.generate(PROMPTS[0], GREEDY)
    assert set(one) == {"text", "output_ids", "meta_info"}
    meta = one["meta_info"]
    assert set(meta) >= {"id", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason", "e2e_latency"}
    assert meta["completion_tokens"] == len(one["output_ids"]) > 0
    # no stop strings in GREEDY: nothing is trimmed, so the text is the ids' decoding (an EOS is skipped)
    assert one["text"] == engine.tokenizer.decode(one["output_ids"], skip_special_tokens=True)
    many = engine.generate(PROMPTS[:3], GREEDY)
    assert isinstance(many, list) and len(many) == 3
    assert many[0]["output_ids"] == one["output_ids"]  # order kept, batching changes nothing
    per_prompt = engine.generate(PROMPTS[:2], [dict(GREEDY, max_new_tokens=3), dict(GREEDY, max_new_tokens=5)])
    assert [len(r["output_ids"]) for r in per_prompt] == [3, 5]


def test_n_returns_n_samples(engine):
    outs = engine.generate(PROMPTS[2], {"temperature": 1.0, "max_new_tokens": 8, "n": 3})
    assert len(outs) == 3 and len({o["meta_info"]["id"] for o in outs}) == 3


def test_streaming_is_cumulative_and_ends_like_the_plain_call(engine):
    full = engine.generate(PROMPTS[1], GREEDY)
    chunks = list(engine.generate(PROMPTS[1], GREEDY, stream=True))
    assert len(chunks) == len(full["output_ids"])
    for a, b in zip(chunks, chunks[1:]):
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
        assert b["text"].startswith(a["text"])
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"] == full["meta_info"]["finish_reason"]
    assert chunks[-1]["text"] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]


def test_abandoned_stream_frees_its_memory(engine):
    gen = engine.generate(PROMPTS[0], {"temperature": 0, "max_new_tokens": 200, "ignore_eos": True}, stream=True)
    for i, _ in enumerate(gen):
        if i == 3:
            break
    gen.close()
    wait_idle(engine)  # the engine fixture then asserts the allocator is whole


def test_abort_request_by_rid(engine):
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(r=engine.generate(
        PROMPTS[0], {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True}, rid="to-abort")))
    t.start()
    deadline = time.monotonic() + 60
    while engine.scheduler.is_idle:
        assert time.monotonic() < deadline, "the request never reached the scheduler"
        time.sleep(0.001)
    engine.abort_request("to-abort")
    t.join(timeout=60)
    assert out["r"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(out["r"]["output_ids"]) < 2000


def test_requests_arriving_mid_decode_match_their_solo_output(engine):
    sp = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    solo = {p: engine.generate(p, sp)["output_ids"] for p in PROMPTS[:5]}
    results: dict[str, list[int]] = {}

    def worker(p: str) -> None:
        results[p] = engine.generate(p, sp)["output_ids"]

    threads = []
    stream = engine.generate(PROMPTS[0], dict(sp, max_new_tokens=40), stream=True)
    for i, chunk in enumerate(stream):  # a new request joins every few decode steps
        if i % 3 == 0 and len(threads) < 4:
            th = threading.Thread(target=worker, args=(PROMPTS[1 + len(threads)],))
            th.start()
            threads.append(th)
    for th in threads:
        th.join()
    assert chunk["output_ids"][:24] == solo[PROMPTS[0]]
    for p in PROMPTS[1:5]:
        assert results[p] == solo[p], p


def test_sampling_effects_on_the_model(engine):
    p = PROMPTS[2]
    greedy = engine.generate(p, {"temperature": 0, "max_new_tokens": 16})["output_ids"]
    assert engine.generate(p, {"temperature": 1.0, "top_k": 1, "max_new_tokens": 16})["output_ids"] == greedy
    s1 = engine.generate(p, {"temperature": 1.0, "max_new_tokens": 16, "sampling_seed": 5})["output_ids"]
    s2 = engine.generate(p, {"temperature": 1.0, "max_new_tokens": 16, "sampling_seed": 5})["output_ids"]
    s3 = engine.generate(p, {"temperature": 1.0, "max_new_tokens": 16, "sampling_seed": 6})["output_ids"]
    assert s1 == s2 != s3


def test_stop_strings_are_trimmed(engine):
    p = PROMPTS[2]
    base = engine.generate(p, {"temperature": 0, "max_new_tokens": 24})
    words = base["text"].split()
    stop = words[len(words) // 2]
    out = engine.generate(p, {"temperature": 0, "max_new_tokens": 24, "stop": [stop, "@@never@@"]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in out["text"] and base["text"].startswith(out["text"])
    kept = engine.generate(p, {"temperature": 0, "max_new_tokens": 24, "stop": stop, "no_stop_trim": True})
    assert kept["text"] == out["text"] + stop  # the same cut, the matched stop string kept


def test_stop_regex_cuts_at_the_first_match(engine):
    p = PROMPTS[2]
    base = engine.generate(p, {"temperature": 0, "max_new_tokens": 24})["text"]
    words = re.findall(r"[A-Za-z]{4,}", base)
    assert len(words) >= 3, base
    target = words[len(words) // 2]
    pattern = f"{target[:2]}[a-z]+"  # a regex, not a literal: matches target (and maybe an earlier word)
    first = re.search(pattern, base)
    out = engine.generate(p, {"temperature": 0, "max_new_tokens": 24, "stop_regex": pattern})
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    matched = out["meta_info"]["finish_reason"]["matched"]
    assert re.fullmatch(pattern, matched), matched
    # The match is seen as soon as the token that completes a match arrives: it may be a prefix of
    # the word the full text has there (a later token could extend it), never a later occurrence.
    assert out["text"] == base[: first.start()] and first.group(0).startswith(matched)
    kept = engine.generate(p, {"temperature": 0, "max_new_tokens": 24, "stop_regex": [pattern, "@@"],
                               "no_stop_trim": True})
    assert kept["text"] == base[: first.start()] + matched
    # inside the min_new_tokens part a match does not stop generation
    n = len(engine.generate(p, {"temperature": 0, "max_new_tokens": 24})["output_ids"])
    late = engine.generate(p, {"temperature": 0, "max_new_tokens": n, "min_new_tokens": n, "stop_regex": pattern})
    assert late["text"] == base and late["meta_info"]["finish_reason"]["type"] == "length"


def test_eos_min_new_tokens_ignore_eos_and_stop_ids(engine):
    chat = PROMPTS[3]  # a short chat answer that ends with <|im_end|> (id 2)
    base = engine.generate(chat, {"temperature": 0, "max_new_tokens": 64})
    assert base["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
    n = len(base["output_ids"])
    longer = engine.generate(chat, {"temperature": 0, "max_new_tokens": 64, "min_new_tokens": n + 5})
    assert len(longer["output_ids"]) >= n + 5 and 2 not in longer["output_ids"][: n + 4]
    ignored = engine.generate(chat, {"temperature": 0, "max_new_tokens": n + 6, "ignore_eos": True})
    assert len(ignored["output_ids"]) == n + 6
    assert ignored["meta_info"]["finish_reason"] == {"type": "length", "length": n + 6}
    stop_id = base["output_ids"][1]
    cut = engine.generate(chat, {"temperature": 0, "max_new_tokens": 64, "stop_token_ids": [stop_id]})
    assert cut["output_ids"] == base["output_ids"][: base["output_ids"].index(stop_id) + 1]


def test_penalties_change_a_repetitive_continuation(engine):
    # presence_penalty shifts every seen token equally, so on a loop of already-seen tokens it need
    # not change the argmax; its exact effect on logits is checked in test_sampler_unit.
    p = "1, 1, 1, 1, 1, 1, 1, 1,"
    sp = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}
    base = engine.generate(p, sp)["output_ids"]
    most = max(set(base), key=base.count)
    for extra in ({"frequency_penalty": 1.5}, {"repetition_penalty": 1.8}):
        pen = engine.generate(p, dict(sp, **extra))["output_ids"]
        assert pen.count(most) < base.count(most), extra


@pytest.mark.parametrize("kwargs,match", [
    ({"prompt": ""}, "empty"),
    ({"input_ids": [1, 2, 10**9]}, "input_ids"),
    ({"prompt": "hi", "sampling_params": {"top_p": 0}}, "top_p"),
    ({"prompt": "hi", "sampling_params": {"max_new_tokens": 10**6}}, "context length"),
    ({"prompt": "hi", "sampling_params": {"stop_token_ids": [-1]}}, "stop_token_ids"),
    ({"prompt": "hi", "sampling_params": {"regex": "(a+"}}, "invalid regex"),
    ({"prompt": "hi", "sampling_params": {"stop_regex": ["(x"]}}, "stop_regex '\\(x' is not a valid"),
    ({"prompt": "hi", "sampling_params": {"stop_regex": [""]}}, "stop_regex must be"),
    ({"prompt": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ({}, "exactly one"),
    ({"prompt": "hi", "priority": 1}, "--enable-priority-scheduling"),
])
def test_bad_input_raises_value_error(engine, kwargs, match):
    with pytest.raises(ValueError, match=match):
        engine.generate(**kwargs)
    assert engine.generate("ok", {"max_new_tokens": 1})["meta_info"]["completion_tokens"] == 1  # still serving


def test_unknown_engine_argument():
    from radixlang_runtime import Engine

    with pytest.raises(TypeError, match="bogus_flag"):
        Engine(bogus_flag=1)
