"""ResultBuilder turns a request's records into delta snapshots (meta_info as clients know it); Cumulative
folds them back into the whole text, a stop-string trim included."""

from __future__ import annotations

from radixlang_runtime.protocol.messages import ReqProgress, ReqStrOut
from radixlang_runtime.protocol.results import Cumulative, LogprobRequest, ResultBuilder


def builder(stream: bool, logprob=None) -> ResultBuilder:
    return ResultBuilder("r", [7, 8, 9], stream, logprob, lambda i: f"<{i}>")


def rec(text: str, ids: list[int], n: int, fin=None, trim: int = 0, **progress) -> ReqStrOut:
    return ReqStrOut("r", text, ReqProgress(ids, fin, n, **progress), trim)


def test_snapshots_are_deltas_with_the_meta_info_clients_know():
    b = builder(stream=True)
    one = b.apply(rec("Hel", [1, 2], 2, cached_tokens=2, forced_tokens=1, forward_passes=1), 1.0)
    two = b.apply(rec("lo", [3], 3, {"type": "length", "length": 3}, cached_tokens=2, forced_tokens=1,
                      forward_passes=2, spec_draft_tokens=4, spec_accepted_tokens=3, queue_time=0.5), 2.0)
    assert (one["text"], one["output_ids"], two["text"], two["output_ids"]) == ("Hel", [1, 2], "lo", [3])
    meta = two["meta_info"]
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 3 and meta["cached_tokens"] == 2
    assert (meta["forced_tokens"], meta["forward_passes"]) == (1, 2)
    assert (meta["spec_draft_tokens"], meta["spec_accepted_tokens"]) == (4, 3)
    assert meta["queue_time"] == 0.5 and one["meta_info"]["queue_time"] == 0.0  # 0 until admitted
    assert (b.queue_time, b.cached_tokens) == (0.5, 2)  # the latest record's, for TokenizerManager.end_early
    assert meta["finish_reason"] == {"type": "length", "length": 3} and b.finished
    assert one["meta_info"]["finish_reason"] is None and "text_trim" not in two


def test_streamed_logprobs_are_deltas_and_whole_without_streaming():
    lp = LogprobRequest(start=1)
    recs = [rec("a", [1], 1, input_logprobs=[-0.25], output_logprobs=[-1.0]),
            rec("b", [2], 2, {"type": "length", "length": 2}, output_logprobs=[-2.0])]
    b = builder(stream=True, logprob=lp)
    outs = [b.apply(r, 0.0)["meta_info"] for r in recs]
    assert [o["output_token_logprobs"] for o in outs] == [[[-1.0, 1, None]], [[-2.0, 2, None]]]
    assert outs[1]["output_token_logprobs_length"] == 2 and "input_token_logprobs" not in outs[1]
    assert outs[0]["input_token_logprobs"] == [[-0.25, 9, None]]
    b = builder(stream=False, logprob=lp)
    last = [b.apply(r, 0.0) for r in recs][-1]["meta_info"]
    assert last["output_token_logprobs"] == [[-1.0, 1, None], [-2.0, 2, None]]


def test_cumulative_folds_deltas_and_a_trim():
    whole, b = Cumulative(), builder(stream=True)
    for r in (rec("The end", [1, 2], 2), rec(" STOP", [3], 3),
              rec("", [], 3, {"type": "stop", "matched": " STOP"}, trim=5)):
        out = b.apply(r, 0.0)
        whole.add(out)
    assert out["text_trim"] == 5
    snap = whole.snapshot(out)
    assert snap["text"] == "The end" and snap["output_ids"] == [1, 2, 3] and "text_trim" not in snap
    assert snap["meta_info"]["finish_reason"]["type"] == "stop"
