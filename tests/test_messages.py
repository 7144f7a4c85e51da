"""Every cross-process message survives msgpack encoding unchanged; nothing else gets through."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from radixlang_runtime import messages as m

SAMPLES = {
    m.TokenizedGenerateReq: dict(rid="r1", input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 4, "stop": ["\n"],
                                                                                 "temperature": 0.5}, stream=True),
    m.AbortReq: dict(rid="r1"),
    m.FlushCacheReq: dict(req_id="f"),
    m.FlushCacheOut: dict(req_id="f", success=False),
    m.GetStatsReq: dict(req_id="s"),
    m.StatsOut: dict(req_id="s", stats={"free_slots": 10, "new_token_ratio": 0.5}),
    m.ErrorOut: dict(rids=["a", "b"], message="boom"),
    m.BatchTokenIDOut: dict(rids=["a", "b"], new_ids=[[1], []], finished_reasons=[None, {"type": "stop", "matched": 2}],
                            prompt_tokens=[3, 4], completion_tokens=[1, 0], cached_tokens=[0, 16],
                            num_retractions=[0, 1], queue_times=[0.0, 0.25], skip_special_tokens=[True, False],
                            spaces_between_special_tokens=[True, True], no_stop_trim=[False, True]),
    m.BatchStrOut: dict(rids=["a"], texts=["héllo ✓"], text_is_full=[True], new_ids=[[5, 6]],
                        finished_reasons=[{"type": "length", "length": 2}], prompt_tokens=[1], completion_tokens=[2],
                        cached_tokens=[0], num_retractions=[0], queue_times=[0.1]),
    m.PinPrefixReq: dict(req_id="p", input_ids=[1, 2, 3], ttl_s=2.5),
    m.PinPrefixOut: dict(req_id="p", pin_id="pin-1", pinned_len=16, error=None),
    m.UnpinPrefixReq: dict(req_id="u", pin_id="pin-1"),
    m.UnpinPrefixOut: dict(req_id="u", success=True),
    m.SchedulerHeartbeat: dict(replica=1),
}


def test_every_message_type_has_a_sample():
    assert set(SAMPLES) == set(m.MESSAGES)


@pytest.mark.parametrize("cls", m.MESSAGES, ids=lambda c: c.__name__)
def test_round_trip(cls):
    msg = cls(**SAMPLES[cls])
    back = m.decode(m.encode(msg))
    assert type(back) is cls and dataclasses.asdict(back) == dataclasses.asdict(msg)


def test_unknown_types_are_refused():
    with pytest.raises(TypeError):
        m.encode({"rid": "x"})
    with pytest.raises(ValueError, match="unknown message type"):
        m.decode(msgpack.packb(["os.system", ["echo hi"]]))
