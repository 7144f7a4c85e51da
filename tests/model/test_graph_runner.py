"""The decode graph path (model/executor/graph_runner.py) on the CPU through --cuda-graph-emulate: the same
buckets, padding, static buffers and copy-in / copy-out as the CUDA replay, with an eager forward in its place.
Greedy tokens equal the eager path's token for token on the embedded model (float32, batches crossing bucket
edges, requests finishing mid-batch, retractions on a tight pool, n-gram drafts verified eagerly between replayed
steps) and transformers' on a tiny Llama; the
allocator is whole after and the padding slot never handed out. Then the buckets and the flags' refusals."""

from __future__ import annotations

import pytest

from conftest import PROMPTS, assert_whole
from radixlang_runtime.cuda_graph_args import default_buckets, graph_buckets
from radixlang_runtime.server_args import ServerArgs
from radixlang_runtime.server_cli import parse_server_args
from tiny_checkpoints import build_tiny, hf_greedy

BUCKETS = [1, 3]  # a batch of 2 pads to 3; 4 and more run eagerly
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=True, initializer_range=0.3,
            max_position_embeddings=1024)


def greedy(eng, prompts: list[str], news: list[int]) -> list[list[int]]:
    sps = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in news]
    return [o["output_ids"] for o in eng.generate(prompts, sps)]


def test_emulated_graphs_equal_eager_on_a_tight_pool():
    from radixlang_runtime import Engine

    prompts = PROMPTS[:7]
    news = [3 + 3 * i for i in range(7)]  # requests finish one after another: batches 7 .. 1 cross the buckets
    # an optimistic decode reservation on 5 pages of 16: decode must retract (and re-prefill) some requests;
    # n-gram speculation proposes drafts from the prompts, verified on the eager path
    eng = Engine(dtype="float32", max_total_tokens=80, chunked_prefill_size=64, max_prefill_tokens=64,
                 new_token_ratio_init=0.05, new_token_ratio_min=0.05, debug_check_integrity=True,
                 cuda_graph_emulate=True, cuda_graph_bs=BUCKETS, speculative_algorithm="NGRAM")
    try:
        runner, sched = eng.runner, eng.scheduler
        graphs = runner.graphs
        assert graphs is not None and runner.graph_info.mode == "emulate"
        got = greedy(eng, prompts, news)
        info = eng.get_stats()["cuda_graph"]
        retracted = sched.num_retracted_total
        assert retracted > 0, "the pool was meant to force retractions"
        assert_whole(eng)
        eng.flush_cache()
        runner.graphs = None  # the eager decode path, same engine, same pool
        want = greedy(eng, prompts, news)
        assert sched.num_retracted_total > retracted
        assert_whole(eng)
        # the padding slot and table row lie past the allocator's and the table's: never handed out, never
        # written by a request
        alloc = sched.kv.allocator
        assert graphs.pad_slot == runner.kv_pool.num_slots - 1 >= alloc.total_slots
        assert graphs.pad_row == runner.sizes.table_rows
        assert bool((runner.kv_pool.req_to_token[graphs.pad_row] == graphs.pad_slot).all())
    finally:
        eng.shutdown()
    assert [len(x) for x in got] == news
    assert got == want
    assert set(info["replays"]) <= set(BUCKETS) and info["replayed_steps"] == sum(info["replays"].values()) > 0
    assert info["padded_rows"] > 0  # a batch of 2 ran in the bucket of 3
    assert info["eager_steps"].get("batch over the largest bucket", 0) > 0
    assert info["eager_steps"].get("speculative verification", 0) > 0  # n-gram drafts verified eagerly


@pytest.mark.parametrize("mode", ["emulate", "emulate-triton", "cuda"])
def test_graphs_match_transformers_on_a_tiny_llama(mode, tmp_path):
    """emulate: the CPU; emulate-triton: the Triton backend (interpreted on the CPU) under the graph's bound, its
    grid sized by the context (4 splits of 256, the rows' later ones empty); cuda: captured graphs on the Triton
    backend (benchmarks/gpu_check.sh runs it)."""
    import torch

    from radixlang_runtime import Engine

    if mode == "cuda" and not torch.cuda.is_available():
        pytest.skip("captured CUDA graphs need a CUDA device")
    if mode == "emulate-triton":
        pytest.importorskip("triton")
    graph_args = {"emulate": dict(device="cpu", cuda_graph_emulate=True), "cuda": dict(device="cuda"),
                  "emulate-triton": dict(device="cpu", cuda_graph_emulate=True, attention_backend="triton")}[mode]
    model = build_tiny(tmp_path, "LlamaConfig", TINY, {})
    prompts = [list(range(300, 320)), [5, 77, 1200, 9, 4000, 31], [42] * 7]
    news = [16, 9, 3]  # a batch of 3 (bucket 4), then 2, then 1
    want = [hf_greedy(model, p, n) for p, n in zip(prompts, news)]
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=1024, cuda_graph_bs=[1, 2, 4], **graph_args) as eng:
        sps = [{"max_new_tokens": n, "min_new_tokens": n, "temperature": 0} for n in news]
        got = [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=sps)]
        info = eng.get_stats()["cuda_graph"]
        assert_whole(eng)
    assert got == want
    assert info["mode"] == mode.split("-")[0]
    assert info["replays"].get(4, 0) > 0 and info["replays"].get(1, 0) > 0 and info["padded_rows"] > 0


def test_buckets():
    assert default_buckets(40) == [1, 2, 4, 8, 12, 16, 24, 32, 40]
    assert default_buckets(20) == [1, 2, 4, 8, 12, 16, 20]
    assert graph_buckets(None, None, 256)[-1] == 160
    assert graph_buckets([8, 2, 2, 1], None, 64) == [1, 2, 8]
    assert graph_buckets([1, 4, 16], None, 10) == [1, 4, 10]  # no more requests decode at once than table rows
    assert graph_buckets(None, 48, 48) == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]


def test_flags_parse_and_refusals():
    args = parse_server_args(["--cuda-graph-bs", "1", "2", "8", "--cuda-graph-max-bs", "8"])
    assert args.cuda_graph_bs == [1, 2, 8] and args.cuda_graph_max_bs == 8
    assert parse_server_args(["--disable-cuda-graph"]).disable_cuda_graph
    for kwargs, needle in [
        (dict(cuda_graph_max_bs=0), "cuda_graph_max_bs must be >= 1"),
        (dict(cuda_graph_bs=[1, 0]), "cuda_graph_bs must be batch sizes >= 1"),
        (dict(cuda_graph_bs=[1, 32], cuda_graph_max_bs=16), "cuda_graph_bs 32 is above cuda_graph_max_bs 16"),
        (dict(disable_cuda_graph=True, cuda_graph_bs=[1]), "cuda_graph_bs has no effect with disable_cuda_graph"),
        (dict(disable_cuda_graph=True, cuda_graph_emulate=True), "cuda_graph_emulate has no effect"),
        (dict(device="cuda", cuda_graph_emulate=True), "cuda_graph_emulate runs the graph path eagerly on the CPU"),
    ]:
        with pytest.raises(ValueError, match=needle):
            ServerArgs(**kwargs)


def test_bucket_flags_on_the_cpu_without_emulation_are_refused():
    from radixlang_runtime import Engine

    with pytest.raises(ValueError, match="on the CPU add cuda_graph_emulate"):
        Engine(dtype="float32", max_total_tokens=256, cuda_graph_max_bs=8)
