"""python -m radixlang_runtime.launch_router: the router process (radixlang_runtime/router/).

    python -m radixlang_runtime.launch_router --pd-disaggregation \\
        --prefill http://127.0.0.1:30001 [BOOTSTRAP_PORT] --decode http://127.0.0.1:30002 --port 8000
    python -m radixlang_runtime.launch_router --worker-urls http://127.0.0.1:30001 http://127.0.0.1:30002

It serves at once; instances join as their health checks pass (/health is 503 until each role has one).
SIGTERM / SIGINT stop it (uvicorn's shutdown; open streams are closed), exit status 0.
"""

from __future__ import annotations

import logging
import signal
import sys
from typing import Optional

import uvicorn

from radixlang_runtime.router.app import create_app
from radixlang_runtime.router.config import parse_args


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s router %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per upstream call and health check
    # uvicorn re-raises the stop signal after its graceful shutdown: end with status 0 then, as the server does
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    uvicorn.run(create_app(args), host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=5)


if __name__ == "__main__":
    raise SystemExit(main())
