"""ImagePrep: a request's images -> its prompt's placeholder positions and the pixels the runner encodes.

On the server's intake threads (no model here): each image is read (image_source.py), decoded with Pillow and
turned into pixel values by the checkpoint's own image processor (transformers' AutoImageProcessor over
preprocessor_config.json: the resize, crop, tiling and normalization the model was trained with). In the prompt,
each image is one image token (`<image>`, `[IMG]`: what the chat template writes, or the text of /generate),
expanded here to its span, as transformers' processor for the model writes it:
- fixed (LLaVA): `tokens` image tokens; a run already expanded to that length is taken as it is;
- grid (Mistral3): at the image's own size, rows of [IMG] tokens, each row ended by [IMG_BREAK], the last by
  [IMG_END] (PixtralProcessor);
- tiles (Idefics3 / SmolVLM): per tile <fake_token_around_image><row_r_col_c> and its image tokens, a newline
  after each row, then the whole image's tile after <global-img> (Idefics3Processor);
- patches (Qwen2-VL, Qwen2.5-VL): t x h x w / merge^2 image tokens for the image's patch grid (Qwen2VLProcessor).
The number of placeholders must equal the number of images. Every problem is a FieldError (HTTP 400).
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

MAX_PIXELS = 64 << 20  # a decoded image's pixels (a larger one is a decompression bomb, refused before decoding)
FAKE_TOKEN, GLOBAL_TAG = "<fake_token_around_image>", "<global-img>"  # Idefics3Processor's markers


class ImagePrep:
    def __init__(self, model_dir: str, limits: Any, sources: ImageSources, tokenizer: Any, max_images: int = 16):
        """limits: RuntimeLimits' image fields (the placeholder, the layout, a fixed image's or a tile's
        positions and pixel shape, a grid's side step)."""
        from transformers import AutoImageProcessor

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.processor = AutoImageProcessor.from_pretrained(model_dir)
        except (OSError, ValueError) as e:
            raise RuntimeError(f"{model_dir}: the model takes images but its image processor does not load "
                               f"(preprocessor_config.json): {e}") from None
        self.token_id = limits.image_token_id
        self.layout = limits.image_layout
        self.tokens = limits.image_tokens
        self.shape = list(limits.image_shape)  # what the vision tower takes (a tile's, for tiles)
        self.unit = limits.image_unit
        self.merge = limits.image_merge
        self.sources = sources
        self.tokenizer = tokenizer
        self.max_images = max_images  # per prompt (--limit-mm-per-prompt)
        self.separators = _separators(model_dir, tokenizer) if self.layout == "grid" else (-1, -1)
        if self.layout == "tiles":
            _token_ids(tokenizer, (FAKE_TOKEN, GLOBAL_TAG), model_dir)

    def attach(self, ids: list[int], refs: list[Any], where: str) -> tuple[list[int], list[ImageInput]]:
        """A prompt's ids and its images (in prompt order) -> the ids with each image's placeholder expanded, and
        the images' ImageInputs."""
        if len(refs) > self.max_images:
            raise FieldError(where, f"at most {self.max_images} images per prompt (--limit-mm-per-prompt), got "
                                    f"{len(refs)}")
        slots = self._placeholders(ids)
        if len(slots) != len(refs):
            raise FieldError(where, f"the prompt has {len(slots)} image placeholder(s) (token {self.token_id}) for "
                                    f"{len(refs)} image(s)")
        out: list[int] = []
        images: list[ImageInput] = []
        last = 0
        for k, ((start, n), ref) in enumerate(zip(slots, refs)):
            out += ids[last:start]
            pixels, shape, span, grid = self._image(self.sources.read(ref, f"{where}[{k}]"), f"{where}[{k}]")
            feats = [q for q, t in enumerate(span) if t == self.token_id] if self.layout in ("grid", "tiles") else []
            images.append(ImageInput(len(out), len(span), pixel_digest(pixels, shape), pixels, shape, feats, grid))
            out += span
            last = start + n
        return out + ids[last:], images

    def _placeholders(self, ids: list[int]) -> list[tuple[int, int]]:
        """(start, length) of each image's placeholder: for a fixed layout, a run of image tokens whose length is
        a multiple of the expanded length holds that many expanded images; any other run (and any run of the
        other layouts), one image per token."""
        runs: list[list[int]] = []
        for i, t in enumerate(ids):
            if t == self.token_id:
                if runs and sum(runs[-1]) == i:
                    runs[-1][1] += 1
                else:
                    runs.append([i, 1])
        out = []
        for start, n in runs:
            step = self.tokens if self.layout == "fixed" and n % self.tokens == 0 else 1
            out += [(start + j, step) for j in range(0, n, step)]
        return out

    def _image(self, data: bytes, where: str) -> tuple[bytes, list[int], list[int], list[int]]:
        """An image's bytes -> (float32 pixel values, their shape, its span's ids, its patch grid or [])."""
        img = _decode(data, where)
        if self.layout == "tiles":
            return (*self._tiles(img, where), [])
        if self.layout == "patches":
            out = self.processor(images=img, return_tensors="np")
            arr, grid = out["pixel_values"].astype("float32"), [int(x) for x in out["image_grid_thw"][0]]
            self._check_shape(list(arr.shape[1:]), where)
            return arr.tobytes(), list(arr.shape), [self.token_id] * (grid[0] * grid[1] * grid[2] // self.merge ** 2), \
                grid
        extra = {"patch_size": {"height": self.unit, "width": self.unit}} if self.layout == "grid" else {}
        arr = self.processor(images=img, return_tensors="np", **extra)["pixel_values"][0].astype("float32")
        if self.layout == "grid":
            if arr.shape[0] != 3 or arr.shape[1] % self.unit or arr.shape[2] % self.unit:
                raise FieldError(where, f"{where}: the image processor gave pixel values of shape {list(arr.shape)}; "
                                        f"the vision tower takes sides in multiples of {self.unit}")
            rows, cols = arr.shape[1] // self.unit, arr.shape[2] // self.unit
            span = ([self.token_id] * cols + [self.separators[0]]) * rows
            span[-1] = self.separators[1]
            return arr.tobytes(), list(arr.shape), span, []
        self._check_shape(list(arr.shape), where)
        return arr.tobytes(), list(arr.shape), [self.token_id] * self.tokens, []

    def _tiles(self, img: Any, where: str) -> tuple[bytes, list[int], list[int]]:
        out = self.processor(images=[[img]], return_tensors="np", return_row_col_info=True)
        arr = out["pixel_values"][0].astype("float32")  # [tiles, C, H, W]
        mask = out.get("pixel_attention_mask")
        if mask is not None and not mask.all():
            raise FieldError(where, f"{where}: the image processor padded this image's tiles, which is not served")
        self._check_shape(list(arr.shape[1:]), where)
        rows, cols = int(out["rows"][0][0]), int(out["cols"][0][0])
        image = self.tokenizer.convert_ids_to_tokens(self.token_id) * self.tokens
        text = "".join(f"{FAKE_TOKEN}<row_{r + 1}_col_{c + 1}>{image}" + ("\n" if c == cols - 1 else "")
                       for r in range(rows) for c in range(cols))
        text += ("\n" if rows else "") + f"{FAKE_TOKEN}{GLOBAL_TAG}{image}{FAKE_TOKEN}"
        span = self.tokenizer.encode(text, add_special_tokens=False)
        if span.count(self.token_id) != arr.shape[0] * self.tokens:
            raise FieldError(where, f"{where}: {arr.shape[0]} tiles for {span.count(self.token_id) // self.tokens} "
                                    "tile markers (the tokenizer lacks Idefics3's row / column tokens?)")
        return arr.tobytes(), list(arr.shape), span

    def _check_shape(self, shape: list[int], where: str) -> None:
        if shape != self.shape:
            raise FieldError(where, f"{where}: the image processor gave pixel values of shape {shape}; the vision "
                                    f"tower takes {self.shape}")


def _decode(data: bytes, where: str) -> Any:
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(data))
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise FieldError(where, f"{where} is not an image Pillow reads: {e}") from None
    if img.width * img.height > MAX_PIXELS:
        raise FieldError(where, f"{where}: {img.width}x{img.height} pixels is over the limit of {MAX_PIXELS}")
    try:
        return img.convert("RGB")
    except (OSError, ValueError) as e:
        raise FieldError(where, f"{where} does not decode: {e}") from None


def image_prep(model_dir: str, limits: Any, args: Any, tokenizer: Any) -> Optional[ImagePrep]:
    """The server's ImagePrep for a model that takes images (limits.image_token_id >= 0), else None; args:
    ServerArgs (--allowed-local-media-path, --allowed-media-domains)."""
    if limits.image_token_id < 0:
        return None
    sources = ImageSources(args.allowed_local_media_path, tuple(args.allowed_media_domains or ()))
    return ImagePrep(model_dir, limits, sources, tokenizer, args.images_per_prompt())


def _separators(model_dir: str, tokenizer: Any) -> tuple[int, int]:
    """A grid's [IMG_BREAK] / [IMG_END] ids: processor_config.json's token names (PixtralProcessor's defaults)."""
    names = {"image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}
    path = os.path.join(model_dir, "processor_config.json")
    if os.path.exists(path):
        with open(path) as f:
            given = json.load(f)
        names = {k: given.get(k, v) for k, v in names.items()}
    return _token_ids(tokenizer, tuple(names.values()), model_dir)


def _token_ids(tokenizer: Any, names: tuple, model_dir: str) -> tuple:
    ids = tuple(tokenizer.convert_tokens_to_ids(n) for n in names)
    unk = getattr(tokenizer, "unk_token_id", None)
    if any(i is None or i == unk for i in ids):
        raise RuntimeError(f"{model_dir}: the tokenizer has no {' / '.join(names)} tokens, which its images' "
                           "spans are written with")
    return ids


def image_token_text(tokenizer: Any, limits: Any) -> Optional[str]:
    """The image placeholder's text (what a prompt writes for an image; /get_model_info's image_token, which the
    DSL's sgl.image writes), or None for a text-only model."""
    if limits.image_token_id < 0:
        return None
    return tokenizer.convert_ids_to_tokens(limits.image_token_id)
