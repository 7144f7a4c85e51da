"""Images in a step: which of its token rows are image positions, and their embeddings (the vision models).

plan_images (the scheduler's rank) finds, per prefilling request, the part of each of its images (ModelBatch.
images: protocol/image_input.ImageInput) that this step's extend covers: a chunked prefill may split an image,
and a prefix-cache hit may cover it whole (then nothing runs for it). ImageFeatures turns the pixels into the
projected features (multimodal/vision_encoder.py) once per image and keeps the latest ones (up to KEEP_BYTES, and
always the step's own), by pixel digest, so a split image is encoded once; place() writes them over the decoder's
embeddings at those rows (the decoder reads ForwardBatch.image_rows / image_embeds right after its embedding
lookup, models/llama.py).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.executor.step_io import ModelBatch

KEEP_BYTES = 256 << 20  # encoded images' features kept (an image split over chunks is encoded once)


@dataclass
class ImageRows:
    image: Any  # ImageInput
    rows: list[int]  # the step's flattened token rows it fills
    feats: list[int]  # the image's features there, by index


def plan_images(batch: ModelBatch) -> list[ImageRows]:
    out, base = [], 0
    for i, ids in enumerate(batch.extend_ids):
        p, n = batch.prefix_lens[i], len(ids)
        for im in batch.images[i] if batch.images else ():
            if max(p, im.offset) >= min(p + n, im.end):
                continue
            hits = [(k, im.offset + q) for k, q in enumerate(im.feature_positions()) if p <= im.offset + q < p + n]
            if hits:
                out.append(ImageRows(im, [base + pos - p for _, pos in hits], [k for k, _ in hits]))
        base += n
    return out


class ImageFeatures:
    def __init__(self, encoder: torch.nn.Module, device: torch.device):
        self.encoder = encoder
        self.device = device
        self._kept: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.encoded = 0  # images run through the encoder (a test reads it)

    def place(self, fb: ForwardBatch, plan: list[ImageRows]) -> None:
        """fb's image rows: their ids (pad ids, never looked up) set to 0 and their embeddings given."""
        self._encode([r.image for r in plan])
        rows = torch.tensor([x for r in plan for x in r.rows], dtype=torch.int64, device=self.device)
        feats = torch.cat([self._kept[r.image.digest][torch.tensor(r.feats, device=self.device)] for r in plan])
        fb.input_ids[rows] = 0
        fb.image_rows, fb.image_embeds = rows, feats

    def _encode(self, images: list) -> None:
        """Every image not kept, encoded (one tower call per pixel shape), then kept."""
        todo: dict[bytes, Any] = {im.digest: im for im in images if im.digest not in self._kept}
        by_shape: dict[tuple, list] = {}
        for im in todo.values():
            by_shape.setdefault(tuple(im.shape), []).append(im)
        for shape, group in by_shape.items():
            pixels = torch.stack([torch.frombuffer(bytearray(im.pixels), dtype=torch.float32).view(shape)
                                  for im in group]).to(self.device)
            for im, feats in zip(group, self.encoder.features(pixels, [im.grid for im in group])):
                if feats.shape[0] != len(im.feature_positions()):
                    raise ValueError(f"an image gave {feats.shape[0]} features for "
                                     f"{len(im.feature_positions())} positions")
                self._kept[im.digest] = feats
            self.encoded += len(group)
        for im in images:
            self._kept.move_to_end(im.digest)
        step = {im.digest for im in images}
        size = sum(t.numel() * t.element_size() for t in self._kept.values())
        while size > KEEP_BYTES and next(iter(self._kept)) not in step:
            _, t = self._kept.popitem(last=False)
            size -= t.numel() * t.element_size()


def image_features(cfg, args, tp, tensors, dtype: torch.dtype, device: torch.device):
    """The runner's ImageFeatures for a model with image input (cfg.vision; None for a text model), after the
    refusal of what it does not run with. tensors: the decoder's view of the checkpoint (models/vision_language.py)."""
    if cfg.vision is None:
        return None
    from radixlang_runtime.model.models.vision_language import vision_prefixes
    from radixlang_runtime.multimodal.vision_encoder import VisionEncoder

    refused = (("--tp-size > 1", tp is not None), ("--speculative-algorithm", args.speculative_algorithm is not None),
               ("--disaggregation-mode", args.disaggregation_mode != "null"), ("--is-embedding", args.is_embedding))
    for flag, on in refused:
        if on:
            raise ValueError(f"{flag} is not supported with image input ({cfg.architecture})")
    whole = tensors.whole
    return ImageFeatures(VisionEncoder(cfg.vision, whole, vision_prefixes(whole), dtype, device), device)
