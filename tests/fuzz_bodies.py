"""Hostile JSON bodies and the per-case checks that the intake fuzz modules (tests/protocol/test_fuzz_intake.py,
test_fuzz_routes.py) share against the keyed server.

`hostile` draws wrong types, huge and tiny numbers (+-2^64, +-1e308, NaN / Infinity / 1e400 as raw JSON text),
strings with lone surrogates and NULs, deep nesting; `either(valid)` is a valid value two times in three.
`check_case` posts one body and asserts what every case must hold: below 500 within CASE_BOUND_S, a refusal in
the route's error shape (`Shape`) with a message, a stream that ends as the route ends it, the keep-alive
connection kept, /health answering.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass
from typing import Callable

import httpx
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from radixlang_runtime.server.anthropic_errors import ERROR_TYPES
from server_utils import KEYED_KEY

AUTH = {"Authorization": f"Bearer {KEYED_KEY}", "content-type": "application/json"}
CASE_BOUND_S = 30.0  # generous (a loaded 2-core CI box); the bugs were hangs and 18 s stalls
SERVED = "SmolLM2-135M-Instruct"
FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                       HealthCheck.function_scoped_fixture])  # `tally` spans the examples on purpose


def client_addr(r: httpx.Response):
    """The client side's (host, port) of the connection r came on; None once that socket is closed."""
    try:
        return r.extensions["network_stream"].get_extra_info("client_addr")
    except OSError:
        return None


def post_raw(client: httpx.Client, path: str, body: bytes) -> tuple[httpx.Response, bytes, float]:
    t0 = time.monotonic()
    with client.stream("POST", path, content=body) as r:
        addr = client_addr(r)
        data = r.read()
    r.addr = addr
    return r, data, time.monotonic() - t0


def assert_serves(client: httpx.Client) -> None:
    r = client.post("/generate", json={"text": "Still there?", "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 1, r.text


def assert_idle_and_whole(client: httpx.Client, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        st_ = client.get("/server_info").json()["stats"]
        if st_["num_running_reqs"] == 0 and st_["num_waiting_reqs"] == 0:
            break
        assert time.monotonic() < deadline, st_
        time.sleep(0.05)
    assert st_["free_slots"] + st_["cached_slots"] == st_["total_slots"], st_


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def j(obj) -> bytes:
    return json.dumps(obj).encode()


# ------------------------------------------------------------------------------ values
RAW = "\x01raw{}\x01"  # placeholders json.dumps escapes; to_json writes the raw text in their place


@dataclass(frozen=True)
class Raw:
    """A value written into the JSON text as-is (NaN, 1e400, deep nesting). Not a str subclass: Hypothesis
    records a drawn str subclass as a choice of unknown type (KeyError in its data tree)."""
    text: str


EDGE_INTS = [0, 1, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, -(2**64), 10**30]
EDGE_FLOATS = [0.0, -0.0, 5e-324, 1e-308, 1e308, -1e308, 1.5, math.nan, math.inf, -math.inf]
ODD_STRINGS = ["", "no", "true", "1", "\ud800", "a\udfffb", "\x00", "nul\x00byte", "x" * 300, "é漢😀"]
RAWS = [Raw("1e400"), Raw("-1e400"), Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw(deep(65).decode()),
        Raw(deep(3000).decode())]
scalars = st.one_of(st.none(), st.booleans(), st.sampled_from(EDGE_INTS), st.integers(), st.sampled_from(EDGE_FLOATS),
                    st.floats(), st.sampled_from(ODD_STRINGS), st.text(max_size=6), st.sampled_from(RAWS))
hostile = st.recursive(scalars, lambda ch: st.lists(ch, max_size=3) | st.dictionaries(st.text(max_size=4), ch,
                                                                                     max_size=3), max_leaves=6)
# a token budget that is small or refused (never a valid big one: each case must stay quick)
max_tokens = st.integers(0, 3) | hostile.filter(lambda v: v is not None and not (type(v) is int and 4 <= v <= 10**5))
texts = st.text(max_size=12)
ids = st.lists(st.integers(0, 1000), min_size=1, max_size=6)


def either(valid: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(valid, valid, hostile)


def valid(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """`either`'s stand-in for building a body strategy whose fields are all valid (for `one_hostile`)."""
    return strategy


BUDGETS = ("max_tokens", "max_output_tokens", "max_completion_tokens", "n_predict")  # each case stays quick


def _slots(value, out: list) -> list:
    """Every (container, key) of a JSON value, and a new key per object (an unknown field at that depth)."""
    if isinstance(value, dict):
        out.append((value, "x_unknown"))
        for k, v in value.items():
            out.append((value, k))
            _slots(v, out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append((value, i))
            _slots(v, out)
    return out


@st.composite
def one_hostile(draw, bodies: st.SearchStrategy):
    """A body of `bodies` (built with `valid`) with exactly one value, at any depth, made hostile: the parse
    gets past the fields before it and meets the bad one deep in the body."""
    body = copy.deepcopy(draw(bodies))  # st.just values are shared objects
    container, key = draw(st.sampled_from(_slots(body, [])))
    container[key] = draw(max_tokens if key in BUDGETS else hostile)
    return body


def to_json(body) -> bytes:
    raws: list[str] = []

    def swap(v):
        if isinstance(v, Raw):
            raws.append(v.text)
            return RAW.format(len(raws) - 1)
        if isinstance(v, list):
            return [swap(x) for x in v]
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        return v

    text = json.dumps(swap(body))  # ensure_ascii: surrogates and NULs travel as \u escapes
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(RAW.format(i)), raw, 1)
    return text.encode()


# ------------------------------------------------------------------------------ a route's answers
NOT_FOUND_CODES = ("model_not_found", "not_found")  # OpenAI's codes of a 404: an unknown model, a stored response


def one_error(body: dict, status: int) -> str:
    """The one error shape (http_common.error_body): {"error": {"message", "type", "param", "code"}}, the code
    the status (a 404 may name OpenAI's code instead)."""
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"], body
    assert err["code"] in ((status, *NOT_FOUND_CODES) if status == 404 else (status,)), body
    return err["message"]


def anthropic_error(body: dict, status: int) -> str:
    """Anthropic's: {"type": "error", "error": {"type", "message"}}, the type from the status."""
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    err = body["error"]
    assert err["type"] == ERROR_TYPES.get(status, "invalid_request_error"), (status, body)
    assert isinstance(err["message"], str) and err["message"], body
    return err["message"]


def sse_data(data: bytes) -> list[str]:
    return [line[6:] for line in data.decode().splitlines() if line.startswith("data: ")]


def openai_stream_end(data: bytes) -> None:
    events = sse_data(data)
    assert events[-1] == "[DONE]" and not any('"error"' in e[:10] for e in events), events[-3:]


def typed_stream_end(*last: str) -> Callable[[bytes], None]:
    """A stream of typed events (Anthropic's, the Responses API's, /infill's) whose last event is one of `last`
    and none an error."""
    def check(data: bytes) -> None:
        events = [json.loads(e) for e in sse_data(data)]
        assert events and events[-1].get("type") in last, events[-3:]
        assert not any(e.get("type") == "error" for e in events), events
    return check


@dataclass(frozen=True)
class Shape:
    error: Callable[[dict, int], str]  # asserts a refusal's body is the route's error shape, returns the message
    stream_end: Callable[[bytes], None]  # asserts a 200 stream ended as the route ends it


OPENAI = Shape(one_error, openai_stream_end)


class Tally:
    """Per fuzz test: cases seen, and when the last answer came (for the keep-alive check)."""

    def __init__(self):
        self.cases = 0
        self.last: tuple[float, object, int] | None = None  # (time, client address, status)


def check_case(client: httpx.Client, path: str, body, tally: Tally, shape: Shape = OPENAI) -> None:
    r, data, elapsed = post_raw(client, path, to_json(body))
    assert r.status_code < 500, (r.status_code, data[:500], to_json(body)[:500])
    assert elapsed < CASE_BOUND_S, (elapsed, to_json(body)[:500])
    if r.status_code >= 400:
        shape.error(json.loads(data), r.status_code)
    elif r.headers["content-type"].startswith("text/event-stream"):
        shape.stream_end(data)
    else:
        json.loads(data)
    now = time.monotonic()
    if tally.last is not None and now - elapsed - tally.last[0] < 1.0 and tally.last[2] != 413:
        assert r.addr == tally.last[1], "a response closed the keep-alive connection"
    tally.last = (now, r.addr, r.status_code)
    assert client.get("/health").status_code == 200
    tally.cases += 1
    if tally.cases % 25 == 0:
        assert_serves(client)
