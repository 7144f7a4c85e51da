"""One prompt parse and one sampling-parameter parse per request, on every route: native /generate, OpenAI
completions and chat, the DSL's ZeroMQ link (a real server whose processes count every call, through a
sitecustomize the test puts on their path), the PD router (each of the prefill and the decode parses once, the
router parses no prompt), and the in-process Engine. The scheduler never parses again
(its decode is trusted: protocol/messages.py), so the counts over all of the server's processes are exactly
one each."""

from __future__ import annotations

import contextlib
import os
import textwrap
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import pd_servers
from router_utils import RouterProcess, wait_for
from server_utils import ServerProcess, free_port
from tiny_checkpoints import build_tiny

COUNTER = textwrap.dedent('''
    """Counts SamplingParams.from_dict and PromptEncoder.encode / encode_chat calls, every process."""
    import os

    _OUT = os.environ.get("RADIXLANG_TEST_PARSE_LOG")
    if _OUT:
        from radixlang_runtime.prompt_encoder import PromptEncoder
        from radixlang_runtime.protocol.sampling_params import SamplingParams

        def _log(what):
            with open(_OUT, "a") as f:
                f.write(f"{os.getpid()} {what}\\n")

        _from_dict = SamplingParams.from_dict.__func__

        def from_dict(cls, d):
            _log("sampling")
            return _from_dict(cls, d)

        SamplingParams.from_dict = classmethod(from_dict)
        for _name in ("encode", "encode_chat"):
            def _wrap(orig, name=_name):
                def method(self, *a, **k):
                    _log("prompt")
                    return orig(self, *a, **k)
                return method
            setattr(PromptEncoder, _name, _wrap(getattr(PromptEncoder, _name)))
''')


@contextlib.contextmanager
def _counting_env(tmp_path_factory):
    """While open, processes started inherit the counting sitecustomize; yields the log they append to."""
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(COUNTER)
    log = site / "calls.log"
    old = {k: os.environ.get(k) for k in ("PYTHONPATH", "RADIXLANG_TEST_PARSE_LOG")}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), old["PYTHONPATH"]) if p)
    os.environ["RADIXLANG_TEST_PARSE_LOG"] = str(log)
    try:
        yield log
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """The counted server (the embedded model, its ZeroMQ link) and a prefill and a decode (pd_servers' flags, a
    tiny checkpoint), all three started side by side (most of this module's time), then launch_router
    --pd-disaggregation over the pair; every process counting, into one log (the tests run one at a time)."""
    d = tmp_path_factory.mktemp("tiny_llama_pd")
    pd = pd_servers.Cluster(str(d), build_tiny(d, "LlamaConfig", pd_servers.TINY, {}), free_port())
    port = free_port()
    srv = router = None
    try:
        with _counting_env(tmp_path_factory) as log:
            with ThreadPoolExecutor(3) as ex:
                f_srv = ex.submit(ServerProcess, "--max-total-tokens", "4096", "--frontend-port", str(port))
                f_prefill, f_decode = ex.submit(pd.start_prefill), ex.submit(pd.start_decode, 0)
            srv = f_srv.result()
            srv.frontend = f"tcp://127.0.0.1:{port}"
            prefill, decode = f_prefill.result(), f_decode.result()
            router = RouterProcess("--pd-disaggregation", "--prefill", prefill.url, "--decode", decode.url,
                                   "--health-check-interval-secs", "0.2", "--health-check-timeout-secs", "60",
                                   "--request-timeout-secs", "600")
        wait_for(lambda: all(i["eligible"] for g in router.info()["groups"].values() for i in g["instances"]),
                 600, lambda: router.info())
        yield srv, router, prefill, decode, log
    finally:
        if router is not None:
            router.stop()
        if srv is not None:
            srv.stop()
        pd.stop()


@pytest.fixture(scope="module")
def counted(started):
    srv, _, _, _, log = started
    return srv, log


@pytest.fixture(scope="module")
def counted_pd(started):
    _, router, prefill, decode, log = started
    return router, prefill, decode, log


def _calls(log) -> dict[str, int]:
    out = {"sampling": 0, "prompt": 0}
    for line in log.read_text().splitlines() if log.exists() else []:
        out[line.split()[1]] += 1
    return out


def _one_request(log, send) -> dict[str, int]:
    log.write_text("")
    send()
    return _calls(log)


def test_the_counter_sees_the_server(counted):
    """The counting reaches the server's processes (else every count below would be 0, and fail)."""
    srv, log = counted
    got = _one_request(log, lambda: httpx.post(srv.url + "/generate", json={"text": "Hi", "sampling_params": {
        "max_new_tokens": 1}}, timeout=120).raise_for_status())
    assert got == {"sampling": 1, "prompt": 1}


@pytest.mark.parametrize("route,body", [
    ("/generate", {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}),
    ("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 2,
                              "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 2,
                              "temperature": 0, "stream": True}),
])
def test_http_routes_parse_once(counted, route, body):
    srv, log = counted
    got = _one_request(log, lambda: httpx.post(srv.url + route, json=body, timeout=120).raise_for_status())
    assert got == {"sampling": 1, "prompt": 1}


def test_the_zeromq_link_parses_once(counted):
    import radixlang as sgl

    srv, log = counted
    backend = sgl.RuntimeEndpoint(srv.frontend)

    @sgl.function
    def one(s):
        s += "The capital of France is" + sgl.gen("x", max_tokens=2, temperature=0)

    def send():
        state = one.run(backend=backend)
        assert state.error() is None, state.error()

    got = _one_request(log, send)
    backend.shutdown()
    assert got == {"sampling": 1, "prompt": 1}


def test_the_engine_parses_once(engine, monkeypatch):
    from radixlang_runtime.prompt_encoder import PromptEncoder
    from radixlang_runtime.protocol.sampling_params import SamplingParams

    calls = {"sampling": 0, "prompt": 0}
    from_dict = SamplingParams.from_dict.__func__
    encode = PromptEncoder.encode

    def counted_from_dict(cls, d):
        calls["sampling"] += 1
        return from_dict(cls, d)

    def counted_encode(self, text):
        calls["prompt"] += 1
        return encode(self, text)

    monkeypatch.setattr(SamplingParams, "from_dict", classmethod(counted_from_dict))
    monkeypatch.setattr(PromptEncoder, "encode", counted_encode)
    engine.generate("The capital of France is", {"max_new_tokens": 2, "temperature": 0})
    assert calls == {"sampling": 1, "prompt": 1}


def test_the_pd_router_route_parses_once_per_server(counted_pd):
    """The router sends the same body to the prefill and the decode: each server parses it once, the router
    parses no prompt and no sampling parameters."""
    router, prefill, decode, log = counted_pd
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    log.write_text("")
    httpx.post(router.url + "/generate", json=body, timeout=600).raise_for_status()
    by_pid: dict[int, dict[str, int]] = {}
    for line in log.read_text().splitlines():
        pid, what = line.split()
        by_pid.setdefault(int(pid), {"sampling": 0, "prompt": 0})[what] += 1

    def of(pids):
        return {k: sum(by_pid.get(p, {}).get(k, 0) for p in pids) for k in ("sampling", "prompt")}

    prefill_pids, decode_pids = pd_servers.pids_of(prefill), pd_servers.pids_of(decode)
    assert of(prefill_pids) == {"sampling": 1, "prompt": 1}
    assert of(decode_pids) == {"sampling": 1, "prompt": 1}
    assert of([router.proc.pid]) == {"sampling": 0, "prompt": 0}
    assert set(by_pid) <= set(prefill_pids) | set(decode_pids)  # nobody else parsed it
