"""RouterArgs: the router's flags (SGLang's sglang_router.launch_router names where they exist), parsed
and checked once; a flag the router cannot honour is refused by name (ValueError / argparse error).

    --pd-disaggregation --prefill URL [BOOTSTRAP_PORT] ... --decode URL ...
    --worker-urls URL ...            (without --pd-disaggregation: plain co-located servers)

Policies come from placement.py (the DP router's cache_aware / round_robin / shortest_queue):
--policy is the prefill side's (and the workers'), --prefill-policy overrides it for prefill,
--decode-policy picks the decode side (default shortest_queue: in-flight requests per decode).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlparse

from radixlang_runtime.placement import POLICIES, PlacementConfig


@dataclass(frozen=True)
class InstanceSpec:
    url: str  # http://host:port, no trailing slash
    bootstrap_port: Optional[int] = None  # prefill only; None: read from its /server_info


@dataclass(frozen=True)
class RouterArgs:
    host: str = "127.0.0.1"
    port: int = 30000
    pd_disaggregation: bool = False
    prefill: tuple[InstanceSpec, ...] = ()
    decode: tuple[InstanceSpec, ...] = ()
    worker_urls: tuple[InstanceSpec, ...] = ()
    policy: str = "cache_aware"
    prefill_policy: Optional[str] = None  # None: --policy
    decode_policy: str = "shortest_queue"
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.0001
    max_tree_size: int = 1 << 22  # per instance, in key units (UTF-8 bytes of the prompt)
    # Health: an instance is down after health_failure_threshold failed checks in a row (at once when it
    # refuses the connection), up again after health_success_threshold good ones. Each check is bounded.
    health_check_interval_secs: float = 1.0
    health_check_timeout_secs: float = 2.0
    health_failure_threshold: int = 2
    health_success_threshold: int = 1
    request_timeout_secs: float = 600.0  # the whole upstream call; a silent upstream fails the request then
    connect_timeout_secs: float = 2.0
    log_level: str = "info"

    def __post_init__(self) -> None:
        if self.pd_disaggregation:
            if not self.prefill or not self.decode:
                raise ValueError("--pd-disaggregation needs at least one --prefill and one --decode")
            if self.worker_urls:
                raise ValueError("--worker-urls is for co-located servers; with --pd-disaggregation give "
                                 "--prefill and --decode")
        else:
            if self.prefill or self.decode:
                raise ValueError("--prefill / --decode need --pd-disaggregation")
            if not self.worker_urls:
                raise ValueError("give --worker-urls (co-located servers) or --pd-disaggregation with "
                                 "--prefill and --decode")
        urls = [s.url for s in (*self.prefill, *self.decode, *self.worker_urls)]
        for u in urls:
            p = urlparse(u)
            if p.scheme not in ("http", "https") or not p.hostname or p.path not in ("", "/"):
                raise ValueError(f"instance URL {u!r} must look like http://host:port")
        dup = sorted({u for u in urls if urls.count(u) > 1})
        if dup:
            raise ValueError(f"instance URL given twice: {dup}")
        for s in (*self.decode, *self.worker_urls):
            if s.bootstrap_port is not None:
                raise ValueError(f"a bootstrap port belongs to a prefill instance, not {s.url}")
        for name in ("policy", "prefill_policy", "decode_policy"):
            value = getattr(self, name)
            if value is not None and value not in POLICIES:
                raise ValueError(f"--{name.replace('_', '-')} {value!r}: expected one of {POLICIES}")
        for name in ("health_check_interval_secs", "health_check_timeout_secs", "request_timeout_secs",
                     "connect_timeout_secs"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        for name in ("health_failure_threshold", "health_success_threshold"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        self.placement_config("decode")  # PlacementConfig checks thresholds and tree size

    def placement_config(self, role: str) -> PlacementConfig:
        """The placement.py config for one group of instances (role: prefill / decode / worker)."""
        policy = {"prefill": self.prefill_policy or self.policy, "decode": self.decode_policy}.get(role, self.policy)
        return PlacementConfig(policy=policy, cache_threshold=self.cache_threshold,
                            balance_abs_threshold=self.balance_abs_threshold,
                            balance_rel_threshold=self.balance_rel_threshold,
                            tree_capacity_tokens=self.max_tree_size)


def _url(u: str) -> str:
    return u.rstrip("/")


def _prefill_spec(items: list[str]) -> InstanceSpec:
    if len(items) not in (1, 2):
        raise ValueError(f"--prefill takes URL [BOOTSTRAP_PORT], got {items}")
    port: Optional[int] = None
    if len(items) == 2 and items[1].lower() != "none":
        if not items[1].isdigit() or not 0 < int(items[1]) < 65536:
            raise ValueError(f"--prefill {items[0]}: bootstrap port must be 1..65535 (or none), got {items[1]!r}")
        port = int(items[1])
    return InstanceSpec(_url(items[0]), port)


def build_parser() -> argparse.ArgumentParser:
    d = RouterArgs.__dataclass_fields__
    p = argparse.ArgumentParser(prog="python -m radixlang_runtime.launch_router", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default=d["host"].default)
    p.add_argument("--port", type=int, default=d["port"].default)
    p.add_argument("--pd-disaggregation", action="store_true")
    p.add_argument("--prefill", nargs="+", action="append", default=[], metavar="URL [BOOTSTRAP_PORT]")
    p.add_argument("--decode", action="append", default=[], metavar="URL")
    p.add_argument("--worker-urls", nargs="+", default=[], metavar="URL")
    p.add_argument("--policy", default=d["policy"].default, choices=POLICIES)
    p.add_argument("--prefill-policy", default=None, choices=POLICIES)
    p.add_argument("--decode-policy", default=d["decode_policy"].default, choices=POLICIES)
    for name in ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold", "max_tree_size",
                 "health_check_interval_secs", "health_check_timeout_secs", "health_failure_threshold",
                 "health_success_threshold", "request_timeout_secs", "connect_timeout_secs"):
        default = d[name].default
        p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    p.add_argument("--log-level", default=d["log_level"].default)
    return p


def parse_args(argv: Optional[list[str]] = None) -> RouterArgs:
    """argv -> RouterArgs; a bad combination exits with argparse's usage error naming it."""
    p = build_parser()
    ns = p.parse_args(argv)
    try:
        kw = vars(ns)
        kw["prefill"] = tuple(_prefill_spec(items) for items in kw["prefill"])
        kw["decode"] = tuple(InstanceSpec(_url(u)) for u in kw["decode"])
        kw["worker_urls"] = tuple(InstanceSpec(_url(u)) for u in kw["worker_urls"])
        return RouterArgs(**kw)
    except ValueError as e:
        p.error(str(e))
        raise  # unreachable: p.error exits
