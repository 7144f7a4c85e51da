"""Tiny random LLaVA checkpoints made by transformers inside a test: the embedded tokenizer with an `<image>` token
and a chat template that writes it for image parts, a CLIP or SigLIP tower, an image processor, random float32
weights; and transformers' own greedy output on them with pixel values (the reference of tests/multimodal/)."""

from __future__ import annotations

import io

IMAGE_TOKEN = "<image>"
IMAGE_SIZE, PATCH = 28, 7  # 16 patches
TEXT_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
VISION_TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                   image_size=IMAGE_SIZE, patch_size=PATCH)
# llava-hf's layout: each image part is "<image>\n" before the message's text
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                 "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
                 "{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>\n{% endif %}{% endfor %}"
                 "{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}"
                 "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build_tiny_llava(path, tower: str = "clip", text: str = "llama", strategy: str = "default",
                     feature_layer=-2, seed: int = 0):
    """A LlavaForConditionalGeneration saved to path (tokenizer, image processor, chat template); returns
    (the eval-mode float32 model, its image processor, the image token's id)."""
    import torch
    import transformers
    from transformers import AutoTokenizer, LlavaConfig, LlavaForConditionalGeneration

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tok.chat_template = CHAT_TEMPLATE
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    text_cfg = (transformers.Qwen2Config if text == "qwen2" else transformers.LlamaConfig)(
        vocab_size=len(tok), **TEXT_TINY)
    if tower == "siglip":
        vision_cfg = transformers.SiglipVisionConfig(**VISION_TINY)
        processor = transformers.SiglipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    else:
        vision_cfg = transformers.CLIPVisionConfig(**VISION_TINY, projection_dim=32)
        processor = transformers.CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                                                    crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    cfg = LlavaConfig(text_config=text_cfg, vision_config=vision_cfg, image_token_index=image_id,
                      vision_feature_select_strategy=strategy, vision_feature_layer=feature_layer)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(cfg).to(torch.float32).eval()
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    processor.save_pretrained(path)
    return model, processor, image_id


def png(seed: int, size: tuple[int, int] = (40, 34)) -> bytes:
    """A random RGB image, PNG-encoded."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def hf_llava_greedy(model, processor, ids: list[int], images: list[bytes], n: int) -> list[int]:
    """transformers' n greedy tokens after ids (placeholders expanded) with the images' pixel values."""
    import numpy as np
    import torch
    from PIL import Image

    extra = {}
    if images:
        arrs = [processor(images=Image.open(io.BytesIO(b)).convert("RGB"), return_tensors="np")["pixel_values"][0]
                for b in images]
        extra["pixel_values"] = torch.from_numpy(np.stack(arrs)).float()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), **extra,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=2)
    return out[0, len(ids):].tolist()
