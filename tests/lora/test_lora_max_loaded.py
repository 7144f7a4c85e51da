"""--max-loaded-loras on a real server (tiny random Llama, peft adapters of ranks 8 and 16 on every projection):
one adapter resident at a time, the least recently used idle one evicted and read again from its path under the
same id (peft parity and its cached prefixes kept), an adapter in use never evicted, one whose files are gone
refused naming its path, the counts in /server_info; and unloading an adapter under load loses no request."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from lora_adapters import ADAPTERS, NEW, PROMPT, SP, build_base_and_adapters
from server_utils import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_max_loaded")
    want = build_base_and_adapters(root, (PROMPT,))
    srv = ServerProcess("--model-path", str(root / "base"), "--dtype", "float32", "--max-total-tokens", "2048",
                        "--debug-check-integrity", "--max-loaded-loras", "1", "--max-loras-per-batch", "1",
                        "--lora-paths", *[f"{n}={root / n}" for n in ADAPTERS])
    try:
        yield srv, want, root
    finally:
        srv.stop()


def generate(srv, name, ids=PROMPT, sp=SP):
    return httpx.post(srv.url + "/generate", json={"input_ids": ids, "sampling_params": sp, "lora_path": name},
                      timeout=120)


def lora_stats(srv):
    return httpx.get(srv.url + "/server_info", timeout=10).json()["stats"]["lora"]


def test_start_keeps_the_cap(server):
    srv, _, _ = server
    st = lora_stats(srv)
    assert (st["max_loaded_loras"], st["num_registered"], st["num_resident"]) == (1, 2, 1)
    assert st["resident"] == ["beta"] and st["evictions"] == 1  # alpha gave way to beta at start


def test_evicted_adapter_is_read_again_with_parity(server):
    srv, want, _ = server
    before = lora_stats(srv)
    for name in ("alpha", "beta", "alpha", None):
        r = generate(srv, name)
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == want[name or ""][tuple(PROMPT)], name
    after = lora_stats(srv)
    assert after["num_resident"] == 1 and after["resident"] == ["alpha"]
    assert after["reloads"] - before["reloads"] == 3  # alpha, beta, alpha: each read again
    assert after["evictions"] - before["evictions"] == 3


def test_cached_prefixes_survive_eviction(server):
    """The radix keys carry the adapter's id, which a re-read keeps: alpha's prefix hits after beta evicted it."""
    srv, _, _ = server
    long = list(range(900, 940))
    first = generate(srv, "alpha", long).json()
    assert generate(srv, "beta", long).json()["meta_info"]["cached_tokens"] == 0
    again = generate(srv, "alpha", long).json()
    assert first["meta_info"]["cached_tokens"] == 0 and again["meta_info"]["cached_tokens"] > 0
    assert again["output_ids"] == first["output_ids"]


def test_adapter_in_use_is_not_evicted(server):
    """Concurrent requests of both adapters with one resident slot: each adapter's requests run while the
    other's wait, every output equals peft's (an eviction mid-request would fail it)."""
    srv, want, _ = server
    sp = {**SP, "max_new_tokens": 32, "min_new_tokens": 32}
    names = ["alpha", "beta", "alpha", "beta", None, "beta"]
    with ThreadPoolExecutor(len(names)) as pool:
        outs = list(pool.map(lambda n: generate(srv, n, sp=sp), names))
    for name, r in zip(names, outs):
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"][:NEW] == want[name or ""][tuple(PROMPT)]
        assert r.json()["meta_info"]["completion_tokens"] == 32


def test_adapter_whose_files_are_gone_is_refused_naming_it(server):
    srv, want, root = server
    shutil.copytree(root / "alpha", root / "gamma")
    r = httpx.post(srv.url + "/load_lora_adapter", json={"lora_name": "gamma", "lora_path": str(root / "gamma")},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert generate(srv, "gamma").json()["output_ids"] == want["alpha"][tuple(PROMPT)]
    shutil.rmtree(root / "gamma")
    failures = lora_stats(srv)["reload_failures"]
    assert generate(srv, "beta").json()["output_ids"] == want["beta"][tuple(PROMPT)]  # gamma evicted
    r = generate(srv, "gamma")
    assert r.status_code == 400 and "'gamma'" in r.text and str(root / "gamma") in r.text, r.text
    assert lora_stats(srv)["reload_failures"] == failures + 1
    assert generate(srv, "alpha").json()["output_ids"] == want["alpha"][tuple(PROMPT)]  # the server goes on


def test_unload_under_load_loses_no_request(server):
    """Requests of an adapter and of the base in flight while the adapter is unloaded: each completes whole."""
    srv, want, root = server
    r = httpx.post(srv.url + "/load_lora_adapter", json={"lora_name": "delta", "lora_path": str(root / "beta")},
                   timeout=60)
    assert r.status_code == 200, r.text
    sp = {**SP, "max_new_tokens": 40, "min_new_tokens": 40}
    names = ["delta", None, "delta", None, "delta"]
    with ThreadPoolExecutor(len(names) + 1) as pool:
        futures = [pool.submit(generate, srv, n, PROMPT, sp) for n in names]
        deadline = time.monotonic() + 60
        while lora_stats(srv)["resident"] != ["delta"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(f.done() for f in futures)  # the unload below meets them in flight
        unload = httpx.post(srv.url + "/unload_lora_adapter", json={"lora_name": "delta"}, timeout=90)
        outs = [f.result() for f in futures]
    assert unload.status_code == 200 and "delta" not in unload.json()["loaded_adapters"]
    for name, r in zip(names, outs):
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"][:NEW] == want["beta" if name else ""][tuple(PROMPT)]
        assert r.json()["meta_info"]["completion_tokens"] == 40
    assert generate(srv, "delta").status_code == 400


def test_flag_checks():
    from radixlang_runtime.server_args import ServerArgs

    with pytest.raises(ValueError, match="max_loaded_loras needs enable_lora"):
        ServerArgs(max_loaded_loras=2)
    with pytest.raises(ValueError, match="max_loras_per_batch"):
        ServerArgs(lora_paths=["a=/x"], max_loaded_loras=2, max_loras_per_batch=4)
    assert ServerArgs(lora_paths=["a=/x"], max_loaded_loras=4, max_loras_per_batch=4).max_loaded_loras == 4
