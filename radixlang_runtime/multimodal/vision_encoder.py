"""VisionEncoder: pixels -> the text model's input embeddings at an image's placeholder positions.

The tower is transformers' own module for vision_config (CLIP's or SigLIP's vision transformer: it runs once per
image, eager, beside the decoder); the projector (two linears around an activation) is this file's. Both hold
the checkpoint's exact values, in the runner's dtype. features(pixels) is transformers' LlavaModel.
get_image_features: the tower's hidden states at the spec's layers (concatenated), the CLS position dropped
under the "default" strategy, then the projector.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlang_runtime.multimodal.vision_spec import VisionSpec

_ACTS = {"gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
         "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x), "relu": F.relu, "silu": F.silu}


def _tower(spec: VisionSpec) -> nn.Module:
    """transformers' vision model for the spec's vision_config, built without initializing its weights."""
    from transformers import CLIPVisionConfig, CLIPVisionModel, SiglipVisionConfig, SiglipVisionModel

    cfg_cls, model_cls = ((CLIPVisionConfig, CLIPVisionModel) if spec.tower_type == "clip_vision_model"
                          else (SiglipVisionConfig, SiglipVisionModel))
    fields = {k: v for k, v in spec.tower.items() if k != "model_type"}
    if spec.tower_type == "siglip_vision_model":
        fields["vision_use_head"] = False  # its pooled output is not read: only the hidden states
    cfg = cfg_cls(**fields)
    with torch.device("meta"):
        return model_cls(cfg)


class VisionEncoder(nn.Module):
    def __init__(self, spec: VisionSpec, tensors, prefixes: tuple[str, str], dtype: torch.dtype,
                 device: torch.device):
        """tensors: the checkpoint (SafetensorsDir); prefixes: where its tower and projector lie."""
        super().__init__()
        self.spec = spec
        tower, projector = prefixes
        self.tower = _tower(spec).to_empty(device=device)
        state = {}
        names = set(tensors.names())
        for key in self.tower.state_dict():
            found = next((n for n in (tower + key, tower + "vision_model." + key) if n in names), None)
            if found is None:
                raise ValueError(f"{spec.architecture}: the checkpoint is missing {tower}{key}")
            state[key] = tensors.get(found)
        self.tower.load_state_dict(state, strict=True)
        # its non-persistent buffer, which to_empty left unset
        emb = getattr(self.tower, "vision_model", self.tower).embeddings
        emb.position_ids = torch.arange(emb.num_positions, device=device).expand((1, -1))
        self.tower.to(dtype).eval()
        w1 = tensors.get(projector + "linear_1.weight")
        w2 = tensors.get(projector + "linear_2.weight")
        width = spec.tower["hidden_size"] * len(spec.feature_layers)
        if w1.shape[1] != width:
            raise ValueError(f"{projector}linear_1.weight has {w1.shape[1]} input columns; the tower's features "
                             f"have {width}")
        self.linear_1 = nn.Linear(w1.shape[1], w1.shape[0], bias=spec.projector_bias, device=device, dtype=dtype)
        self.linear_2 = nn.Linear(w2.shape[1], w2.shape[0], bias=spec.projector_bias, device=device, dtype=dtype)
        with torch.no_grad():
            for name, lin in (("linear_1", self.linear_1), ("linear_2", self.linear_2)):
                lin.weight.copy_(tensors.get(f"{projector}{name}.weight"))
                if spec.projector_bias:
                    lin.bias.copy_(tensors.get(f"{projector}{name}.bias"))
        self.act = _ACTS[spec.projector_act]
        self.hidden_size = w2.shape[0]

    @torch.inference_mode()
    def features(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, C, H, W] -> [N, spec.tokens, text hidden]."""
        out = self.tower(pixels.to(self.linear_1.weight.dtype), output_hidden_states=True)
        picked = [out.hidden_states[i] for i in self.spec.feature_layers]
        if self.spec.drop_cls:
            picked = [h[:, 1:] for h in picked]
        x = torch.cat(picked, dim=-1)
        return self.linear_2(self.act(self.linear_1(x)))
