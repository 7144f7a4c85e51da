"""The live view: the radix tree summary (bounded, conserving tokens), /dashboard/state through the
real server (the shared prefix node, queues, KV split; no prompt text without the flag; the API key
rule), and the page itself rendered by headless Chromium with no network (DOM checks, a screenshot
saved to tests/artifacts/dashboard.png). The browser test is skipped where no Chromium is installed
(.ci/run installs Debian's `chromium`)."""

from __future__ import annotations

import json
import os
import random

import httpx
import pytest

from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.mem.radix_summary import summarize_tree
from browser_utils import browser, chromium
from server_utils import ServerProcess

ARTIFACTS = os.path.join(os.path.dirname(__file__), "..", "artifacts")
SECRET = "Zanzibarquux"
SHARED = ("You are a meticulous assistant for the " + SECRET + " project. Answer in one short sentence, "
          "cite nothing, and never use lists. ") * 3


def _random_tree(n_seqs: int, seed: int = 0) -> RadixCache:
    rng = random.Random(seed)
    cache, slot = RadixCache(page_size=1), 0
    seqs: list[list[int]] = []
    for _ in range(n_seqs):
        base = rng.choice(seqs) if seqs and rng.random() < 0.9 else []
        cut = rng.randint(0, len(base))
        ids = base[:cut] + [rng.randrange(1000) for _ in range(rng.randint(1, 12))]
        held = cache.insert(ids, list(range(slot, slot + len(ids))))
        slot += len(ids)
        assert held <= len(ids)
        seqs.append(ids)
    return cache


def test_tree_summary_is_bounded_and_conserves_tokens():
    cache = _random_tree(7000)
    total_nodes = sum(1 for _ in cache._nodes())
    assert total_nodes > 10_000
    out = summarize_tree(cache, max_nodes=300)
    nodes = {n["id"]: n for n in out["nodes"]}
    assert out["total_nodes"] == total_nodes and out["total_tokens"] == cache.total_size()
    assert len(nodes) <= 301 and out["shown_nodes"] == len(nodes) - 1
    kids: dict[int, list[dict]] = {}
    for n in out["nodes"][1:]:
        assert n["parent"] in nodes  # every shown node hangs under a shown one
        kids.setdefault(n["parent"], []).append(n)
    for n in out["nodes"]:
        under = sum(c["subtree_tokens"] for c in kids.get(n["id"], []))
        assert n["tokens"] + under + n["hidden_tokens"] == n["subtree_tokens"], n
        assert "head_ids" not in n  # no token ids (so no text) unless asked
    size = len(json.dumps(out))
    assert size < 256 * 1024, size
    with_ids = summarize_tree(cache, max_nodes=5, with_ids=True)
    assert all(len(n["head_ids"]) == min(n["tokens"], 24) for n in with_ids["nodes"][1:])


def test_empty_tree():
    out = summarize_tree(RadixCache(page_size=16))
    assert out["total_nodes"] == 0 and out["nodes"][0]["subtree_tokens"] == 0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # with the cache tiers (write_through: every insert also goes to L2) for the tier rows
    srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "8192", "--enable-hierarchical-cache",
                        "--hicache-size", "0.05", "--hicache-storage-dir", str(tmp_path_factory.mktemp("l2")),
                        "--hicache-write-policy", "write_through", "--hicache-load-policy", "always")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


def _shared_prefix_requests(url: str, headers: dict | None = None) -> None:
    with httpx.Client(base_url=url, timeout=120, headers=headers or {}) as c:
        for q in ("What is 2 + 2?", "Name a colour.", "Say hello."):  # each suffix spans whole pages
            r = c.post("/generate", json={"text": SHARED + (q + " ") * 12,
                                          "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
            assert r.status_code == 200, r.text


def _shared_node(state: dict) -> dict:
    nodes = state["tree"]["nodes"]
    children: dict[int, int] = {}
    for n in nodes[1:]:
        children[n["parent"]] = children.get(n["parent"], 0) + 1
    shared = [n for n in nodes[1:] if children.get(n["id"], 0) >= 2]
    assert shared, nodes
    return max(shared, key=lambda n: n["tokens"])


@pytest.mark.slow
def test_state_shows_the_shared_prefix_without_text(server):
    _shared_prefix_requests(server.url)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.get("/dashboard/state")
        assert r.status_code == 200, r.text
        state = r.json()
        node = _shared_node(state)
        assert node["tokens"] >= 48 and node["tokens"] % 16 == 0  # the prefix, in whole pages
        assert state["queues"]["waiting"] == 0 and state["queues"]["running"] == 0
        kv = state["kv"]
        assert kv["free"] + kv["evictable"] + kv["locked"] + kv["private"] == kv["total"]
        assert kv["evictable"] >= node["tokens"] and kv["evicted_tokens_total"] == 0
        assert state["series"]["ttft"]["p50"] is not None
        assert SECRET not in r.text and "head_ids" not in r.text and not state["show_text"]
        page = c.get("/dashboard")
        assert page.status_code == 200 and "radix" in page.text.lower()
        offline = page.text.replace("http://www.w3.org/2000/svg", "")  # the SVG namespace, not a fetch
        assert "http://" not in offline and "https://" not in offline and "<link" not in offline


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="no Chromium installed (apt install chromium)")
def test_page_renders_in_headless_chromium(server):
    _shared_prefix_requests(server.url)
    node = _shared_node(httpx.get(server.url + "/dashboard/state", timeout=60).json())
    dom = browser("--dump-dom", server.url + "/dashboard")
    assert 'data-loaded="1"' in dom, dom[-3000:]
    assert f'data-tokens="{node["tokens"]}"' in dom and 'data-shared="1"' in dom
    assert 'id="q-running">0<' in dom and 'id="q-waiting">0<' in dom
    assert 'id="kv-free"' in dom and "data-slots=" in dom
    assert 'id="tier-l1"' in dom and 'id="tier-l2"' in dom and "data-capacity=" in dom
    assert SECRET not in dom
    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, "dashboard.png")
    browser(f"--screenshot={shot}", "--window-size=1300,900", server.url + "/dashboard")
    assert os.path.getsize(shot) > 10_000


@pytest.mark.slow
def test_state_shows_the_cache_tiers(server):
    """Prefixes written through to L2, the pool flushed, the same prompts again: the L2 row shows the hits
    /server_info reports, its bytes against its capacity, the records written and the loads."""
    import time

    def state() -> dict:
        time.sleep(0.3)  # past the shared answer's 250 ms
        return httpx.get(server.url + "/dashboard/state", timeout=60).json()["tiers"]

    _shared_prefix_requests(server.url)
    deadline = time.monotonic() + 60
    while (t := state())["queue"]["queued"] or not t["l2"]["written"]:  # the writer thread stores them
        assert time.monotonic() < deadline, t
    assert httpx.post(server.url + "/flush_cache?tiers=l1", timeout=60).status_code == 200
    _shared_prefix_requests(server.url)
    t = state()
    hc = httpx.get(server.url + "/server_info", timeout=30).json()["stats"]["hicache"]
    assert t["enabled"] and t["l2"]["hit_tokens"] == hc["hit_tokens"]["l2"] > 0
    assert t["l2"]["capacity"] == 50_000_000 and 0 < t["l2"]["used"] == hc["l2"]["used_bytes"]
    assert t["l2"]["written"] == hc["writer"]["written"]["l2"] > 0 and t["loads"] == hc["loads"] >= 1
    assert t["l3"] is None and t["l1"]["capacity"] == 8192 and t["l1"]["hit_tokens"] > 0
    assert set(t["readmit_tokens"]) == {"kept", "swapped", "recomputed"}


@pytest.mark.slow
def test_text_only_with_the_flag_and_the_api_key_rule():
    srv = ServerProcess("--dtype", "float32", "--max-total-tokens", "4096", "--dashboard-show-text",
                        "--api-key", "sesame")
    try:
        _shared_prefix_requests(srv.url, {"Authorization": "Bearer sesame"})
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            assert c.get("/dashboard/state").status_code == 401
            login = c.get("/dashboard")
            assert login.status_code == 200 and 'type="password"' in login.text and 'id="tree"' not in login.text
            assert c.get("/dashboard/state", params={"key": "wrong"}).status_code == 401
            c.cookies.set("radixlang_api_key", "sesame")  # what the login form sets
            r = c.get("/dashboard/state")
            assert r.status_code == 200 and r.json()["show_text"]
            assert SECRET in _shared_node(r.json())["text"]  # the node label: its first ids decoded
            assert c.get("/dashboard", params={"key": "sesame"}).text.count("<svg") >= 2
    finally:
        assert srv.stop() in (0, 143), srv.tail()
