"""The API key's reach (docs/SERVER_SECURITY.md): /metrics is behind --api-key unless --metrics-no-auth, the
health routes are open, a pin belongs to the key that made it and an unknown pin is a 404, a pin's ttl_s is
bounded. The app over a stub tokenizer manager (the routes' own code, no model)."""

from __future__ import annotations

import types

import pytest
from fastapi.testclient import TestClient

from radixlang_runtime.server import services
from radixlang_runtime.server.http_common import ServerState
from radixlang_runtime.server.http_server import create_app
from radixlang_runtime.server.metrics import ServerMetrics
from radixlang_runtime.server_args import ServerArgs

STATS = dict(num_running_reqs=0, num_waiting_reqs=0, total_slots=100, free_slots=100, evictable_slots=0,
             prefill_tokens_cached=0, prefill_tokens_computed=0, num_retractions=0, new_token_ratio=0.5)
KEY = "the-key"


class StubTM:
    """What /metrics, /health and the pin routes need of the TokenizerManager; pins kept with their owner."""

    def __init__(self):
        self.dead = None
        self.metrics = ServerMetrics("m")
        self.limits = types.SimpleNamespace(vocab_size=100, context_len=64)
        self.pins: dict[str, str] = {}

    async def health(self):
        return None

    async def get_stats(self):
        return STATS

    async def run_intake(self, fn, *args, size=0):
        return fn(*args)

    def encode_text(self, text):
        return [ord(c) % 100 for c in text]

    async def pin_prefix(self, input_ids, ttl_s=None, owner=""):
        pin_id = f"pin-{len(self.pins)}"
        self.pins[pin_id] = owner
        return {"pin_id": pin_id, "pinned_len": 0, "input_len": len(input_ids)}

    async def unpin_prefix(self, pin_id, owner=""):
        if self.pins.get(pin_id) != owner:
            return False
        del self.pins[pin_id]
        return True


def _client(**args) -> tuple[TestClient, StubTM]:
    tm = StubTM()
    return TestClient(create_app(ServerState(ServerArgs(enable_metrics=True, **args), tm, "/m", "m", {}))), tm


def test_metrics_needs_the_key_unless_metrics_no_auth():
    auth = {"Authorization": f"Bearer {KEY}"}
    client, _ = _client(api_key=KEY)
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    r = client.get("/metrics", headers=auth)
    assert r.status_code == 200 and "radixlang:num_client_disconnects_total" in r.text
    assert client.get("/health").status_code == client.get("/ping").status_code == 200  # the probes stay open
    open_client, _ = _client(api_key=KEY, metrics_no_auth=True)
    assert open_client.get("/metrics").status_code == 200
    assert open_client.get("/server_info").status_code == 401  # only /metrics opens
    keyless, _ = _client()
    assert keyless.get("/metrics").status_code == 200


def test_metrics_no_auth_without_a_key_or_metrics_is_refused_by_name():
    for kw in ({"metrics_no_auth": True}, {"metrics_no_auth": True, "enable_metrics": True},
               {"metrics_no_auth": True, "api_key": KEY}):
        with pytest.raises(ValueError, match="metrics_no_auth needs enable_metrics and api_key"):
            ServerArgs(**kw)


def test_a_pin_is_its_keys_and_an_unknown_one_is_a_404():
    client, tm = _client(api_key=KEY)
    auth = {"Authorization": f"Bearer {KEY}"}
    pin = client.post("/pin_prefix", headers=auth, json={"input_ids": [1, 2], "ttl_s": 60}).json()
    assert tm.pins[pin["pin_id"]] == services.pin_owner(KEY) != ""
    r = client.post("/unpin_prefix", headers=auth, json={"pin_id": "pin-unknown"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "pin_id"
    tm.pins["pin-theirs"] = services.pin_owner("another key")
    assert client.post("/unpin_prefix", headers=auth, json={"pin_id": "pin-theirs"}).status_code == 404
    assert "pin-theirs" in tm.pins
    r = client.post("/unpin_prefix", headers=auth, json={"pin_id": pin["pin_id"]})
    assert r.status_code == 200 and r.json() == {"pin_id": pin["pin_id"], "success": True}
    for ttl in (1e300, 86401):
        r = client.post("/pin_prefix", headers=auth, json={"input_ids": [1], "ttl_s": ttl})
        assert r.status_code == 400 and r.json()["error"]["param"] == "ttl_s" and "86400" in r.text, r.text
    keyless, tm = _client()
    pin = keyless.post("/pin_prefix", json={"input_ids": [1]}).json()
    assert tm.pins[pin["pin_id"]] == ""  # no key: the unguessable id is the guard
