"""ServerArgs' prefill-decode disaggregation settings: what the runtime would not honour is refused by name
(docs/DISAGGREGATION.md). Torch-free."""

from __future__ import annotations

from typing import Any


def check_disaggregation_args(args: Any) -> None:
    """Refuse PD settings the runtime would not honour, by name (docs/DISAGGREGATION.md)."""
    mode = args.disaggregation_mode
    if mode not in ("null", "prefill", "decode"):
        raise ValueError(f"disaggregation_mode must be null, prefill or decode; got {mode!r}")
    if args.disaggregation_transfer_backend != "zmq":
        raise ValueError(f"disaggregation_transfer_backend {args.disaggregation_transfer_backend!r} is not "
                         "implemented (zmq only: mooncake and nixl are not available here)")
    for name in ("disaggregation_transfer_timeout", "disaggregation_heartbeat_timeout"):
        v = getattr(args, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 3600:
            raise ValueError(f"{name} must be a number of seconds in (0, 3600]; got {v!r}")
    port = args.disaggregation_bootstrap_port
    if port is not None and mode != "prefill":
        raise ValueError("disaggregation_bootstrap_port applies to disaggregation_mode prefill only")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"disaggregation_bootstrap_port must be a port 1..65535; got {port}")
    if mode == "prefill" and port is None:
        args.disaggregation_bootstrap_port = 8998  # SGLang's default; /server_info reports the port in use
    _check_peers(args)
    if mode == "null":
        return
    # tp_size > 1 and nnodes > 1 work (rank 0 moves every rank's K/V heads: model/executor/tp_kv.py)
    for name, on in (("dp_size > 1", args.dp_size > 1), ("speculative_algorithm", bool(args.speculative_algorithm)),
                     ("enable_hierarchical_cache", args.enable_hierarchical_cache),
                     ("enable_priority_scheduling", args.enable_priority_scheduling),
                     ("max_queued_requests", args.max_queued_requests is not None)):
        if on:
            raise ValueError(f"{name} with disaggregation_mode {mode} is not implemented")

def _check_peers(args: Any) -> None:
    """The allow-list and the secret (bootstrap_peers.py): parsed here so a bad one fails the start."""
    from radixlang_runtime.protocol.bootstrap_peers import load_secret, parse_peers  # no torch

    mode = args.disaggregation_mode
    if args.disaggregation_prefill_peers is not None:
        if mode != "decode":
            raise ValueError("disaggregation_prefill_peers applies to disaggregation_mode decode only")
        parse_peers(args.disaggregation_prefill_peers)
    if args.disaggregation_secret is not None or args.disaggregation_secret_file is not None:
        if mode == "null":
            raise ValueError("disaggregation_secret applies to disaggregation_mode prefill or decode only")
        args.disaggregation_secret = load_secret(args.disaggregation_secret, args.disaggregation_secret_file)
        args.disaggregation_secret_file = None  # read once: the other processes get the secret itself
