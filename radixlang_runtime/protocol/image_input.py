"""ImageInput: one image of a request, as it travels to the scheduler and the runner (torch-free).

The prompt holds `length` placeholder positions from `offset` (the image token, expanded: multimodal/image_prep.py);
the runtime sees them as the image's pad ids instead, so the prefix cache keys an image by its pixels: two
prompts share those positions' K/V only when their images are the same. The pad ids lie above any vocabulary id
(and below the cache namespaces' bits, mem/cache_namespace.py); the runner never looks them up, it puts the
image's features there (model/executor/image_step.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

PAD_BASE = 1 << 30  # pad ids are in [PAD_BASE, 2 * PAD_BASE): above any vocabulary id, within int32
_PAD_RANGE = 1 << 30


@dataclass
class ImageInput:
    offset: int  # its first position in the prompt
    length: int  # positions its span fills (its features' positions, and a grid's row separators)
    digest: bytes  # blake2b of its pixel values (16 bytes): the cache key
    pixels: bytes  # float32 pixel values, C-contiguous
    shape: list[int]  # [channels, height, width], or [tiles, channels, height, width]
    # the span's positions (from offset, increasing) that hold a feature, the others keeping the text's own tokens
    # (Pixtral's row separators, Idefics3's tile markers); []: every position holds one (LLaVA)
    positions: list[int] = field(default_factory=list)
    # Qwen-VL: its patch grid [t, h, w] (image_grid_thw), which the tower reads and its multimodal rope
    # positions follow (model/executor/mrope.py); []: none
    grid: list[int] = field(default_factory=list)

    def to_wire(self) -> list:
        return [self.offset, self.length, self.digest, self.pixels, list(self.shape), list(self.positions),
                list(self.grid)]

    @classmethod
    def from_wire(cls, values: list) -> "ImageInput":
        if not isinstance(values, list) or len(values) != 7:
            raise ValueError("malformed ImageInput")
        offset, length, digest, pixels, shape, positions, grid = values
        lists = isinstance(shape, list) and isinstance(positions, list) and isinstance(grid, list)
        ints = (offset, length, *shape, *positions, *grid) if lists else None
        if (ints is None or not all(type(x) is int and x >= 0 for x in ints) or not isinstance(digest, bytes)
                or not isinstance(pixels, bytes) or len(pixels) != 4 * _count(shape)
                or any(b <= a for a, b in zip(positions, positions[1:])) or (positions and positions[-1] >= length)):
            raise ValueError("malformed ImageInput")
        return cls(offset, length, digest, pixels, shape, positions, grid)

    @property
    def end(self) -> int:
        return self.offset + self.length

    def feature_positions(self) -> list[int]:
        """The span's positions (from its offset) that hold a feature, in feature order."""
        return list(self.positions) if self.positions else list(range(self.length))

    def pad_ids(self) -> list[int]:
        """The ids its feature positions carry in the runtime: two 30-bit parts of the digest, a different id at
        each position (two images' ids agree everywhere only when both parts agree)."""
        a = int.from_bytes(self.digest[:4], "big") % _PAD_RANGE
        b = int.from_bytes(self.digest[4:8], "big") % _PAD_RANGE | 1
        return [PAD_BASE + (a + i * b) % _PAD_RANGE for i in range(len(self.feature_positions()))]


def _count(shape: list[int]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def pixel_digest(pixels: bytes, shape: list[int]) -> bytes:
    return hashlib.blake2b(pixels, digest_size=16, person=b"radixlang-image",
                           salt=str(shape).encode()[:16]).digest()


def with_pads(ids: list[int], images: list[ImageInput]) -> list[int]:
    """The prompt as the runtime sees it: each image's feature positions holding its pad ids."""
    if not images:
        return ids
    out = list(ids)
    for im in images:
        for q, pad in zip(im.feature_positions(), im.pad_ids()):
            out[im.offset + q] = pad
    return out


def is_pad(token_id: int) -> bool:
    return PAD_BASE <= token_id < PAD_BASE + _PAD_RANGE
