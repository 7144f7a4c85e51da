"""PD with tensor parallelism through real servers on a tiny float32 checkpoint whose 3 KV heads split unevenly
over 2 ranks (2 + 1: model/executor/tp_kv.py pads the smaller shard): a prefill with --tp-size 2 spread over two local
"nodes" (--nnodes 2, node 1 its own launch_server running rank 1 only), a decode with --tp-size 2 and a decode
with tp_size 1 (the records carry every rank's heads, so the two sides' tp sizes may differ). Greedy outputs
equal transformers' token for token, chunked prefill and the decode's own radix prefix included; stopping
every server leaves no process behind. Before them, TPRecordPort itself over a gloo group of two threads."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from server_utils import ServerProcess, free_port
from server_utils import assert_idle_and_whole
from server_utils import alive, wait_gone
from tiny_checkpoints import build_tiny, hf_greedy

# Four servers (five processes with a model) start side by side: on a loaded 2-core machine that takes minutes.
pytestmark = pytest.mark.timeout(1800)
START_S = 900.0
T = 600  # client bound per request (a loaded machine)
TINY = dict(hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=3, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3, max_position_embeddings=4096)
NEW = 6
SP = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
# the last is over --chunked-prefill-size: its K/V leaves the prefill chunk by chunk
PROMPTS = [[(7 * i + 13 * k + 300) % 4000 + 10 for i in range(n)] for k, n in enumerate((11, 23, 70))]
COMMON = ("--dtype", "float32", "--max-total-tokens", "4096", "--chunked-prefill-size", "32", "--frontend-port", "-1",
          "--debug-check-integrity", "--disaggregation-heartbeat-timeout", "5",
          "--disaggregation-transfer-timeout", "300")


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_llama_pd_tp")
    model = build_tiny(d, "LlamaConfig", TINY, {})
    boot = free_port()
    common = ("--model-path", str(d), *COMMON)
    prefill = (*common, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot),
               "--tp-size", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{free_port()}")
    node1 = subprocess.Popen([sys.executable, "-m", "radixlang_runtime.launch_server", *prefill, "--node-rank", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    flags = [(*prefill, "--node-rank", "0"), (*common, "--disaggregation-mode", "decode", "--tp-size", "2"),
             (*common, "--disaggregation-mode", "decode")]
    with ThreadPoolExecutor(3) as ex:  # started side by side
        futures = [ex.submit(ServerProcess, *f, timeout=START_S) for f in flags]
    started = [f.result() for f in futures if f.exception() is None]
    try:
        if len(started) < 3:
            raise next(f.exception() for f in futures if f.exception() is not None)
        want = [hf_greedy(model, p, NEW) for p in PROMPTS]
        yield {"prefill": started[0], "decode_tp2": started[1], "decode_tp1": started[2], "node1": node1,
               "boot": boot, "want": want}
    finally:
        for s in started:
            s.stop()
        if node1.poll() is None:
            node1.terminate()
            try:
                node1.wait(30)
            except subprocess.TimeoutExpired:
                node1.kill()
                node1.wait(10)


def pd_generate(pd, decode: str, ids: list[int]) -> dict:
    """What the PD router does: the same body with bootstrap fields to the prefill and the decode, at once;
    returns the decode's answer (both must answer 200)."""
    body = {"input_ids": ids, "sampling_params": SP, "bootstrap_host": "127.0.0.1", "bootstrap_port": pd["boot"],
            "bootstrap_room": random.getrandbits(63)}
    with ThreadPoolExecutor(2) as ex:
        fp = ex.submit(httpx.post, pd["prefill"].url + "/generate", json=body, timeout=T)
        fd = ex.submit(httpx.post, pd[decode].url + "/generate", json=body, timeout=T)
        p, d = fp.result(), fd.result()
    assert p.status_code == 200 and d.status_code == 200, (p.text, d.text)
    assert p.json()["output_ids"] == d.json()["output_ids"][:1]  # the prefill answers the first token only
    return d.json()


def _disagg(url: str) -> dict:
    return httpx.get(url + "/server_info", timeout=30).json()["stats"]["disaggregation"]


def _gloo_pair(cfg, pool_of):
    """Two ranks of a real gloo group (threads of this process), each a runner-like record of cfg, its shard and
    pool_of(shard); rank 1 serves rank 0's ops until STOP. Returns (runners, rank 1's thread)."""
    import threading
    from types import SimpleNamespace

    import torch

    from radixlang_runtime.model.executor.parallel import STOP, TPGroup, make_shard
    from radixlang_runtime.model.executor.tp_kv import serve

    addr = f"127.0.0.1:{free_port()}"
    runners = [None, None]

    def join(rank: int) -> None:
        shard = make_shard(cfg.num_attention_heads, cfg.num_key_value_heads, 8, 16, 2, rank)
        runners[rank] = SimpleNamespace(cfg=cfg, shard=shard, tp=TPGroup(rank, 2, addr, 60, torch.device("cpu")),
                                        kv_pool=pool_of(shard))
        if rank == 1:
            while (op := runners[1].tp.recv_obj()) != STOP:
                serve(runners[1], op)

    worker = threading.Thread(target=join, args=(1,), daemon=True)
    worker.start()
    join(0)
    return runners, worker


def _stop(runners, worker) -> None:
    from radixlang_runtime.model.executor.parallel import STOP

    runners[0].tp.broadcast_obj(STOP)
    worker.join(30)
    assert not worker.is_alive()


@pytest.mark.parametrize("heads,kv_heads", [(6, 3), (4, 1)])
def test_tp_record_port_moves_every_ranks_heads_in_model_order(heads, kv_heads):
    """model/executor/tp_kv.py over a real gloo group of 2 ranks (threads of this process), KV heads split 2 + 1 or one
    KV head replicated on both: records written through rank 0 land in each rank's heads as a tp_size 1 pool
    holds them, and read back the same bytes."""
    from types import SimpleNamespace

    import torch

    from radixlang_runtime.mem.kv_pool import KVPool
    from radixlang_runtime.mem.kv_records import KVRecordPort
    from radixlang_runtime.model.executor.tp_kv import TPRecordPort

    cfg = SimpleNamespace(num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=4,
                          mla=None, architecture="LlamaForCausalLM", kv_head_map=lambda start, count: None)
    ref = KVPool(32, 2, kv_heads, 4, torch.float32, torch.device("cpu"), 1, 32)  # tp_size 1: every head
    ref.block.copy_(torch.randn_like(ref.block))
    payloads = KVRecordPort(ref, 1).read_records(list(range(10)))
    runners, worker = _gloo_pair(cfg, lambda sh: KVPool(32, 2, sh.kv_count, 4, torch.float32, torch.device("cpu"),
                                                        1, 32))
    port = TPRecordPort(runners[0], 1)
    assert port.record_bytes == KVRecordPort(ref, 1).record_bytes
    slots = [20, 3, 7, 8, 30, 1, 2, 11, 12, 31]  # record i of the payloads goes to slots[i]
    port.write_records(slots, payloads)
    port.write_records(slots[:2], payloads[5:7])  # overwritten: the last write wins on every rank
    want = list(payloads)
    want[:2] = payloads[5:7]
    assert port.read_records(slots) == want
    for r in runners:
        sh = r.shard
        got = r.kv_pool.block[:, :, :, slots]
        exp = ref.block[:, :, sh.kv_start:sh.kv_start + sh.kv_count, [5, 6, 2, 3, 4, 5, 6, 7, 8, 9]]
        assert torch.equal(got, exp), sh.rank
    with pytest.raises(ValueError, match="payloads of"):
        port.write_records(slots[:1], [payloads[0][:-4]])  # refused on rank 0, before anything is broadcast
    port.write_joined(slots[2:4], b"".join(payloads[0:2]))  # PD's joined form: the same records, every rank
    want[2:4] = payloads[0:2]
    assert port.read_joined(slots) == b"".join(want)
    with pytest.raises(ValueError, match="write_joined"):
        port.write_joined(slots[:2], payloads[0] + payloads[1][:-4])  # not whole records: refused on rank 0
    assert port.read_records(slots) == want  # the refused writes changed nothing on any rank
    _stop(runners, worker)


@pytest.mark.parametrize("heads,kv_heads,global_kv", [(4, 2, 1), (6, 6, 3)])
def test_tp_record_port_moves_per_layer_shapes(heads, kv_heads, global_kv):
    """A Gemma 4 pool (sliding layers of 8 lanes, global ones of 16 with fewer KV heads, a KV-shared layer) over
    2 ranks: the global KV head on both ranks, or 3 global heads over ranks of 3 wide heads each (each rank
    stores a head twice: its share cuts two heads' groups unequally). Records are a tp_size 1 pool's, written into
    each rank's own heads of each layer and read back the same bytes."""
    import torch

    from radixlang_runtime.mem.kv_pool import KVPool
    from radixlang_runtime.mem.kv_records import KVRecordPort
    from radixlang_runtime.model.executor.tp_kv import TPRecordPort
    from radixlang_runtime.model.loader.config import ModelConfig

    cfg = ModelConfig.from_dict({
        "architectures": ["Gemma4ForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 32,
        "num_hidden_layers": 5, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": 8,
        "global_head_dim": 16, "attention_k_eq_v": True, "num_global_key_value_heads": global_kv,
        "num_kv_shared_layers": 1, "layer_types": ["sliding_attention", "full_attention"] * 2 + ["sliding_attention"],
        "hidden_size_per_layer_input": 0})

    def pool(start: int, count: int) -> KVPool:
        return KVPool(32, cfg.kv_layer_count, 0, 0, torch.float32, torch.device("cpu"), 1, 32,
                      shapes=cfg.kv_shapes(start, count))

    ref = pool(0, kv_heads)  # tp_size 1: every head of every layer, two groups
    assert len(ref.groups) == 2
    for g in ref.groups:
        g.block.copy_(torch.randn_like(g.block))
    payloads = KVRecordPort(ref, 1).read_records(list(range(10)))
    runners, worker = _gloo_pair(cfg, lambda sh: pool(sh.kv_start, sh.kv_count))
    port = TPRecordPort(runners[0], 1)
    assert port.record_bytes == KVRecordPort(ref, 1).record_bytes
    slots = [20, 3, 7, 8, 30, 1, 2, 11, 12, 31]
    port.write_joined(slots, b"".join(payloads))
    assert port.read_records(slots) == payloads
    for r in runners:
        maps = cfg.kv_head_map(r.shard.kv_start, r.shard.kv_count)
        for i, own in enumerate(maps):
            for got, full in ((r.kv_pool.k_buffers[i], ref.k_buffers[i]), (r.kv_pool.v_buffers[i], ref.v_buffers[i])):
                assert torch.equal(got[:, slots], full[list(own)][:, list(range(10))]), (r.shard.rank, i)
    if global_kv == 3:
        assert (cfg.kv_head_map(0, 3)[1], cfg.kv_head_map(3, 3)[1]) == ((0, 0, 1), (1, 2, 2))
    _stop(runners, worker)


def test_tp2_prefill_over_two_nodes_to_tp2_decode_equals_transformers(pd):
    info = httpx.get(pd["prefill"].url + "/server_info", timeout=30).json()
    assert (info["tp_size"], info["nnodes"], info["disaggregation_mode"]) == (2, 2, "prefill")
    with ThreadPoolExecutor(len(PROMPTS)) as ex:
        outs = list(ex.map(lambda p: pd_generate(pd, "decode_tp2", p)["output_ids"], PROMPTS))
    assert outs == pd["want"]
    # the same prompt again: the decode's own radix cache supplies a prefix, the rest still comes from rank 0
    # of the prefill (and lands in the right heads of both decode ranks)
    before = _disagg(pd["decode_tp2"].url)
    assert pd_generate(pd, "decode_tp2", PROMPTS[2])["output_ids"] == pd["want"][2]
    after = _disagg(pd["decode_tp2"].url)
    assert after["prefix_hit_tokens"] > before["prefix_hit_tokens"]
    assert after["transfers_done"] == before["transfers_done"] + 1 and after["transfers_failed"] == 0


def test_tp2_prefill_to_tp1_decode_equals_transformers(pd):
    """tp sizes differ: the records hold every KV head in the model's order either way."""
    with ThreadPoolExecutor(len(PROMPTS)) as ex:
        outs = list(ex.map(lambda p: pd_generate(pd, "decode_tp1", p)["output_ids"], PROMPTS))
    assert outs == pd["want"]
    stats = _disagg(pd["decode_tp1"].url)
    assert stats["transferred_tokens"] == sum(len(p) for p in PROMPTS) and stats["transfers_failed"] == 0


def test_stopping_leaves_no_process(pd):
    """Last in this file: every server stops (node 1's rank with node 0) and no process of theirs remains."""
    for s in ("prefill", "decode_tp2", "decode_tp1"):
        with httpx.Client(base_url=pd[s].url) as cl:
            assert_idle_and_whole(cl)
    pids = [pd["node1"].pid]
    for s in ("prefill", "decode_tp2", "decode_tp1"):
        pids += httpx.get(pd[s].url + "/server_info", timeout=30).json()["pids"].values()
    kids = _children(pd["node1"].pid)
    assert len([k for k, cmd in kids if b"spawn_main" in cmd]) == 1  # node 1 runs TP rank 1, nothing else
    pids += [k for k, _ in kids]
    assert all(alive(p) for p in pids)
    for s in ("prefill", "decode_tp2", "decode_tp1"):
        assert pd[s].stop() in (0, 143), pd[s].tail()
    pd["node1"].wait(60)  # node 0's rank 0 left the group: node 1's rank exits, then node 1 (bounded: raises)
    wait_gone(pids, timeout=60)


def _children(pid: int) -> list[tuple[int, bytes]]:
    """pid's children (pid, command line), from /proc."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append((int(d), cmd))
    return out
