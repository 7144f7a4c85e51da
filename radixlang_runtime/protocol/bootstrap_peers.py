"""Who a PD decode may take K/V from: the syntax of a bootstrap host, the prefill allow-list
(--disaggregation-prefill-peers host:port,...) and the bootstrap link's shared secret
(--disaggregation-secret / --disaggregation-secret-file). Torch-free, no sockets: the HTTP intake
(generate_input.parse_bootstrap) and ServerArgs check with it before anything connects
(docs/DISAGGREGATION.md, "Security").

A bootstrap host is a DNS name (letters, digits, hyphens, dots; labels of 1..63 characters) or an IPv4 /
IPv6 address that names one machine: no wildcard (`*`), no unspecified address (0.0.0.0, ::), no
multicast, no ZeroMQ interface syntax (`eth0;...`), no brackets or port inside it.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Optional

from radixlang_runtime.protocol.limits import FieldError


@dataclass(frozen=True)
class Bootstrap:
    """Where a PD request's K/V comes from (decode) or goes to (prefill): the prefill's bootstrap socket and
    the room the router drew for this request (both servers get the same one)."""

    host: str
    port: int
    room: int  # in [0, 2**63)

    @property
    def peer(self) -> tuple[str, int]:
        """The prefill's bootstrap socket, as the PD link names a peer."""
        return self.host, self.port

_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
MAX_SECRET_BYTES = 4096


def host_problem(host: str) -> Optional[str]:
    """Why host cannot be a prefill's bootstrap host, or None."""
    if not host or len(host) > 253:
        return "must be a host name or an IP address of 1..253 characters"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None:
        if ip.is_unspecified or ip.is_multicast:
            return f"{host!r} names no single machine (an unspecified or multicast address)"
        return None
    if all(_LABEL.match(label) for label in host.rstrip(".").split(".")) and not host.replace(".", "").isdigit():
        return None
    return f"{host!r} is not a host name or an IP address (no wildcards, ports or interfaces)"


def check_host(host: str, name: str = "bootstrap_host") -> str:
    """host, lowercased, when it names one machine; else FieldError(name)."""
    if (why := host_problem(host)) is not None:
        raise FieldError(name, f"{name} {why}")
    return host.lower()


def parse_peers(spec: Optional[str]) -> tuple[tuple[str, int], ...]:
    """'host:port,host:port' (IPv6 as [addr]:port) -> ((host, port), ...); ValueError naming the entry."""
    if spec is None:
        return ()
    out = []
    for entry in (e.strip() for e in spec.split(",")):
        host, sep, port = entry.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"disaggregation_prefill_peers: {entry!r} is not host:port (port 1..65535)")
        if (why := host_problem(host)) is not None:
            raise ValueError(f"disaggregation_prefill_peers: {entry!r}: the host {why}")
        out.append((host.lower(), int(port)))
    if not out:
        raise ValueError("disaggregation_prefill_peers names no peer")
    return tuple(out)


def load_secret(secret: Optional[str], secret_file: Optional[str]) -> Optional[str]:
    """The bootstrap link's secret from the flag or the file (its text, one trailing newline dropped)."""
    if secret is not None and secret_file is not None:
        raise ValueError("give disaggregation_secret or disaggregation_secret_file, not both")
    if secret_file is not None:
        if not os.path.isfile(secret_file):
            raise ValueError(f"disaggregation_secret_file {secret_file!r} is not a file")
        with open(secret_file, "rb") as f:
            raw = f.read(MAX_SECRET_BYTES + 1)
        if len(raw) > MAX_SECRET_BYTES:
            raise ValueError(f"disaggregation_secret_file holds over {MAX_SECRET_BYTES} bytes")
        secret = raw.decode("utf-8", "strict").removesuffix("\n").removesuffix("\r")
    if secret is not None and not secret:
        raise ValueError("the disaggregation secret is empty")
    return secret
