"""Prometheus metrics (`--enable-metrics`), names as in PROTOCOL.md, prefix `radixlang:`; every one is
also served as SGLang names it (`sglang:` prefix, label model_name = the served model name, the
inter-token latency also as `sglang:time_per_output_token_seconds`), so SGLang's Grafana dashboards work
unchanged: SGLangMirror renames the samples at each scrape (one set of instruments, two spellings).

Counters and histograms are fed by the TokenizerManager as results arrive; the gauges that describe
the scheduler (running / queued requests, token usage, cache hit rate, retractions, new_token_ratio,
n-gram speculation's draft / accepted token totals)
are refreshed from the scheduler's stats when /metrics is scraped.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.metrics_core import Metric

from radixlang_runtime.server.hicache_metrics import HiCacheMetrics

disable_created_metrics()  # no *_created samples: they double the output and nobody graphs them

P = "radixlang:"
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0,
                    20.0, 60.0, 120.0)


SGLANG = "sglang:"
# radixlang names (without prefix) SGLang also serves under another name (older dashboards use these)
SGLANG_ALIASES = {"inter_token_latency_seconds": "time_per_output_token_seconds"}


class SGLangMirror:
    """A collector that serves another registry's metrics under SGLang's names and model_name label."""

    def __init__(self, source: CollectorRegistry, model_name: str):
        self.source, self.model_name = source, model_name

    def collect(self):
        for fam in self.source.collect():
            base = fam.name[len(P):]
            for name in (base, SGLANG_ALIASES.get(base)):
                if name is None:
                    continue
                out = Metric(SGLANG + name, fam.documentation, fam.type)
                for s in fam.samples:
                    out.add_sample(SGLANG + name + s.name[len(fam.name):], {**s.labels, "model_name": self.model_name},
                                   s.value, s.timestamp, s.exemplar)
                yield out


class ServerMetrics:
    def __init__(self, model_name: str = "default") -> None:
        r = self.registry = CollectorRegistry()
        self.sglang = CollectorRegistry()
        self.sglang.register(SGLangMirror(r, model_name))
        self.hicache = HiCacheMetrics(r)  # the hierarchical cache's tiers (server/hicache_metrics.py)
        self.num_running_reqs = Gauge(P + "num_running_reqs", "Requests decoding or prefilling", registry=r)
        self.num_queue_reqs = Gauge(P + "num_queue_reqs", "Requests waiting for admission", registry=r)
        self.token_usage = Gauge(P + "token_usage", "Share of KV slots held by requests", registry=r)
        self.cache_hit_rate = Gauge(P + "cache_hit_rate", "Prompt tokens served by the radix cache / all", registry=r)
        self.gen_throughput = Gauge(P + "gen_throughput", "Generated tokens per second since the last scrape",
                                    registry=r)
        self.num_retracted_reqs = Gauge(P + "num_retracted_reqs", "Retractions so far", registry=r)
        self.new_token_ratio = Gauge(P + "new_token_ratio", "Decode reservation ratio", registry=r)
        self.spec_draft_tokens = Gauge(P + "spec_draft_tokens", "Draft tokens verified so far", registry=r)
        self.spec_accepted_tokens = Gauge(P + "spec_accepted_tokens", "Draft tokens accepted so far",
                                          registry=r)
        self.spec_accept_length = Gauge(P + "spec_accept_length", "Tokens per verification step (accepted draft "
                                        "tokens + 1), mean so far (NGRAM, STANDALONE)", registry=r)
        self.spec_verifications = Gauge(P + "spec_verifications", "Verified drafts so far by how many of their tokens "
                                        "were accepted (the accept-length histogram)", ["accepted"], registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Generated tokens", registry=r)
        self.cached_tokens = Counter(P + "cached_tokens", "Prompt tokens served from the cache", registry=r)
        self.num_requests = Counter(P + "num_requests", "Finished requests", registry=r)
        self.num_aborted_requests = Counter(P + "num_aborted_requests", "Aborted requests", registry=r)
        self.num_client_disconnects = Counter(P + "num_client_disconnects", "Non-streaming requests aborted as "
                                              "their client disconnected before the answer", registry=r)
        self.frontend_dropped_messages = Counter(P + "frontend_dropped_messages",
                                                 "Messages the ZeroMQ frontend dropped (malformed, or large "
                                                 "without the key)", registry=r)
        self.pd_dropped_messages = Gauge(P + "pd_dropped_messages", "Messages the PD bootstrap link dropped so far "
                                         "(failed checks, the secret, rate, a room another peer holds), by reason",
                                         ["reason"], registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Time to first token", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.itl = Histogram(P + "inter_token_latency_seconds", "Time between tokens", buckets=_LATENCY_BUCKETS,
                             registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Request latency", buckets=_LATENCY_BUCKETS,
                             registry=r)
        self.queue_time = Histogram(P + "queue_time_seconds", "Arrival at the scheduler to first admission",
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self._gen_since_scrape = 0
        self._last_scrape = time.perf_counter()

    def on_tokens(self, created: float, last_token_at: Optional[float], now: float, n: int) -> None:
        if last_token_at is None:
            self.ttft.observe(now - created)
        else:  # a chunk of n tokens since the last one: n gaps of equal share
            gap = (now - last_token_at) / n
            for _ in range(min(n, 64)):
                self.itl.observe(gap)
        self.generation_tokens.inc(n)
        self._gen_since_scrape += n

    def on_finish(self, e2e: float, queue_time: float, prompt_tokens: int, cached: int, aborted: bool) -> None:
        self.e2e.observe(e2e)
        self.queue_time.observe(queue_time)
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached)
        self.num_requests.inc()
        if aborted:
            self.num_aborted_requests.inc()

    def on_abandoned(self) -> None:
        """The client left before the end: the request was aborted."""
        self.num_requests.inc()
        self.num_aborted_requests.inc()

    def on_client_disconnect(self) -> None:
        """A non-streaming request's client left (server/client_watch.py); its abort counts in on_abandoned."""
        self.num_client_disconnects.inc()

    def render(self, stats: dict[str, Any]) -> bytes:
        now = time.perf_counter()
        self.gen_throughput.set(self._gen_since_scrape / max(now - self._last_scrape, 1e-6))
        self._gen_since_scrape, self._last_scrape = 0, now
        self.num_running_reqs.set(stats["num_running_reqs"])
        self.num_queue_reqs.set(stats["num_waiting_reqs"])
        total = stats["total_slots"]
        self.token_usage.set((total - stats["free_slots"] - stats["evictable_slots"]) / total)
        seen = stats["prefill_tokens_cached"] + stats["prefill_tokens_computed"]
        self.cache_hit_rate.set(stats["prefill_tokens_cached"] / seen if seen else 0.0)
        self.num_retracted_reqs.set(stats["num_retractions"])
        self.new_token_ratio.set(stats["new_token_ratio"])
        self.spec_draft_tokens.set(stats.get("spec_draft_tokens", 0))
        self.spec_accepted_tokens.set(stats.get("spec_accepted_tokens", 0))
        accept = stats.get("spec_accept_length") or {}
        self.spec_accept_length.set(accept.get("mean_accept_length", 0.0))
        for accepted, n in accept.get("histogram", {}).items():
            self.spec_verifications.labels(accepted=accepted).set(n)
        for reason, n in ((stats.get("disaggregation") or {}).get("dropped_by_reason") or {}).items():
            self.pd_dropped_messages.labels(reason=reason).set(n)
        self.hicache.render(stats)
        return generate_latest(self.registry) + generate_latest(self.sglang)
