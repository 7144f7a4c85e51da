"""Shared by the examples: pick a backend from the command line.

    python examples/<name>.py                      # the embedded SmolLM2 in process (radixlang.Engine)
    python examples/<name>.py --url http://host:p  # a server: over its ZeroMQ link (HTTP if it has none)
    python examples/<name>.py --url tcp://host:p   # a server's ZeroMQ link, directly (/server_info's frontend_port)
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # runnable from a checkout

import radixlang as sgl  # noqa: E402


def backend_from_args(description: str) -> sgl.BaseBackend:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", help="tcp://host:port (ZeroMQ) or http://host:port; default: in-process Engine")
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    if args.url:
        return sgl.RuntimeEndpoint(args.url, api_key=args.api_key)
    return sgl.Engine(max_total_tokens=8192)


def run_example(main, description: str) -> None:
    backend = backend_from_args(description)
    try:
        main(backend)
    finally:
        backend.shutdown()
