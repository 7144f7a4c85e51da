"""Which link `RuntimeEndpoint("http://host:port")` runs programs over: the server's ZeroMQ link when it
has one, else HTTP.

The HTTP backend's first call (/get_model_info, which it makes anyway) reports `frontend_port`: the
link's port, or None when the server runs without one (`--frontend-port -1`, or an SGLang server).
The link is reached at the HTTP URL's host (the server's bind host may be 0.0.0.0). Invariants:
- link="auto" (the default) never changes what a program gets: where the link is absent, refused or
  silent (a TCP connect within PROBE_TIMEOUT_S, then the link's own first answer within its
  connect_timeout), programs go over HTTP, and a log line (logger "radixlang.backend") says why;
- an https URL and a URL with a path (a proxy in between) keep HTTP unless link="zmq": the link is
  plain TCP, and a proxy forwards HTTP only;
- link="zmq" raises BackendError naming why where there is no usable link; link="http" never tries;
- the link's own refusal of the key (401) is raised, not fallen back from: HTTP checked the same key.
"""

from __future__ import annotations

import logging
import socket
from typing import Optional

from radixlang.backend.base import BaseBackend
from radixlang.backend.http import HttpBackend
from radixlang.errors import BackendError

logger = logging.getLogger("radixlang.backend")
LINKS = ("auto", "zmq", "http")
PROBE_TIMEOUT_S = 1.0  # a TCP connect to the advertised port: refused or silent within this -> HTTP


def link_address(http: HttpBackend) -> tuple[Optional[str], str]:
    """(tcp://host:port of the server's link, "") or (None, why there is none to use)."""
    port = http.model_info.get("frontend_port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        return None, "the server reports no ZeroMQ link (/get_model_info has no frontend_port)"
    host = http._host
    where = f"[{host}]" if ":" in host else host
    return f"tcp://{where}:{port}", ""


def _probe(address: str) -> Optional[str]:
    """None when something accepts a TCP connection at `address`, else why not (within PROBE_TIMEOUT_S)."""
    host, _, port = address[len("tcp://"):].rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as e:
        return f"nothing accepts a connection at {address} ({e!r})"
    return None


def choose_link(http: HttpBackend, link: str, chat_template_name: Optional[str],
                timeout: Optional[float]) -> BaseBackend:
    """`http` itself, or a ZmqBackend on the server's link (see the module's invariants)."""
    if link == "http":
        return http
    address, why = link_address(http)
    if address is not None and link == "auto" and (http._https or http._base_path):
        address, why = None, "the URL is https or has a path (a proxy): the link is plain TCP to the server"
    if address is not None:
        why = _probe(address) or ""
    if address is not None and not why:
        from radixlang.backend.zmq import ZmqBackend

        try:
            backend = ZmqBackend(address, api_key=http.api_key, chat_template_name=chat_template_name,
                                 timeout=timeout)
        except BackendError as e:
            if e.status == 401:
                raise
            why = f"the ZeroMQ link at {address} did not answer: {e}"
        else:
            http._drop_conn()
            backend.http_url = http.base_url
            logger.debug("RuntimeEndpoint(%s): programs go over the ZeroMQ link at %s", http.base_url, address)
            return backend
    if link == "zmq":
        raise BackendError(f"RuntimeEndpoint({http.base_url}, link='zmq'): {why}", 503)
    log = logger.info if address is not None else logger.debug  # an advertised link that failed is news
    log("RuntimeEndpoint(%s): programs go over HTTP: %s", http.base_url, why)
    return http
