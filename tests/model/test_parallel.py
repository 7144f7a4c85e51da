"""Tensor parallel (gloo, ranks as processes on this machine) and data parallel behind the router.

Greedy float32 tokens with TP=2 equal transformers' (hence TP=1's) through the Engine, the server,
and a group spread over two "nodes" on localhost; a rank or replica that dies fails the requests in
flight with an error, turns /health 503 and stops the server without orphans.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from conftest import PROMPTS, assert_whole
from server_utils import ServerProcess, alive, free_port, wait_gone

NEW = 16


# ---------------------------------------------------------------------------------------- the split
@pytest.mark.parametrize("h,hkv,tp", [(9, 3, 2), (9, 3, 3), (32, 8, 4), (8, 2, 4), (8, 1, 8), (16, 4, 8), (6, 6, 4)])
def test_every_head_and_column_has_one_owner(h, hkv, tp):
    from radixlang_runtime.model.executor.parallel import make_shard

    inter, vocab = 100, 1001
    shards = [make_shard(h, hkv, inter, vocab, tp, r) for r in range(tp)]
    group = h // hkv
    q_owner, kv_ranks = {}, {}
    for s in shards:
        assert s.q_count >= 1 and s.kv_count >= 1
        if hkv >= tp:  # whole GQA groups per rank
            assert s.q_count == s.kv_count * group
        else:  # fewer KV heads than ranks: one KV head replicated, its group's query heads split
            assert s.kv_count == 1 and group % s.q_count == 0
        for q in range(s.q_start, s.q_start + s.q_count):
            assert q not in q_owner
            q_owner[q] = s.rank
            assert s.kv_start <= q // group < s.kv_start + s.kv_count  # its KV head lives on its rank
        for k in range(s.kv_start, s.kv_start + s.kv_count):
            kv_ranks.setdefault(k, []).append(s.rank)
        assert s.kv_count_max == max(x.kv_count for x in shards)
    assert sorted(q_owner) == list(range(h)) and sorted(kv_ranks) == list(range(hkv))
    assert sum(s.inter_count for s in shards) == inter and sum(s.vocab_count for s in shards) == vocab
    assert all(s.vocab_start == s.rank * s.vocab_padded for s in shards)


@pytest.mark.parametrize("h,hkv,tp", [(9, 3, 6), (12, 4, 8), (8, 2, 3)])
def test_unsplittable_heads_are_refused(h, hkv, tp):
    from radixlang_runtime.model.executor.parallel import make_shard

    with pytest.raises(ValueError, match="tp_size"):
        make_shard(h, hkv, 64, 100, tp, 0)


def test_parallel_flags_are_checked():
    from radixlang_runtime.server_args import ServerArgs

    for bad, match in [({"tp_size": 3, "nnodes": 2}, "multiple of nnodes"),
                       ({"nnodes": 2, "tp_size": 2}, "dist-init-addr"),
                       ({"node_rank": 1}, "node_rank"), ({"dp_size": 2, "nnodes": 2, "tp_size": 2,
                                                          "dist_init_addr": "h:1"}, "not implemented"),
                       ({"dist_init_addr": "nohostport"}, "host:port"), ({"load_balance_method": "x"}, "cache_aware")]:
        with pytest.raises(ValueError, match=match):
            ServerArgs(**bad)


# ---------------------------------------------------------------------------------------- Engine
def test_engine_tp2_matches_transformers_then_a_dead_rank_fails_requests(hf_greedy):
    from radixlang_runtime import Engine

    eng = Engine(dtype="float32", tp_size=2, max_total_tokens=4096)
    try:
        ids = [eng.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
        outs = eng.generate(input_ids=ids, sampling_params={"max_new_tokens": NEW, "min_new_tokens": NEW,
                                                            "temperature": 0})
        for p, x, out in zip(PROMPTS, ids, outs):
            assert out["output_ids"] == hf_greedy(x, NEW), p
        assert_whole(eng)
        assert eng.get_stats()["cpu"]["paths"] is not None
        # Rank 1 dies while a request decodes: the request fails with an error, nothing hangs.
        errors: list[BaseException] = []
        steps0 = eng._loop.call(lambda s: s.forward_steps)

        def long_request() -> None:
            try:
                eng.generate("Tell me a long story.", {"max_new_tokens": 2000, "ignore_eos": True})
            except BaseException as e:  # noqa: BLE001 - recorded for the assertion
                errors.append(e)

        t = threading.Thread(target=long_request)
        t.start()
        deadline = time.monotonic() + 60
        while eng._loop.call(lambda s: s.forward_steps) - steps0 < 2:  # it is decoding: past its prefill
            assert time.monotonic() < deadline and t.is_alive(), errors
            time.sleep(0.01)
        eng._tp_procs[0].kill()
        t.join(30)
        assert not t.is_alive() and errors and isinstance(errors[0], RuntimeError)
        assert "tensor-parallel" in str(errors[0])
        with pytest.raises(RuntimeError):
            eng.generate("next", {"max_new_tokens": 2})
    finally:
        eng.shutdown()


# ---------------------------------------------------------------------------------------- server
def _generate_ids(url: str, ids: list[list[int]]) -> list[list[int]]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}}
    r = httpx.post(url + "/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return [x["output_ids"] for x in r.json()]


def _stream_until_error(url: str, result: dict) -> None:
    """A long streaming request; records its last SSE event (an error event when a rank dies)."""
    body = {"text": "Tell me a long story.", "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    try:
        with httpx.stream("POST", url + "/generate", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    result["last"] = json.loads(line[6:])
                    result["events"] = result.get("events", 0) + 1
    except httpx.HTTPError as e:  # the server went away before the error event: also an outcome to see
        result["transport_error"] = repr(e)


def _stream_running(url: str) -> tuple[threading.Thread, dict]:
    """A long streaming request in a thread, once it has produced 3 events."""
    result: dict = {}
    t = threading.Thread(target=_stream_until_error, args=(url, result))
    t.start()
    deadline = time.time() + 60
    while result.get("events", 0) < 3 and time.time() < deadline:
        time.sleep(0.1)
    assert result.get("events", 0) >= 3, result
    return t, result


def _spawned_children(pid: int) -> list[int]:
    """pid's multiprocessing children (not its resource tracker), from /proc."""
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"spawn_main" in cmd:
            kids.append(int(d))
    return kids


def test_server_tp2_over_two_local_nodes(hf_greedy):
    """--nnodes 2 on localhost: node 1 runs rank 1 only; tokens equal transformers'. Killing rank 1
    mid-request: the request gets an error event, /health turns 503, both nodes exit, no orphans."""
    addr = f"127.0.0.1:{free_port()}"
    common = ["--dtype", "float32", "--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr,
              "--max-total-tokens", "4096"]
    node1 = subprocess.Popen([sys.executable, "-m", "radixlang_runtime.launch_server", *common, "--node-rank", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    srv = None
    try:
        srv = ServerProcess(*common, "--node-rank", "0")
        ids = [hf_tok_ids for hf_tok_ids in _prompt_ids(PROMPTS[:6])]
        outs = _generate_ids(srv.url, ids)
        for p, x, out in zip(PROMPTS, ids, outs):
            assert out == hf_greedy(x, NEW), p
        info = httpx.get(srv.url + "/server_info", timeout=30).json()
        assert info["tp_size"] == 2 and info["nnodes"] == 2
        pids = list(info["pids"].values())
        rank1 = _spawned_children(node1.pid)
        assert len(rank1) == 1
        t, result = _stream_running(srv.url)
        os.kill(rank1[0], signal.SIGKILL)
        t.join(30)
        assert not t.is_alive()
        assert "error" in result.get("last", {}) or "transport_error" in result, result
        assert srv.proc.wait(30) == 1  # the server reports the failure and exits, it does not hang
        assert node1.wait(60) is not None
        wait_gone(pids + rank1 + [node1.pid])
    finally:
        if srv is not None:
            srv.stop()
        if node1.poll() is None:
            node1.kill()


def _prompt_ids(prompts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import resolve_model_dir

    tok = AutoTokenizer.from_pretrained(resolve_model_dir(None))
    return [tok.encode(p, add_special_tokens=False) for p in prompts]


def _dsl_runs_over_the_default_link(url: str, texts: list[str]) -> None:
    """The DSL's default link with replicas behind it: one ZeroMQ frontend, the same router."""
    import radixlang as sgl

    @sgl.function
    def answer(s, text):
        s += text + sgl.gen("a", max_tokens=2, temperature=0)

    def counts() -> tuple[int, int]:
        info = httpx.get(url + "/server_info", timeout=30).json()
        return info["frontend"]["requests_by_method"].get("generate", 0), sum(info["stats"]["placement"]["routed"])

    backend = sgl.RuntimeEndpoint(url)
    try:
        assert backend.transport == "zmq"
        before = counts()
        states = answer.run_batch([{"text": t} for t in texts], backend=backend)
        assert [st.error() for st in states] == [None] * len(texts)
        assert counts() == (before[0] + len(texts), before[1] + len(texts))
    finally:
        backend.shutdown()


def test_server_dp2_tp2_cache_aware_router_then_a_dead_replica(hf_greedy):
    """Two replicas of two TP ranks each (single node): each few-shot prefix is prefilled on one
    replica only (the router follows the cache), outputs equal transformers', and a replica that dies
    stops the server and every rank cleanly."""
    srv = ServerProcess("--dtype", "float32", "--dp-size", "2", "--tp-size", "2", "--max-total-tokens", "8192")
    try:
        shots = {name: "".join(f"Q: What is {i} plus {i}? A: {2 * i}.\n" for i in range(start, start + 24))
                 for name, start in (("a", 1), ("b", 50))}
        texts = [shots[k] + f"Q: What is {n} plus 1? A:" for n in range(6) for k in "ab"]
        r = httpx.post(srv.url + "/generate", json={"text": texts[:2], "sampling_params": {"max_new_tokens": 1}},
                       timeout=300)  # one of each prefix first: each goes to its own replica
        assert r.status_code == 200
        with httpx.Client(timeout=300) as c:  # then the rest, 4 at a time
            for i in range(2, len(texts), 4):
                assert c.post(srv.url + "/generate", json={"text": texts[i:i + 4],
                                                          "sampling_params": {"max_new_tokens": 2}}).status_code == 200
        stats = httpx.get(srv.url + "/server_info", timeout=30).json()["stats"]
        router, replicas = stats["placement"], stats["replicas"]
        assert router["policy"] == "cache_aware" and router["routed"] == [6, 6] and router["loads"] == [0, 0]
        prefix_len = min(len(x) for x in _prompt_ids(list(shots.values())))
        for rep in replicas:  # one prefix per replica, computed once: the rest were cache hits
            assert rep["prefill_tokens_computed"] < prefix_len + 5 * 32, rep  # pages of 16 + the question
            assert rep["prefill_tokens_cached"] >= 5 * (prefix_len - 16), rep
        assert stats["prefill_tokens_computed"] == sum(r["prefill_tokens_computed"] for r in replicas)
        ids = _prompt_ids(PROMPTS[:4])
        for p, x, out in zip(PROMPTS, ids, _generate_ids(srv.url, ids)):
            assert out == hf_greedy(x, NEW), p
        _dsl_runs_over_the_default_link(srv.url, texts[:2])
        pids = httpx.get(srv.url + "/server_info", timeout=30).json()["pids"]
        assert {"scheduler", "scheduler1", "tp0.1", "tp1.1"} <= set(pids)
        t, result = _stream_running(srv.url)
        os.kill(pids["scheduler1"], signal.SIGKILL)
        deadline = time.time() + 10
        code = None
        while time.time() < deadline and srv.proc.poll() is None:
            try:
                code = httpx.get(srv.url + "/health", timeout=2).status_code
            except httpx.HTTPError:
                break
            time.sleep(0.1)
        assert code in (503, None)  # 503 while it stops (or already gone)
        t.join(30)
        assert not t.is_alive() and ("error" in result.get("last", {}) or "transport_error" in result), result
        assert srv.proc.wait(30) == 1
        wait_gone(pids.values())
        assert not alive(pids["scheduler"])
    finally:
        srv.stop()
