"""sgl.image's argument -> what the runtime's `image_data` takes (torch-free; the program's own process reads its
files, as SGLang's frontend does): a file path or bytes become base64, a PIL image its PNG in base64, and an
http(s) or data URL passes through for the server to read."""

from __future__ import annotations

import base64
import io
from typing import Any


def image_data(image: Any) -> str:
    if isinstance(image, (bytes, bytearray)):
        return base64.b64encode(bytes(image)).decode()
    if isinstance(image, str):
        if image.startswith(("http://", "https://", "data:")):
            return image
        with open(image, "rb") as f:
            return base64.b64encode(f.read()).decode()
    if hasattr(image, "save"):  # a PIL image
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return base64.b64encode(buf.getvalue()).decode()
    raise TypeError(f"sgl.image takes a file path, a URL, bytes or a PIL image, got {type(image).__name__}")
