"""Jump-forward on hybrid models (tiny random Qwen3.5 text and Qwen3-Next checkpoints, float32, greedy): the
forced tokens of constrained requests ride as drafts the model verifies in one pass; the Gated DeltaNet keeps
the state after each of their positions and the request's state rolls back to its last accepted one
(mem/verify_states.py). Constrained requests batched with an unconstrained one give exactly the tokens of the
same requests with --disable-jump-forward, with forced tokens accepted and others rejected (the random model
picks its own tokenization of a forced literal: grammar_queue.learn); a follow-up turn continuing from a
finished constrained request's state snapshot equals transformers; pools whole after."""

from __future__ import annotations

import json

import pytest

from tiny_checkpoints import HYBRID_CASES, HYBRID_TINY, build_tiny, hf_greedy

REGEX = r'\{"name": "[a-z]{1,6}", "city": "(Paris|London)", "ok": (true|false)\}'
SCHEMA = {"type": "object", "properties": {"tool": {"type": "string", "enum": ["get_weather", "search"]},
                                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
          "required": ["tool", "unit"], "additionalProperties": False}
PROMPTS = [[5, 77, 1200, 9, 4000, 31], [300 + i for i in range(21)], [42, 43, 44]]
NEW = 6


def requests() -> list[dict]:
    sp = {"temperature": 0, "max_new_tokens": 60}
    return [{**sp, "regex": REGEX}, {**sp, "json_schema": json.dumps(SCHEMA)},
            {"temperature": 0, "max_new_tokens": 12}]


@pytest.fixture(scope="module", params=sorted(HYBRID_CASES))
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    cls_name, kwargs = HYBRID_CASES[request.param]
    return path, build_tiny(path, cls_name, HYBRID_TINY, kwargs)


def run(path, jump_forward: bool) -> tuple[list[dict], int, dict]:
    """(outputs, forced tokens drafted, the follow-up turn's output and its reference) after check_integrity."""
    from radixlang_runtime import Engine

    with Engine(str(path), dtype="float32", max_total_tokens=1024, page_size=4, disable_jump_forward=not jump_forward,
                debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=requests())
        drafted = eng._loop.call(lambda s: s.grammar.forced_tokens_total)
        extended = PROMPTS[0] + outs[0]["output_ids"] + [11, 12, 13]
        follow = eng.generate(input_ids=extended, sampling_params={"temperature": 0, "max_new_tokens": NEW,
                                                                   "min_new_tokens": NEW})
        eng.check_integrity()
        assert eng.get_stats()["state_pool"]["request_slots_in_use"] == 0
    return outs, drafted, {"extended": extended, **follow}


def test_jump_forward_gives_the_tokens_decoding_gives(tiny):
    path, model = tiny
    on, drafted_on, follow = run(path, True)
    off, drafted_off, _ = run(path, False)
    assert [o["output_ids"] for o in on] == [o["output_ids"] for o in off]
    assert json.loads(on[1]["text"])["tool"] in ("get_weather", "search")
    forced = sum(o["meta_info"]["forced_tokens"] for o in on)
    assert forced > 0 and drafted_off == 0 and all(o["meta_info"]["forced_tokens"] == 0 for o in off)
    assert drafted_on > forced  # some forced tokens were rejected: their states rolled back
    assert sum(o["meta_info"]["forward_passes"] for o in on) < sum(o["meta_info"]["forward_passes"] for o in off)
    assert follow["output_ids"] == hf_greedy(model, follow["extended"], NEW)
    assert follow["meta_info"]["cached_tokens"] > len(PROMPTS[0])  # from the constrained turn's snapshot
