"""PD with LoRA adapters through real servers (a tiny float32 Llama and two peft adapters made here,
lora_adapters.py): a prefill serving alpha and beta, a decode serving the same files under other ids (listed
the other way round: the transfer carries the adapters' content identity, not their ids), and a decode whose
`alpha` is beta's files. Through launch_router, the base and both adapters in one mixed set of requests equal
transformers + peft merged per adapter, token for token; the decode's radix cache keys a transferred prefix
under its adapter (the same prompt under another adapter or the base gets no hit, under the same adapter it
does); an adapter whose content differs between the prefill and the decode fails that request on both
servers naming the adapter, and the base still pairs them; every allocator is whole after. First, without
servers: the identity check, the decode's LoRA admission bounds and the wire check of the identity field."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from lora_adapters import NEW, OTHER, PROMPT, SP, build_base_and_adapters
from router_utils import RouterProcess, wait_for
from server_utils import ServerProcess, assert_idle_and_whole, free_port

pytestmark = pytest.mark.timeout(1800)  # three servers start side by side: minutes on a loaded 2-core machine
START_S = 900.0
T = 600.0  # client bound per request (a loaded machine)
THIRD = [(11 * i + 500) % 4000 + 10 for i in range(24)]
COMMON = ("--dtype", "float32", "--max-total-tokens", "4096", "--chunked-prefill-size", "16", "--frontend-port", "-1",
          "--debug-check-integrity", "--disaggregation-heartbeat-timeout", "5",
          "--disaggregation-transfer-timeout", "300")
ROUTER_FLAGS = ["--health-check-interval-secs", "0.2", "--health-check-timeout-secs", "60",
                "--health-failure-threshold", "2", "--request-timeout-secs", str(T)]


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    root = tmp_path_factory.mktemp("pd_lora")
    want = build_base_and_adapters(root, (PROMPT, OTHER, THIRD))
    boot = free_port()
    common = ("--model-path", str(root / "base"), *COMMON)
    flags = [(*common, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot),
              "--lora-paths", f"alpha={root / 'alpha'}", f"beta={root / 'beta'}"),
             (*common, "--disaggregation-mode", "decode", "--lora-paths", f"beta={root / 'beta'}",
              f"alpha={root / 'alpha'}"),
             (*common, "--disaggregation-mode", "decode", "--lora-paths", f"alpha={root / 'beta'}")]
    with ThreadPoolExecutor(3) as ex:  # started side by side
        futures = [ex.submit(ServerProcess, *f, timeout=START_S) for f in flags]
    started = [f.result() for f in futures if f.exception() is None]
    router = None
    try:
        if len(started) < 3:
            raise next(f.exception() for f in futures if f.exception() is not None)
        prefill, decode, wrong = started
        router = RouterProcess("--pd-disaggregation", "--prefill", prefill.url, "--decode", decode.url,
                               *ROUTER_FLAGS)
        wait_for(lambda: all(i["eligible"] for g in router.info()["groups"].values() for i in g["instances"]), T,
                 lambda: router.info())
        yield {"prefill": prefill, "decode": decode, "wrong": wrong, "router": router, "boot": boot, "want": want}
    finally:
        if router is not None:
            assert router.stop() == 0, router.tail()
        for s in started:
            s.stop()


def test_pd_adapters_check_identities_and_bound_the_batch():
    from radixlang_runtime.disagg.adapters import PDAdapters

    reads = []

    def identity_of(lid):
        reads.append(lid)
        return {1: "aa" * 16, 2: "bb" * 16}.get(lid)

    resident, in_use = {1}, {1}

    def residency(lid, busy):
        assert lid not in busy
        resident.add(lid)
        return True

    ad = PDAdapters({1: "alpha", 2: "beta"}.get, identity_of, max_per_batch=2, in_use=lambda: set(in_use),
                    residency=residency)
    assert ad.mismatch(1, "aa" * 16, "decode") is None and ad.mismatch(0, "", "prefill") is None
    assert ad.mismatch(1, "aa" * 16, "decode") is None and reads == [1]  # computed once per id
    why = ad.mismatch(1, "bb" * 16, "prefill")
    assert why.startswith("LoRA adapter 'alpha' differs between the prefill and the decode server") and "bbbb" in why
    assert "the base model" in ad.mismatch(0, "aa" * 16, "decode")  # base K/V never serves an adapter, nor back
    assert "the base model" in ad.mismatch(1, "", "decode")
    assert "cannot be read" in ad.mismatch(3, "cc", "decode")  # no identity here: refused, never served
    assert ad.ready(0, set()) and ad.ready(1, set())
    assert ad.ready(2, set()) and resident == {1, 2}  # the second adapter may join (bound 2), made resident
    assert not ad.ready(2, {3})  # adapters 1 and 3 running / receiving: a third waits
    in_use.clear()
    assert ad.ready(2, {3})


def test_the_identity_field_is_checked_on_the_wire():
    from radixlang_runtime.disagg.wire import shape_problem
    from radixlang_runtime.protocol.messages import PDDone, PDRegister, decode, encode

    ok = PDRegister(1, 0, 10, 24, "ab" * 16)
    assert decode(encode(ok)) == ok and shape_problem(ok) is None
    assert shape_problem(PDRegister(1, 0, 10, 24, 5)) is not None
    assert shape_problem(PDDone(1, 7, 0, adapter="x" * 129)) is not None
    assert shape_problem(PDDone(1, 7, 0)) is None


def _generate(url: str, ids: list[int], adapter: str) -> httpx.Response:
    body = {"input_ids": ids, "sampling_params": SP, **({"lora_path": adapter} if adapter else {})}
    return httpx.post(url + "/generate", json=body, timeout=T)


def _prefix_hits(srv: ServerProcess) -> int:
    return httpx.get(srv.url + "/server_info", timeout=30).json()["stats"]["disaggregation"]["prefix_hit_tokens"]


def test_base_and_two_adapters_through_the_router_equal_peft(pd):
    jobs = [(name, p) for name in ("", "alpha", "beta") for p in (PROMPT, OTHER)]
    with ThreadPoolExecutor(len(jobs)) as ex:  # at once: mixed batches on both servers
        rs = list(ex.map(lambda j: _generate(pd["router"].url, j[1], j[0]), jobs))
    assert [r.status_code for r in rs] == [200] * len(jobs), [r.text for r in rs]
    got = [r.json()["output_ids"] for r in rs]
    assert got == [pd["want"][name][tuple(p)] for name, p in jobs]
    assert all(len(g) == NEW for g in got)
    assert len({tuple(g) for g, (_, p) in zip(got, jobs) if p is PROMPT}) == 3  # the adapters change the output


def test_the_decodes_radix_cache_keys_a_transferred_prefix_under_its_adapter(pd):
    router, decode, want = pd["router"].url, pd["decode"], pd["want"]
    seen = _prefix_hits(decode)
    for name, hit in (("alpha", False), ("beta", False), ("", False), ("alpha", True)):
        r = _generate(router, THIRD, name)
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == want[name][tuple(THIRD)]
        now = _prefix_hits(decode)
        assert (now > seen) is hit, (name, seen, now)
        seen = now


def test_adapter_content_differing_between_prefill_and_decode_fails_that_request(pd):
    body = {"input_ids": PROMPT, "sampling_params": SP, "lora_path": "alpha", "bootstrap_host": "127.0.0.1",
            "bootstrap_port": pd["boot"], "bootstrap_room": random.getrandbits(63)}
    with ThreadPoolExecutor(2) as ex:
        fp = ex.submit(httpx.post, pd["prefill"].url + "/generate", json=body, timeout=T)
        fd = ex.submit(httpx.post, pd["wrong"].url + "/generate", json=body, timeout=T)
        p, d = fp.result(), fd.result()
    assert (p.status_code, d.status_code) == (503, 503), (p.text, d.text)
    for r in (p, d):
        msg = r.json()["error"]["message"]
        assert "LoRA adapter 'alpha' differs between the prefill and the decode server" in msg, msg
    # the base pairs these two servers as usual
    body.update(bootstrap_room=random.getrandbits(63), lora_path=None)
    with ThreadPoolExecutor(2) as ex:
        fp = ex.submit(httpx.post, pd["prefill"].url + "/generate", json=body, timeout=T)
        fd = ex.submit(httpx.post, pd["wrong"].url + "/generate", json=body, timeout=T)
        p, d = fp.result(), fd.result()
    assert (p.status_code, d.status_code) == (200, 200), (p.text, d.text)
    assert d.json()["output_ids"] == pd["want"][""][tuple(PROMPT)]


def test_allocators_whole_after(pd):
    for s in ("prefill", "decode", "wrong"):
        with httpx.Client(base_url=pd[s].url, timeout=30) as cl:
            assert_idle_and_whole(cl)
        st = httpx.get(pd[s].url + "/server_info", timeout=30).json()["stats"]["disaggregation"]
        assert st["transfers_failed"] == (1 if s != "decode" else 0), (s, st)
