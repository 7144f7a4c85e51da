"""Image parts of OpenAI chat messages (torch-free).

A user turn's content may mix text parts with image parts ({"type": "image_url", "image_url": {"url": ...}}, the
url a data URL, an http(s) URL or a permitted local file: multimodal/image_source.py). Such a message reaches the
chat template as parts, text as {"type": "text", "text": ...} and each image as {"type": "image"}: what the
vision checkpoints' own templates read, writing their image token in its place. image_refs lists the urls in
prompt order, which is the order the template writes their tokens.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from radixlang_runtime.protocol.limits import FieldError


def _url(part: dict, where: str) -> str:
    ref = part.get("image_url")
    url = ref.get("url") if isinstance(ref, dict) else ref
    if not isinstance(url, str) or not url:
        raise FieldError(where, f"{where}.image_url.url must be a string (a data URL, an http(s) URL or a file)")
    return url


def content_parts(content: list, where: str) -> Union[str, list[dict]]:
    """A list content -> its text (text parts only, joined) or the parts a template reads (with an image)."""
    out: list[dict] = []
    for k, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "text" and isinstance(p.get("text"), str):
            out.append({"type": "text", "text": p["text"]})
        elif kind == "image_url":
            _url(p, f"{where}[{k}]")
            out.append({"type": "image"})
        else:
            raise FieldError(where, "content parts must be text or image_url parts")
    if all(p["type"] == "text" for p in out):
        return "".join(p["text"] for p in out)
    return out


def image_refs(messages: Any) -> list[str]:
    """Every image part's url, in message and part order (the messages as the client sent them)."""
    refs: list[str] = []
    for i, m in enumerate(messages if isinstance(messages, list) else ()):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            refs += [_url(p, f"messages[{i}].content[{k}]") for k, p in enumerate(content)
                     if isinstance(p, dict) and p.get("type") == "image_url"]
    return refs


def plain_text(content: Any) -> Optional[str]:
    """A cleaned content's text: the string itself, or its text parts joined."""
    if isinstance(content, list):
        return "".join(p["text"] for p in content if p["type"] == "text")
    return content
