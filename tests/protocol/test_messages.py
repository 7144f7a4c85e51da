"""Every cross-process message survives msgpack encoding unchanged; nothing else gets through."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from radixlang_runtime.pooling import PoolSpec
from radixlang_runtime.protocol import messages as m
from radixlang_runtime.protocol.bootstrap_peers import Bootstrap
from radixlang_runtime.protocol.sampling_params import SamplingParams

SAMPLES = {
    m.TokenizedGenerateReq: dict(rid="r1", input_ids=[1, 2, 3], stream=True, lora_id=2,
                                 sampling_params=SamplingParams.from_dict({"max_new_tokens": 4, "stop": ["\n"],
                                                                           "temperature": 0.5, "regex": "[0-9]+",
                                                                           "logit_bias": {"7": -1.5}}),
                                 bootstrap=Bootstrap("127.0.0.1", 8998, 12345)),
    m.TokenizedBatchReq: dict(reqs=[
        m.TokenizedGenerateReq(rid="e0", input_ids=[5, 6], sampling_params=SamplingParams(max_new_tokens=0),
                               pooling=PoolSpec("mean")),
        m.TokenizedGenerateReq(rid="e1", input_ids=[7], sampling_params=SamplingParams(max_new_tokens=0),
                               pooling=PoolSpec("token_logits", (3, 4)))]),
    m.AbortReq: dict(rid="r1"),
    m.FlushCacheReq: dict(req_id="f"),
    m.FlushCacheOut: dict(req_id="f", success=False),
    m.GetStatsReq: dict(req_id="s"),
    m.StatsOut: dict(req_id="s", stats={"free_slots": 10, "new_token_ratio": 0.5}),
    m.ErrorOut: dict(rids=["a", "b"], message="boom"),
    m.BatchTokenIDOut: dict(reqs=[
        m.ReqTokenOut(rid="a", progress=m.ReqProgress(new_ids=[1], completion_tokens=1, queue_time=0.25,
                                                      input_logprobs=[-0.5, -1.0],
                                                      input_top_logprobs=[[[-0.5, 3]], [[-1.0, 4]]],
                                                      output_logprobs=[-0.1], output_top_logprobs=[[[-0.1, 1]]]),
                      consts=m.ReqConsts(skip_special_tokens=False, spaces_between_special_tokens=True,
                                         no_stop_trim=True)),
        m.ReqTokenOut(rid="b", progress=m.ReqProgress(new_ids=[], finished_reason={"type": "stop", "matched": 2},
                                                      cached_tokens=16, num_retractions=1, forced_tokens=3,
                                                      forward_passes=5, spec_draft_tokens=4, spec_accepted_tokens=2,
                                                      embedding=[0.25, -1.5, 3.0]),
                      stop_from_end=3)]),
    m.BatchStrOut: dict(reqs=[m.ReqStrOut(rid="a", text="héllo ✓", trim=2, progress=m.ReqProgress(
        new_ids=[5, 6], finished_reason={"type": "length", "length": 2}, completion_tokens=2, queue_time=0.1))]),
    m.PinPrefixReq: dict(req_id="p", input_ids=[1, 2, 3], ttl_s=2.5),
    m.PinPrefixOut: dict(req_id="p", pin_id="pin-1", pinned_len=16, error=None),
    m.UnpinPrefixReq: dict(req_id="u", pin_id="pin-1"),
    m.UnpinPrefixOut: dict(req_id="u", success=True),
    m.LoadLoraReq: dict(req_id="l", lora_name="alpha", lora_path="/a"),
    m.LoadLoraOut: dict(req_id="l", lora_id=0, error="LoRA adapter 'alpha': no adapter_config.json"),
    m.UnloadLoraReq: dict(req_id="l", lora_id=3),
    m.UnloadLoraOut: dict(req_id="l", success=False),
    m.UpdateWeightsReq: dict(req_id="w", model_path="/ckpt/step-2", load_format="auto"),
    m.UpdateWeightsOut: dict(req_id="w", success=False, message="the checkpoint is missing 1 tensor(s): x"),
    m.GetWeightsReq: dict(req_id="g", name="model.norm.weight", truncate_size=3),
    m.GetWeightsOut: dict(req_id="g", values=[[0.5, -1.25], [2.0, 0.0]]),
    m.SchedulerHeartbeat: dict(replica=1),
    m.PDRegister: dict(room=2**63 - 1, prefix_len=16, total_len=40, token_bytes=512),
    m.PDKVChunk: dict(room=7, start=16, payload=bytes(range(256)) * 2),
    m.PDDone: dict(room=7, first_token=42, cached_len=8, output_logprob=-0.25, output_top=[[-0.25, 42]],
                   input_logprobs=[-1.5], input_top=[[[-1.5, 3]]]),
    m.PDAck: dict(room=7),
    m.PDCancel: dict(room=7, message="aborted"),
    m.PDFail: dict(room=7, message="prefill failed"),
    m.PDPing: dict(seq=3),
    m.PDPong: dict(seq=3),
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


def test_records_are_rebuilt_as_their_types():
    msg = m.BatchTokenIDOut(SAMPLES[m.BatchTokenIDOut]["reqs"])
    back = m.decode(m.encode(msg))
    assert [type(r) for r in back.reqs] == [m.ReqTokenOut, m.ReqTokenOut]
    assert type(back.reqs[0].progress) is m.ReqProgress and type(back.reqs[0].consts) is m.ReqConsts
    assert back.reqs[1].consts is None and back == msg
    assert m.decode(m.encode(m.BatchStrOut())).reqs == []


def test_records_alone_and_malformed_records_are_refused():
    rec = SAMPLES[m.BatchTokenIDOut]["reqs"][0]
    with pytest.raises(TypeError, match="not a message type"):
        m.encode(rec)  # a record travels only inside its message
    with pytest.raises(ValueError, match="unknown message type"):
        m.decode(msgpack.packb(["ReqTokenOut", ["a", [[1]]]]))
    with pytest.raises(ValueError, match="malformed BatchTokenIDOut"):
        m.decode(msgpack.packb(["BatchTokenIDOut", [{"rid": "a"}]]))
    with pytest.raises(ValueError, match="malformed ReqTokenOut"):
        m.decode(msgpack.packb(["BatchTokenIDOut", [[["a", [[1]], 0, None, "extra"]]]]))


def test_a_request_travels_as_typed_records():
    """sampling_params (with its grammar spec), bootstrap and pooling come back as their own types, the
    grammar as it was built at intake (not compiled or checked again)."""
    back = m.decode(m.encode(m.TokenizedGenerateReq(**SAMPLES[m.TokenizedGenerateReq])))
    sp = back.sampling_params
    assert type(sp) is SamplingParams and sp.grammar.kind == "regex" and sp.grammar.compile_text == "[0-9]+"
    assert sp.stop == ["\n"] and sp.logit_bias == {7: -1.5}
    assert type(back.bootstrap) is Bootstrap and back.bootstrap.peer == ("127.0.0.1", 8998)
    pooled = m.decode(m.encode(m.TokenizedBatchReq(**SAMPLES[m.TokenizedBatchReq]))).reqs[1].pooling
    assert type(pooled) is PoolSpec and pooled.token_ids == (3, 4)


def test_a_malformed_request_names_its_rid():
    """A request message whose records do not decode is refused, and its rid can still be read (the
    scheduler fails that request instead of losing it)."""
    data = msgpack.packb(["TokenizedGenerateReq", ["r9", [1, 2], {"no_such_field": 1}]])
    with pytest.raises(ValueError, match="malformed TokenizedGenerateReq"):
        m.decode(data)
    assert m.rids_of(data) == ["r9"]
    batch = msgpack.packb(["TokenizedBatchReq", [[["a", [1], {"bad": 0}], ["b", [2], {}]]]])
    assert m.rids_of(batch) == ["a", "b"]
    assert m.rids_of(b"\x00garbage") == []


def test_constants_are_sent_once_and_bytes_per_record_stay_flat():
    """A streamed request's records after the first carry no constants, and their size does not grow with
    the tokens generated so far (deltas, not the output so far)."""
    from radixlang_runtime.scheduler.loop import token_record
    from radixlang_runtime.scheduler.request import Req
    from radixlang_runtime.protocol.sampling_params import SamplingParams

    req = Req(rid="r", input_ids=[1, 2, 3], sampling=SamplingParams.from_dict({"max_new_tokens": 5000}))
    sizes = []
    for n in range(1, 3001):
        req.output_ids.append(n % 1000)
        rec = token_record(req, n - 1, first=n == 1)
        assert (rec.consts is not None) is (n == 1) and rec.progress.new_ids == [n % 1000]
        sizes.append(len(m.encode(m.BatchTokenIDOut([rec]))))
    assert max(sizes[1:]) - min(sizes[1:]) <= 8  # only the counters' msgpack ints widen (1 -> 3 bytes)
    assert sizes[0] > sizes[1]  # the constants
