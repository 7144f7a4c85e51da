"""The frontend link's messages (FrontendReq / FrontendOut) survive msgpack unchanged, with the
bodies they really carry (a /generate body, a result with logprob triples and None entries)."""

from __future__ import annotations

import dataclasses

import pytest

from radixlang_runtime.protocol import messages as m

SAMPLES = {
    m.FrontendReq: dict(req_id="ab-1", method="generate", api_key="k",
                        body={"text": ["x", "y"],
                              "sampling_params": {"max_new_tokens": 0, "stop": ["\n"], "regex": None},
                              "return_logprob": True, "logprob_start_len": 3}),
    m.FrontendOut: dict(req_id="ab-1", status=200, done=False,
                        body={"text": "é ✓", "output_ids": [1, 2], "meta_info": {
                            "finish_reason": None, "input_token_logprobs": [[None, 5, "x"], [-0.25, 6, None]],
                            "cached_tokens": 16}}),
}


def test_every_frontend_message_has_a_sample():
    assert set(SAMPLES) == set(m.FRONTEND_MESSAGES)


@pytest.mark.parametrize("cls", m.FRONTEND_MESSAGES, ids=lambda c: c.__name__)
def test_round_trip(cls):
    msg = cls(**SAMPLES[cls])
    back = m.decode(m.encode(msg))
    assert type(back) is cls and dataclasses.asdict(back) == dataclasses.asdict(msg)


def test_defaults_round_trip():
    back = m.decode(m.encode(m.FrontendReq("p", "ping")))
    assert back == m.FrontendReq("p", "ping", None, None)
    assert m.decode(m.encode(m.FrontendOut("p", 401))).done is True


def test_the_key_is_the_encoded_requests_tail():  # frontend_zmq checks it there before decoding
    import msgpack

    body = {"text": "x" * 5000, "api_key": "not this one"}
    for key in ("k", "sekrit" * 40):
        assert m.encode(m.FrontendReq("r", "generate", body, key)).endswith(msgpack.packb(key, use_bin_type=True))
