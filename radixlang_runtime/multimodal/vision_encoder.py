"""VisionEncoder: pixels -> the text model's input embeddings at an image's placeholder positions.

The tower is transformers' own module for vision_config (CLIP's, SigLIP's or Pixtral's vision transformer: it
runs once per image, eager, beside the decoder); the projector is this file's. Both hold the checkpoint's exact
values, in the runner's dtype. features(pixels) is transformers' get_image_features:
- LLaVA: the tower's hidden states at the spec's layers (concatenated), the CLS position dropped under the
  "default" strategy, then linear_1 / act / linear_2;
- Mistral3: Pixtral's hidden states at the image's own size, an RMSNorm, each merge x merge block of patches
  merged by a learned linear (row-major over the merged grid), then linear_1 / act / linear_2;
- Idefics3: each tile's last hidden state, a pixel shuffle by merge (scale_factor), then one linear (proj);
- Qwen2-VL / Qwen2.5-VL: the tower over the image's patches and grid, its merger included (pooler_output).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_runtime.multimodal.vision_spec import VisionSpec

def _tower(spec: VisionSpec, device: torch.device) -> nn.Module:
    """transformers' vision model for the spec's vision_config, its weights left uninitialized (they are loaded)."""
    import transformers
    from transformers.initialization import no_init_weights

    classes = {"clip_vision_model": ("CLIPVisionConfig", "CLIPVisionModel"),
               "siglip_vision_model": ("SiglipVisionConfig", "SiglipVisionModel"),
               "pixtral": ("PixtralVisionConfig", "PixtralVisionModel"),
               "idefics3_vision": ("Idefics3VisionConfig", "Idefics3VisionTransformer"),
               "qwen2_vl": ("Qwen2VLVisionConfig", "Qwen2VisionTransformerPretrainedModel"),
               "qwen2_vl_vision": ("Qwen2VLVisionConfig", "Qwen2VisionTransformerPretrainedModel"),
               "qwen2_5_vl": ("Qwen2_5_VLVisionConfig", "Qwen2_5_VisionTransformerPretrainedModel"),
               "qwen2_5_vl_vision": ("Qwen2_5_VLVisionConfig", "Qwen2_5_VisionTransformerPretrainedModel")}
    config_cls, model_cls = classes[spec.tower_type]
    fields = {k: v for k, v in spec.tower.items() if k != "model_type"}
    if spec.tower_type == "siglip_vision_model":
        fields["vision_use_head"] = False  # its pooled output is not read: only the hidden states
    cfg = getattr(transformers, config_cls)(**fields)
    if model_cls == "Qwen2VisionTransformerPretrainedModel":  # not exported at transformers' top level
        from transformers.models.qwen2_vl import modeling_qwen2_vl as module
    else:
        module = transformers
    with no_init_weights(), torch.device(device):
        return getattr(module, model_cls)(cfg)


def _linear(tensors, name: str, bias: bool, dtype: torch.dtype, device: torch.device) -> nn.Linear:
    w = tensors.get(name + ".weight")
    lin = nn.Linear(w.shape[1], w.shape[0], bias=bias, device=device, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias:
            lin.bias.copy_(tensors.get(name + ".bias"))
    return lin


class VisionEncoder(nn.Module):
    def __init__(self, spec: VisionSpec, tensors, prefixes: tuple[str, str], dtype: torch.dtype,
                 device: torch.device):
        """tensors: the checkpoint (SafetensorsDir); prefixes: where its tower and projector lie."""
        super().__init__()
        self.spec = spec
        tower, projector = prefixes
        self.tower = _tower(spec, device)
        state = {}
        names = set(tensors.names())
        for key in self.tower.state_dict():
            found = next((n for n in (tower + key, tower + "vision_model." + key) if n in names), None)
            if found is None:
                raise ValueError(f"{spec.architecture}: the checkpoint is missing {tower}{key}")
            state[key] = tensors.get(found)
        self.tower.load_state_dict(state, strict=True)
        self.tower.to(dtype).eval()
        self.feature_layers = spec.feature_layers
        if spec.layout == "fixed":  # the layers after the last one read never run (llava-1.5 reads the 23rd of 24)
            layers = self.tower.encoder.layers
            self.feature_layers = tuple(i if i >= 0 else len(layers) + 1 + i for i in spec.feature_layers)
            self.tower.encoder.layers = layers[:max(self.feature_layers)]
        if spec.layout == "patches":  # Qwen-VL: the merger is the tower's (Qwen2-VL's hidden_size is the text's)
            self.hidden_size = int(spec.tower.get("out_hidden_size") or spec.tower["hidden_size"])
            return
        if spec.layout == "tiles":  # Idefics3: the pixel shuffle's one linear
            self.proj = _linear(tensors, projector + "modality_projection.proj", False, dtype, device)
            self.hidden_size = self.proj.out_features
            return
        width = spec.tower["hidden_size"] * len(spec.feature_layers)
        if spec.layout == "grid":  # Mistral3: the norm and the patch merger before the projector
            self.norm_weight = nn.Parameter(tensors.get(projector + "norm.weight").to(device, dtype),
                                            requires_grad=False)
            self.merging = _linear(tensors, projector + "patch_merger.merging_layer", False, dtype, device)
        self.linear_1 = _linear(tensors, projector + "linear_1", spec.projector_bias, dtype, device)
        self.linear_2 = _linear(tensors, projector + "linear_2", spec.projector_bias, dtype, device)
        if self.linear_1.in_features != width:
            raise ValueError(f"{projector}linear_1.weight has {self.linear_1.in_features} input columns; the tower's "
                             f"features have {width}")
        from transformers.activations import ACT2FN  # the projector's activation, as transformers runs it

        self.act = ACT2FN[spec.projector_act]
        self.hidden_size = self.linear_2.out_features

    @torch.inference_mode()
    def features(self, pixels: torch.Tensor, grids: Optional[list] = None) -> torch.Tensor:
        """pixels [N, C, H, W] (one size; tiles: [N, tiles, C, H, W]; patches: [N, patches, patch values] with each
        image's grid [t, h, w]) -> [N, features per image, text hidden]."""
        pixels = pixels.to(next(self.tower.parameters()).dtype)
        if self.spec.layout == "patches":
            return torch.stack([self.tower(hidden_states=p, grid_thw=torch.tensor([g], device=p.device)).pooler_output
                                for p, g in zip(pixels, grids)])
        if self.spec.layout == "grid":
            return torch.stack([self._grid(p) for p in pixels])
        if self.spec.layout == "tiles":
            return torch.stack([self._tiles(p) for p in pixels])
        out = self.tower(pixels, output_hidden_states=True)
        picked = [out.hidden_states[i] for i in self.feature_layers]
        if self.spec.drop_cls:
            picked = [h[:, 1:] for h in picked]
        return self._project(torch.cat(picked, dim=-1))

    def _grid(self, pixels: torch.Tensor) -> torch.Tensor:
        """One image [C, H, W] at its own size -> [rows x cols, hidden] (Mistral3)."""
        h, w = pixels.shape[1:]
        out = self.tower(pixels[None], image_sizes=[(h, w)], output_hidden_states=True)
        x = torch.cat([out.hidden_states[i] for i in self.spec.feature_layers], dim=-1)[0]  # [patches, d]
        x = F.rms_norm(x, self.norm_weight.shape, self.norm_weight, self.spec.norm_eps)
        patch, m = self.spec.unit // self.spec.merge, self.spec.merge
        grid = x.view(h // patch, w // patch, -1).permute(2, 0, 1)[None]  # [1, d, gh, gw]
        blocks = F.unfold(grid, kernel_size=m, stride=m)  # [1, d * m * m, rows * cols]
        return self._project(self.merging(blocks[0].t()))

    def _tiles(self, pixels: torch.Tensor) -> torch.Tensor:
        """One image's tiles [T, C, H, W] -> [T x tokens, hidden] (Idefics3: pixel shuffle, then proj)."""
        x = self.tower(pixel_values=pixels).last_hidden_state  # [T, seq, d]
        t, seq, d = x.shape
        side, s = int(seq ** 0.5), self.spec.merge
        x = x.view(t, side, side // s, d * s).permute(0, 2, 1, 3)
        x = x.reshape(t, side // s, side // s, d * s * s).permute(0, 2, 1, 3).reshape(t, seq // (s * s), d * s * s)
        return self.proj(x).reshape(-1, self.hidden_size)

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))
