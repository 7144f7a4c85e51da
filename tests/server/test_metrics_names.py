"""/metrics under SGLang's names: every radixlang: sample has an sglang: twin (same value, the labels plus
model_name), and the names SGLang's Grafana dashboard queries are there. ServerMetrics itself, no server."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from radixlang_runtime.server.metrics import ServerMetrics
from server_utils import STATS

DASHBOARD = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate",
             "sglang:gen_throughput", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
             "sglang:num_requests_total", "sglang:time_to_first_token_seconds_bucket",
             "sglang:e2e_request_latency_seconds_bucket", "sglang:time_per_output_token_seconds_bucket",
             "sglang:inter_token_latency_seconds_bucket", "sglang:queue_time_seconds_bucket")


def samples(text: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_every_metric_is_served_under_its_sglang_name_too():
    m = ServerMetrics("smollm2")
    m.on_tokens(0.0, None, 0.05, 1)
    m.on_tokens(0.0, 0.05, 0.09, 4)
    m.on_finish(0.3, 0.01, 7, 2, aborted=False)
    m.on_abandoned()
    got = samples(m.render(STATS).decode())
    ours = {k: v for k, v in got.items() if k[0].startswith("radixlang:")}
    assert len(ours) > 20
    for (name, labels), value in ours.items():
        twin = ("sglang:" + name[len("radixlang:"):], tuple(sorted((*labels, ("model_name", "smollm2")))))
        assert got[twin] == value, twin
    names = {k[0] for k in got}
    assert set(DASHBOARD) <= names
    assert got[("sglang:num_requests_total", (("model_name", "smollm2"),))] == 2
    assert got[("sglang:time_per_output_token_seconds_count", (("model_name", "smollm2"),))] == 4
    assert got[("sglang:token_usage", (("model_name", "smollm2"),))] == 0.4
