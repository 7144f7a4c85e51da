"""The vision-language architectures: LlavaForConditionalGeneration, Mistral3ForConditionalGeneration,
Idefics3ForConditionalGeneration (SmolVLM), Qwen2VLForConditionalGeneration and Qwen2_5_VLForConditionalGeneration.
Each is the text model of its text_config (Llama, Mistral or Qwen2: the native decoder of models/llama.py; the
Qwen-VLs' with their multimodal rope sections) with images, whose projected features take their placeholder
positions' embeddings.

The config's image path is a VisionSpec (multimodal/vision_spec.py) on ModelConfig.vision; the runner builds the
vision tower beside the decoder (multimodal/vision_encoder.py) and places its features (executor/image_step.py). The
decoder reads its tensors through VisionTextTensors, under the names a causal LM has: transformers writes them as
`language_model.model.*` / `language_model.lm_head.*` (and newer files as `model.language_model.*` / `lm_head.*`),
the tower under `vision_tower.` and the projector under `multi_modal_projector.` either way; Idefics3 as
`model.text_model.*`, `model.vision_model.*` and `model.connector.*`; Qwen-VL as `model.*` and `visual.*` (the
hub's) or `model.language_model.*` and `model.visual.*`.
"""

from __future__ import annotations

import dataclasses

import torch

from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.model.models.llama_family import parse_llama, parse_mistral, parse_qwen2
from radixlang_runtime.multimodal.vision_spec import (parse_idefics3, parse_llava, parse_mistral3, parse_qwen_vl,
                                                      qwen_vl_text, text_config)

_TEXT_PARSERS = {"llama": parse_llama, "mistral": parse_mistral, "qwen2": parse_qwen2}
# (the decoder's prefix, the tensors' prefix) for each layout transformers has written
_LAYOUTS = ((("model.", "language_model.model."), ("lm_head.", "language_model.lm_head.")),
            (("model.", "model.language_model."), ("lm_head.", "lm_head.")),
            (("model.", "model.text_model."), ("lm_head.", "lm_head.")),  # Idefics3
            (("model.", "model."), ("lm_head.", "lm_head.")))  # Qwen2.5-VL's hub files: the text model as a causal LM
# where the tower and the projector lie, per layout
VISION_PREFIXES = (("vision_tower.", "multi_modal_projector."),
                   ("model.vision_tower.", "model.multi_modal_projector."),
                   ("model.vision_model.", "model.connector."),  # Idefics3
                   # Qwen2.5-VL: the merger is inside the tower
                   ("model.visual.", "model.visual.merger."), ("visual.", "visual.merger."))


def parse_llava_model(cfg: dict) -> ModelConfig:
    """config.json -> the text model's ModelConfig, with architecture LlavaForConditionalGeneration and the
    VisionSpec on `vision`."""
    return _with_vision(cfg, parse_llava(cfg))


def parse_mistral3_model(cfg: dict) -> ModelConfig:
    """Mistral3ForConditionalGeneration's config.json -> its text model's ModelConfig and VisionSpec."""
    return _with_vision(cfg, parse_mistral3(cfg))


def parse_idefics3_model(cfg: dict) -> ModelConfig:
    """Idefics3ForConditionalGeneration's (SmolVLM's) config.json -> its text model's ModelConfig and VisionSpec."""
    return _with_vision(cfg, parse_idefics3(cfg))


def qwen_vl_parser(arch: str):
    """Qwen2VL- / Qwen2_5_VLForConditionalGeneration's config.json -> the Qwen2 decoder's ModelConfig with its
    multimodal rope sections, and the VisionSpec."""
    def parse(cfg: dict) -> ModelConfig:
        spec = parse_qwen_vl(cfg, arch)
        text, section = qwen_vl_text(cfg, arch)
        return dataclasses.replace(parse_qwen2(text), architecture=arch, vision=spec, mrope_section=section)
    return parse


def _with_vision(cfg: dict, spec) -> ModelConfig:
    text = text_config(cfg, spec.architecture)
    out = _TEXT_PARSERS[text.get("model_type", "llama")](text)
    if spec.image_token_id >= out.vocab_size:
        raise ValueError(f"image_token_index {spec.image_token_id} is outside the text model's vocabulary "
                         f"({out.vocab_size} tokens; {spec.architecture})")
    return dataclasses.replace(out, architecture=spec.architecture, vision=spec)


class VisionTextTensors:
    """The checkpoint's text-model tensors under a causal LM's names (model.*, lm_head.weight)."""

    def __init__(self, tensors):
        self.whole = tensors  # the whole checkpoint (the vision tower's and projector's tensors too)
        self.path = tensors.path
        layout = next((lay for lay in _LAYOUTS if any(n.startswith(lay[0][1]) for n in _names(tensors))), None)
        if layout is None:
            raise ValueError("the checkpoint has no text model tensors (language_model.model.* or "
                             "model.language_model.*)")
        self._layout = layout

    def _name(self, name: str) -> str:
        for ours, theirs in self._layout:
            if name.startswith(ours):
                return theirs + name[len(ours):]
        return name

    def __contains__(self, name: str) -> bool:
        return self._name(name) in self.whole

    def get(self, name: str, rows=None, cols=None) -> torch.Tensor:
        return self.whole.get(self._name(name), rows=rows, cols=cols)


def vision_prefixes(tensors) -> tuple[str, str]:
    """(the tower's prefix, the projector's prefix) in this checkpoint."""
    names = _names(tensors)
    for tower, projector in VISION_PREFIXES:
        if any(n.startswith(projector) for n in names):
            return tower, projector
    raise ValueError("the checkpoint has no multi_modal_projector tensors")


def _names(tensors) -> list[str]:
    return tensors.names()
