"""The DSL's cache_salt (NativeBackend.cache_salt, here over the in-process Engine): a salted backend's programs
reuse the prefix cache only of its salt; the text is the same either way."""

from __future__ import annotations

import uuid

import radixlang as sgl
from radixlang.backend.engine import EngineBackend


@sgl.function
def story(s, opening):
    s += opening + sgl.gen("rest", max_tokens=4, temperature=0)


def test_a_salted_backend_shares_the_cache_within_its_salt(engine_fp32):
    opening = (f"Log {uuid.uuid4().hex}: the caravan left the oasis before dawn, its camels loaded with salt and "
               "dates, and followed the dunes east toward the market town")
    salted, other = EngineBackend(engine=engine_fp32), EngineBackend(engine=engine_fp32)
    salted.cache_salt, other.cache_salt = uuid.uuid4().hex, uuid.uuid4().hex
    runs = []
    for b in (salted, salted, other):  # one after the other: a run's state fills in on a thread of its own
        runs.append(story.run(opening=opening, backend=b))
        runs[-1].sync()
    cached = [r.get_meta_info("rest")["cached_tokens"] for r in runs]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0, cached
    assert len({r["rest"] for r in runs}) == 1


@sgl.function
def pick(s, opening):
    s += opening + sgl.gen("rest", max_tokens=4, temperature=0)
    s += " It was bound for the " + sgl.select("place", choices=["market", "coast"])


def test_a_salted_http_backend_selects_and_generates_within_its_salt():
    """The HTTP link (HttpBackend): gen and select's scoring calls carry the salt too."""
    from radixlang.backend.http import HttpBackend
    from server_utils import FP32_FLAGS, shared_server

    url = shared_server(*FP32_FLAGS).url
    opening = f"Log {uuid.uuid4().hex}: the caravan left the oasis before dawn, loaded with salt and dates."
    salted, other = HttpBackend(url), HttpBackend(url)
    salted.cache_salt, other.cache_salt = uuid.uuid4().hex, uuid.uuid4().hex
    runs = []
    for b in (salted, salted, other):  # one after the other, so the first salted run is the one that fills the cache
        runs.append(pick.run(opening=opening, backend=b))
        runs[-1].sync()
    cached = [r.get_meta_info("rest")["cached_tokens"] for r in runs]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0, cached
    assert len({(r["place"], r["rest"]) for r in runs}) == 1
