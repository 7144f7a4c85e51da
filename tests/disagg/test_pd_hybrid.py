"""Prefill-decode disaggregation of a hybrid model (tiny Qwen3-Next: Gated DeltaNet + gated attention, MoE): a
prefill and a decode server (each its own launch_server), every body posted to both with the router's bootstrap
fields. The prefill sends the request's recurrent state after the prompt (DeltaNet matrices and convolution
windows, mem/state_records.py) with its K/V; the decode installs it in the request's state slot and decodes:
greedy outputs equal transformers (float32) token for token, a chunked prompt and a short one, twice (the
second time the decode's own prefix cache holds part of the prompt and its snapshot is overridden by the
prefill's state); both servers idle and whole after, their state pools checked every step."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from server_utils import ServerProcess, assert_idle_and_whole, free_port
from tiny_checkpoints import build_tiny, hf_greedy

pytestmark = pytest.mark.timeout(1800)
T = 600  # client bound per request (a loaded machine)
NEW = 6
TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            bos_token_id=1, eos_token_id=2, initializer_range=0.3, max_position_embeddings=512,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, intermediate_size=96, moe_intermediate_size=32, num_experts=4,
            num_experts_per_tok=2, shared_expert_intermediate_size=48, mlp_only_layers=[0])
COMMON = ("--dtype", "float32", "--max-total-tokens", "2048", "--page-size", "4", "--chunked-prefill-size", "32",
          "--debug-check-integrity", "--frontend-port", "-1", "--disaggregation-heartbeat-timeout", "10",
          "--disaggregation-transfer-timeout", "600")
PROMPTS = [list(range(300, 400)), [5, 77, 1200, 9, 4000, 31]]  # 100 tokens: four prefill chunks; 6 tokens


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_next")
    model = build_tiny(path, "Qwen3NextConfig", TINY, {})
    boot = free_port()
    flags = [("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot)),
             ("--disaggregation-mode", "decode")]
    with ThreadPoolExecutor(2) as ex:
        prefill, decode = ex.map(lambda f: ServerProcess("--model-path", str(path), *COMMON, *f, timeout=900), flags)
    try:
        yield model, prefill, decode, boot
    finally:
        prefill.stop()
        decode.stop()


def _pd_generate(prefill, decode, boot, ids):
    body = {"input_ids": ids, "bootstrap_host": "127.0.0.1", "bootstrap_port": boot,
            "bootstrap_room": random.getrandbits(63),
            "sampling_params": {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}}
    with ThreadPoolExecutor(2) as ex:
        fp = ex.submit(httpx.post, prefill.url + "/generate", json=body, timeout=T)
        fd = ex.submit(httpx.post, decode.url + "/generate", json=body, timeout=T)
        rp, rd = fp.result(), fd.result()
    assert rp.status_code == 200, rp.text
    assert rd.status_code == 200, rd.text
    return rd.json()


def test_a_hybrid_model_decodes_from_the_prefills_state(pd):
    model, prefill, decode, boot = pd
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    for _ in range(2):  # the second round: the decode's radix cache holds the prompts' pages and snapshots
        got = [_pd_generate(prefill, decode, boot, p)["output_ids"] for p in PROMPTS]
        assert got == want
    for srv in (prefill, decode):
        with httpx.Client(base_url=srv.url, timeout=T) as cl:
            assert_idle_and_whole(cl, timeout=120)
    info = httpx.get(decode.url + "/server_info", timeout=T).json()
    assert info["stats"]["disaggregation"]["transfers_done"] == 4
