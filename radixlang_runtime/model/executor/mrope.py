"""Multimodal rope positions (Qwen2-VL, Qwen2.5-VL; ModelConfig.mrope_section) of a step's rows.

A prompt's text counts positions one by one, as any model's. An image of grid [t, h, w] (image_grid_thw; h and w
in patches, merge x merge of them one feature) starting where the text's next position s would be fills its
t x (h / merge) x (w / merge) positions with (s + frame, s + row, s + column); the text after it resumes at
s + max(h, w) / merge, as transformers' get_rope_index counts them. So past the prompt each token's position is its
index plus the request's delta (the sum of each image's max(rows, columns) - its feature count), the same on the
three axes. Text-only steps keep the plain positions (the axes agree): plan_mrope returns None for them.
"""

from __future__ import annotations

from typing import Optional

from radixlang_runtime.model.executor.step_io import ModelBatch


def _layout(images: list, merge: int) -> list[tuple[int, int, int, int, int]]:
    """Each image's (offset, feature count, rows, columns, shift before it), in prompt order."""
    out, shift = [], 0
    for im in sorted(images, key=lambda x: x.offset):
        t, h, w = im.grid[0], im.grid[1] // merge, im.grid[2] // merge
        out.append((im.offset, t * h * w, h, w, shift))
        shift += max(h, w) - t * h * w
    return out


def _positions(images: list, merge: int, start: int, n: int) -> tuple[list[int], list[int], list[int]]:
    """The (frame, row, column) positions of prompt / output indices start .. start + n - 1."""
    lay = _layout(images, merge)
    total = sum(max(h, w) - count for _, count, h, w, _ in lay)
    axes: tuple[list[int], list[int], list[int]] = ([], [], [])
    k = 0
    for q in range(start, start + n):
        while k < len(lay) and q >= lay[k][0] + lay[k][1]:
            k += 1
        if k < len(lay) and q >= lay[k][0]:
            off, _, h, w, shift = lay[k]
            s, i = off + shift, q - off
            pos = (s + i // (h * w), s + (i // w) % h, s + i % w)
        else:  # text: before the next image (or after the last), shifted by the images before it
            shift = lay[k][4] if k < len(lay) else total
            pos = (q + shift,) * 3
        for axis, p in zip(axes, pos):
            axis.append(p)
    return axes


def plan_mrope(batch: ModelBatch, merge: int) -> Optional[list[list[int]]]:
    """The step's [3][T] positions, row for row with its flattened tokens; None when no request has an image."""
    if not batch.images or not any(batch.images):
        return None
    out: list[list[int]] = [[], [], []]
    for i, ids in enumerate(batch.extend_ids):
        axes = _positions(batch.images[i], merge, batch.prefix_lens[i], len(ids))
        for dst, src in zip(out, axes):
            dst += src
    return out
