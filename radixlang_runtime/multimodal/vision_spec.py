"""VisionSpec: what a vision checkpoint's config.json says about its images (torch-free: the server's intake and the
runner both read it).

LlavaForConditionalGeneration (transformers' LlavaConfig): a vision tower (`vision_config`: CLIP or SigLIP) whose
hidden states at `vision_feature_layer` (an index, or a list of them concatenated), less the CLS position under
`vision_feature_select_strategy` "default", pass a two-layer projector (`projector_hidden_act`,
`multimodal_projector_bias`) into the text model's embedding space. An image is one `image_token_index` token in the
prompt, expanded to `tokens` positions whose embeddings are the projected features.

Mistral3ForConditionalGeneration (Mistral Small 3.1 / 3.2): a Pixtral tower at the image's own size (a multiple of
patch_size x spatial_merge_size, up to vision_config.image_size), then an RMSNorm, a learned merge of each
spatial_merge_size^2 block of patches, and the two-layer projector. An image is a grid: `rows` rows of `cols`
features, each row ended by [IMG_BREAK] and the last by [IMG_END] (tokens = 0 here: the count is the image's).

Idefics3ForConditionalGeneration (SmolVLM): the image processor splits an image into tiles of
vision_config.image_size (rows x cols, plus the whole image shrunk to one tile); each tile passes the Idefics3
vision transformer, a pixel shuffle by `scale_factor` and one linear (`tokens` features a tile). The prompt holds
each tile's features after its <fake_token_around_image><row_r_col_c> markers, as transformers' Idefics3Processor
writes them.

Qwen2_5_VLForConditionalGeneration and Qwen2VLForConditionalGeneration: the image processor resizes each image to
multiples of patch_size x spatial_merge_size and flattens it into patches of temporal_patch_size frames (the grid
[t, h, w], image_grid_thw); the vision transformer (Qwen2.5-VL's windowed) and its merger give t x h x w / merge^2
features, which fill that many <|image_pad|> positions. The text model's rope is multimodal (mrope_section): an
image's positions count (t, row, column) from where it starts, and the text after it resumes at that start +
max(rows, columns) (model/executor/mrope.py).

Fields that change that math and are not implemented are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

# vision towers whose module transformers builds from vision_config alone and whose output is one feature per
# patch (plus CLIP's CLS position) at a fixed image size
VISION_TOWERS = ("clip_vision_model", "siglip_vision_model")  # LLaVA's; Mistral3's is pixtral, Idefics3's its own
PROJECTOR_ACTS = ("gelu", "gelu_pytorch_tanh", "quick_gelu", "relu", "silu")
TEXT_MODELS = ("llama", "mistral", "qwen2")  # text_config.model_type -> the native family that runs it


@dataclass(frozen=True)
class VisionSpec:
    """One checkpoint's image path, parsed once."""

    architecture: str  # config.json's architectures[0]
    image_token_id: int  # the prompt's placeholder token (one per image before expansion)
    tokens: int  # positions one image fills (its projected features)
    tower: dict  # vision_config as written (transformers builds the tower from it)
    feature_layers: tuple[int, ...]  # hidden-state indices read (concatenated when several)
    drop_cls: bool  # vision_feature_select_strategy "default": the CLS position is dropped
    projector_act: str
    projector_bias: bool
    merge: int = 1  # Mistral3's spatial_merge_size (1: no merge, LLaVA)
    norm_eps: float = 0.0  # Mistral3: the projector's RMSNorm epsilon (the text model's rms_norm_eps)
    unit: int = 0  # a grid image's side step in pixels (patch_size x merge); 0: a fixed-size image (LLaVA)
    # fixed (LLaVA) | grid (Mistral3) | tiles (Idefics3: merge is the pixel shuffle's factor) | patches (Qwen2.5-VL:
    # merge is spatial_merge_size)
    layout: str = "fixed"

    @property
    def tower_type(self) -> str:
        return self.tower["model_type"]


def parse_llava(cfg: dict) -> VisionSpec:
    """config.json of a LlavaForConditionalGeneration -> its VisionSpec (ValueError names a field not honoured)."""
    arch = "LlavaForConditionalGeneration"
    vision = _section(cfg, "vision_config", VISION_TOWERS, arch)
    tower = vision["model_type"]
    token = cfg.get("image_token_index", cfg.get("image_token_id", 32000))
    strategy = cfg.get("vision_feature_select_strategy", "default")
    if strategy not in ("default", "full"):
        raise ValueError(f"vision_feature_select_strategy {strategy!r} is not supported ({arch}: default or full)")
    layers = _feature_layers(cfg.get("vision_feature_layer", -2), arch)
    act = cfg.get("projector_hidden_act", "gelu")
    if act not in PROJECTOR_ACTS:
        raise ValueError(f"projector_hidden_act {act!r} is not supported ({arch}: {', '.join(PROJECTOR_ACTS)})")
    for key in ("image_grid_pinpoints", "spatial_merge_size", "multimodal_projector_layers"):
        if cfg.get(key) is not None:
            raise ValueError(f"{key} is not supported ({arch}: one fixed-size crop per image)")
    size, patch = int(vision.get("image_size", 224)), int(vision.get("patch_size", 32 if tower == "clip_vision_model"
                                                                                  else 16))
    if size % patch:
        raise ValueError(f"vision_config.image_size {size} is not a multiple of its patch_size {patch} ({arch})")
    cls = tower == "clip_vision_model"  # SigLIP has no CLS position
    tokens = (size // patch) ** 2 + (cls and strategy == "full")
    return VisionSpec(arch, int(token), tokens, vision, layers, cls and strategy == "default", act,
                      bool(cfg.get("multimodal_projector_bias", True)))


def parse_mistral3(cfg: dict) -> VisionSpec:
    """config.json of a Mistral3ForConditionalGeneration -> its VisionSpec."""
    arch = "Mistral3ForConditionalGeneration"
    vision = _section(cfg, "vision_config", ("pixtral",), arch)
    act = cfg.get("projector_hidden_act", "gelu")
    if act not in PROJECTOR_ACTS:
        raise ValueError(f"projector_hidden_act {act!r} is not supported ({arch}: {', '.join(PROJECTOR_ACTS)})")
    merge = int(cfg.get("spatial_merge_size", 2))
    patch = int(vision.get("patch_size", 16))
    if merge < 1:
        raise ValueError(f"spatial_merge_size {merge} must be >= 1 ({arch})")
    eps = float((cfg.get("text_config") or {}).get("rms_norm_eps", 1e-5))
    return VisionSpec(arch, int(cfg.get("image_token_index", cfg.get("image_token_id", 10))), 0, vision,
                      _feature_layers(cfg.get("vision_feature_layer", -1), arch), False, act,
                      bool(cfg.get("multimodal_projector_bias", False)), merge, eps, patch * merge, "grid")


def parse_idefics3(cfg: dict) -> VisionSpec:
    """config.json of an Idefics3ForConditionalGeneration (SmolVLM) -> its VisionSpec."""
    arch = "Idefics3ForConditionalGeneration"
    vision = _section(cfg, "vision_config", ("idefics3_vision",), arch)
    size, patch = int(vision.get("image_size", 224)), int(vision.get("patch_size", 32))
    scale = int(cfg.get("scale_factor", 2))
    if size % patch or (size // patch) % scale:
        raise ValueError(f"vision_config.image_size {size} / patch_size {patch} must be a multiple of scale_factor "
                         f"{scale} ({arch})")
    tokens = (size // patch // scale) ** 2
    return VisionSpec(arch, int(cfg.get("image_token_id", 128257)), tokens, vision, (-1,), False, "", False,
                      merge=scale, layout="tiles")


# the vision_config model_types of each Qwen-VL (the hub's, then transformers 5's)
QWEN_VL_TOWERS = {"Qwen2VLForConditionalGeneration": ("qwen2_vl", "qwen2_vl_vision"),
                  "Qwen2_5_VLForConditionalGeneration": ("qwen2_5_vl", "qwen2_5_vl_vision")}


def parse_qwen_vl(cfg: dict, arch: str) -> VisionSpec:
    """config.json of a Qwen2VLForConditionalGeneration or Qwen2_5_VLForConditionalGeneration -> its VisionSpec."""
    vision = _section(cfg, "vision_config", QWEN_VL_TOWERS[arch], arch)
    if int(vision.get("temporal_patch_size", 2)) < 1 or int(vision.get("spatial_merge_size", 2)) < 1:
        raise ValueError(f"vision_config's temporal_patch_size and spatial_merge_size must be >= 1 ({arch})")
    return VisionSpec(arch, int(cfg.get("image_token_id", 151655)), 0, vision, (-1,), False, "", False,
                      merge=int(vision.get("spatial_merge_size", 2)), layout="patches")


def qwen_vl_text(cfg: dict, arch: str) -> tuple[dict, tuple[int, ...]]:
    """A Qwen2.5-VL config's text model (text_config, or the top level of the hub's flat configs) for the Qwen2
    parser, its rope without the multimodal fields, and the rope's mrope_section."""
    text = dict(cfg["text_config"]) if isinstance(cfg.get("text_config"), dict) else \
        {k: v for k, v in cfg.items() if k not in ("vision_config", "architectures", "model_type")}
    if "tie_word_embeddings" in cfg:
        text["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    key = "rope_parameters" if isinstance(text.get("rope_parameters"), dict) else "rope_scaling"
    rope = dict(text.get(key) or {})
    section = tuple(int(x) for x in rope.pop("mrope_section", ()) or ())
    for k in ("type", "rope_type"):
        if rope.get(k) == "mrope":
            rope[k] = "default"
    if rope.get("mrope_interleaved"):
        raise ValueError(f"mrope_interleaved is not supported ({arch}: Qwen2.5-VL's sections)")
    rope.pop("mrope_interleaved", None)
    head_dim = int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])
    if not section or sum(section) != head_dim // 2:
        raise ValueError(f"mrope_section {list(section)} must split the rotary half ({head_dim // 2} lanes) ({arch})")
    if "quantization_config" in cfg:
        raise ValueError(f"quantization_config is not supported ({arch}: float checkpoints)")
    return {**text, key: rope or None}, section


def _section(cfg: dict, key: str, kinds: tuple, arch: str) -> dict:
    """config.json's `key` (vision_config, text_config), whose model_type (default: kinds[0]) must be one of kinds;
    returned with its model_type set."""
    section = cfg.get(key)
    if not isinstance(section, dict):
        raise ValueError(f"{arch}: config.json has no {key}")
    kind = section.get("model_type", kinds[0])
    if kind not in kinds:
        raise ValueError(f"{key}.model_type {kind!r} is not supported ({arch}: {', '.join(kinds)})")
    return {**section, "model_type": kind}


def _feature_layers(value: Union[int, list, Any], arch: str) -> tuple[int, ...]:
    layers = [value] if isinstance(value, int) else value
    if not isinstance(layers, list) or not layers or not all(isinstance(x, int) for x in layers):
        raise ValueError(f"vision_feature_layer {value!r} must be an index or a list of them ({arch})")
    return tuple(layers)


def text_config(cfg: dict, arch: str) -> dict:
    """The text model's config.json fields (text_config, with the top level's tie_word_embeddings where it has one:
    the composite model's setting is what ties the head, as transformers reads it) for the native family of its
    model_type."""
    out = _section(cfg, "text_config", TEXT_MODELS, arch)
    if "tie_word_embeddings" in cfg:
        out["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    if cfg.get("quantization_config") is not None:
        raise ValueError(f"quantization_config is not supported ({arch}: float checkpoints)")
    return out
