"""Where a request's image comes from -> its bytes (torch-free; on an intake thread, never the event loop).

The forms SGLang's `image_data` and OpenAI's `image_url.url` take:
- a data URL (`data:image/png;base64,...`), or bare base64 (SGLang's);
- an http(s) URL, fetched with a time bound and a size bound;
- a local file (`file://...` or a path), only under --allowed-local-media-path (vLLM's flag: without it a client
  could make the server read its own files).
Every problem is a FieldError naming the field (HTTP 400).
"""

from __future__ import annotations

import base64
import binascii
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional

from radixlang_runtime.protocol.limits import FieldError

MAX_IMAGE_BYTES = 20 << 20  # one image's encoded file
FETCH_TIMEOUT_S = 10.0  # an http(s) image's whole fetch


@dataclass(frozen=True)
class ImageSources:
    """The server's rules for image references."""

    allowed_local_path: Optional[str] = None  # --allowed-local-media-path (None: local files refused)
    allowed_domains: tuple[str, ...] = ()  # --allowed-media-domains (empty: any host)
    fetch_timeout_s: float = FETCH_TIMEOUT_S

    def read(self, ref: Any, where: str) -> bytes:
        if not isinstance(ref, str) or not ref:
            raise FieldError(where, f"{where} must be a URL, a data URL or base64 text")
        if ref.startswith("data:"):
            head, sep, payload = ref.partition(",")
            if not sep or not head.endswith(";base64"):
                raise FieldError(where, f"{where}: a data URL must be data:<type>;base64,<data>")
            return _b64(payload, where)
        if ref.startswith(("http://", "https://")):
            return self._fetch(ref, where)
        if ref.startswith("file://") or os.path.isabs(ref):
            return self._local(ref[len("file://"):] if ref.startswith("file://") else ref, where)
        return _b64(ref, where)

    def _fetch(self, url: str, where: str) -> bytes:
        self._check_host(url, where)
        opener = urllib.request.build_opener(_Redirects(self, where))
        try:
            with opener.open(url, timeout=self.fetch_timeout_s) as resp:
                data = resp.read(MAX_IMAGE_BYTES + 1)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise FieldError(where, f"{where}: fetching {url[:200]} failed: {e}") from None
        return _bounded(data, where)

    def _check_host(self, url: str, where: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise FieldError(where, f"{where}: only http(s) URLs are fetched, not {parts.scheme}")
        if self.allowed_domains and parts.hostname not in self.allowed_domains:
            raise FieldError(where, f"{where}: host {parts.hostname!r} is not in --allowed-media-domains")

    def _local(self, path: str, where: str) -> bytes:
        if self.allowed_local_path is None:
            raise FieldError(where, f"{where}: local files are refused; start the server with "
                                    "--allowed-local-media-path naming the directory they may come from")
        root = os.path.realpath(self.allowed_local_path)
        real = os.path.realpath(path)
        if os.path.commonpath([root, real]) != root:
            raise FieldError(where, f"{where}: {path[:200]} is outside --allowed-local-media-path")
        try:
            with open(real, "rb") as f:
                return _bounded(f.read(MAX_IMAGE_BYTES + 1), where)
        except OSError as e:
            raise FieldError(where, f"{where}: {e.strerror}: {path[:200]}") from None


class _Redirects(urllib.request.HTTPRedirectHandler):
    """A redirect's target passes the same host check as the URL the request named."""

    def __init__(self, sources: ImageSources, where: str):
        self.sources, self.where = sources, where

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        self.sources._check_host(newurl, self.where)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _b64(text: str, where: str) -> bytes:
    if len(text) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise FieldError(where, f"{where}: the image is over {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise FieldError(where, f"{where} is neither a URL nor valid base64") from None


def _bounded(data: bytes, where: str) -> bytes:
    if len(data) > MAX_IMAGE_BYTES:
        raise FieldError(where, f"{where}: the image is over {MAX_IMAGE_BYTES >> 20} MiB")
    return data
