"""ImagePrep: a request's images -> its prompt's placeholder positions and the pixels the runner encodes.

On the server's intake threads (no model here): each image is read (image_source.py), decoded with Pillow and
turned into pixel values by the checkpoint's own image processor (transformers' AutoImageProcessor over
preprocessor_config.json: the resize, crop and normalization the model was trained with). In the prompt, each
image is one image token (`<image>`, `[IMG]`: what the chat template writes, or the text of /generate), expanded
here to the positions its features fill: a fixed count (LLaVA; a run already expanded to that length is taken as
it is), or a grid at the image's own size (Mistral3: rows of [IMG] tokens, each row ended by [IMG_BREAK], the last
by [IMG_END], as transformers' PixtralProcessor writes them). The number of placeholders must equal the number of
images. Every problem is a FieldError (HTTP 400).
"""

from __future__ import annotations

import io
import json
import os
import warnings
from typing import Any, Optional

from radixlang_runtime.multimodal.image_source import ImageSources
from radixlang_runtime.protocol.image_input import ImageInput, pixel_digest
from radixlang_runtime.protocol.limits import FieldError

MAX_IMAGES = 16  # per prompt
MAX_PIXELS = 64 << 20  # a decoded image's pixels (a larger one is a decompression bomb, refused before decoding)


class ImagePrep:
    def __init__(self, model_dir: str, token_id: int, tokens: int, shape: tuple, sources: ImageSources,
                 unit: int = 0, separators: tuple[int, int] = (-1, -1)):
        """tokens / shape: a fixed-size image's positions and pixel shape; unit: a grid image's side step in
        pixels (0: fixed size); separators: a grid's row-break and end token ids."""
        from transformers import AutoImageProcessor

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.processor = AutoImageProcessor.from_pretrained(model_dir)
        except (OSError, ValueError) as e:
            raise RuntimeError(f"{model_dir}: the model takes images but its image processor does not load "
                               f"(preprocessor_config.json): {e}") from None
        self.token_id = token_id
        self.tokens = tokens
        self.shape = list(shape)  # what the vision tower takes
        self.sources = sources
        self.unit = unit
        self.separators = separators

    def attach(self, ids: list[int], refs: list[Any], where: str) -> tuple[list[int], list[ImageInput]]:
        """A prompt's ids and its images (in prompt order) -> the ids with each image's placeholder expanded, and
        the images' ImageInputs."""
        if len(refs) > MAX_IMAGES:
            raise FieldError(where, f"at most {MAX_IMAGES} images per prompt, got {len(refs)}")
        slots = self._placeholders(ids)
        if len(slots) != len(refs):
            raise FieldError(where, f"the prompt has {len(slots)} image placeholder(s) (token {self.token_id}) for "
                                    f"{len(refs)} image(s)")
        out: list[int] = []
        images: list[ImageInput] = []
        last = 0
        for k, ((start, n), ref) in enumerate(zip(slots, refs)):
            out += ids[last:start]
            pixels, shape = self._pixels(self.sources.read(ref, f"{where}[{k}]"), f"{where}[{k}]")
            span = self._span(shape)
            cols = shape[2] // self.unit if self.unit else 0
            images.append(ImageInput(len(out), len(span), pixel_digest(pixels, shape), pixels, shape, cols))
            out += span
            last = start + n
        return out + ids[last:], images

    def _span(self, shape: list[int]) -> list[int]:
        """An image's expanded ids: its fixed count of image tokens, or its grid with the row separators."""
        if not self.unit:
            return [self.token_id] * self.tokens
        rows, cols = shape[1] // self.unit, shape[2] // self.unit
        span = ([self.token_id] * cols + [self.separators[0]]) * rows
        span[-1] = self.separators[1]
        return span

    def _placeholders(self, ids: list[int]) -> list[tuple[int, int]]:
        """(start, length) of each image's placeholder: a run of image tokens whose length is a multiple of the
        expanded length holds that many expanded images; any other run (and any run, for a grid), one image per
        token."""
        runs: list[list[int]] = []
        for i, t in enumerate(ids):
            if t == self.token_id:
                if runs and sum(runs[-1]) == i:
                    runs[-1][1] += 1
                else:
                    runs.append([i, 1])
        out = []
        for start, n in runs:
            step = self.tokens if self.tokens and n % self.tokens == 0 else 1
            out += [(start + j, step) for j in range(0, n, step)]
        return out

    def _pixels(self, data: bytes, where: str) -> tuple[bytes, list[int]]:
        from PIL import Image

        try:
            img = Image.open(io.BytesIO(data))
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            raise FieldError(where, f"{where} is not an image Pillow reads: {e}") from None
        if img.width * img.height > MAX_PIXELS:
            raise FieldError(where, f"{where}: {img.width}x{img.height} pixels is over the limit of {MAX_PIXELS}")
        try:
            img = img.convert("RGB")
        except (OSError, ValueError) as e:
            raise FieldError(where, f"{where} does not decode: {e}") from None
        extra = {"patch_size": {"height": self.unit, "width": self.unit}} if self.unit else {}
        arr = self.processor(images=img, return_tensors="np", **extra)["pixel_values"][0].astype("float32")
        grid_ok = self.unit and arr.shape[0] == 3 and arr.shape[1] % self.unit == 0 and arr.shape[2] % self.unit == 0
        if not grid_ok and list(arr.shape) != self.shape:
            raise FieldError(where, f"{where}: the image processor gave pixel values of shape {list(arr.shape)}; the "
                                    f"vision tower takes {self.shape or f'sides in multiples of {self.unit}'}")
        return arr.tobytes(), list(arr.shape)


def image_prep(model_dir: str, limits: Any, args: Any, tokenizer: Any) -> Optional[ImagePrep]:
    """The server's ImagePrep for a model that takes images (limits.image_token_id >= 0), else None; args:
    ServerArgs (--allowed-local-media-path, --allowed-media-domains)."""
    if limits.image_token_id < 0:
        return None
    sources = ImageSources(args.allowed_local_media_path, tuple(args.allowed_media_domains or ()))
    return ImagePrep(model_dir, limits.image_token_id, limits.image_tokens, limits.image_shape, sources,
                     limits.image_unit, _separators(model_dir, tokenizer) if limits.image_unit else (-1, -1))


def _separators(model_dir: str, tokenizer: Any) -> tuple[int, int]:
    """A grid's [IMG_BREAK] / [IMG_END] ids: processor_config.json's token names (PixtralProcessor's defaults)."""
    names = {"image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}
    path = os.path.join(model_dir, "processor_config.json")
    if os.path.exists(path):
        with open(path) as f:
            given = json.load(f)
        names = {k: given.get(k, v) for k, v in names.items()}
    ids = tuple(tokenizer.convert_tokens_to_ids(n) for n in names.values())
    unk = getattr(tokenizer, "unk_token_id", None)
    if any(i is None or i == unk for i in ids):
        raise RuntimeError(f"{model_dir}: the tokenizer has no {' / '.join(names.values())} tokens, which an "
                           "image's rows end with")
    return ids


def image_token_text(tokenizer: Any, limits: Any) -> Optional[str]:
    """The image placeholder's text (what a prompt writes for an image; /get_model_info's image_token, which the
    DSL's sgl.image writes), or None for a text-only model."""
    if limits.image_token_id < 0:
        return None
    return tokenizer.convert_ids_to_tokens(limits.image_token_id)
