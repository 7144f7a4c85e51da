"""Tiny random vision checkpoints made by transformers inside a test: LLaVA (the embedded tokenizer with an
`<image>` token and a chat template that writes it for image parts, a CLIP or SigLIP tower) and Mistral3 (`[IMG]`,
`[IMG_BREAK]`, `[IMG_END]`, a Pixtral tower at each image's own size), each with its image processor and random
float32 weights; and transformers' own greedy output on them with pixel values (the reference of
tests/multimodal/)."""

from __future__ import annotations

import contextlib
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
                 "{% for p in m['content'] %}{% if p['type'] == 'image' %}IMAGE{% endif %}{% endfor %}"
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
    tok.chat_template = CHAT_TEMPLATE.replace("IMAGE", IMAGE_TOKEN + "\n")
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


GRID_TOKENS = ("[IMG]", "[IMG_BREAK]", "[IMG_END]")
PIXTRAL_TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, head_dim=16,
                    image_size=56, patch_size=7)


def build_tiny_mistral3(path, seed: int = 0):
    """A Mistral3ForConditionalGeneration (Pixtral tower, merge 2: a 14-pixel grid step, images up to 56 pixels)
    saved to path; returns (the eval-mode float32 model, its image processor, the [IMG] / [IMG_BREAK] / [IMG_END]
    ids)."""
    import json

    import torch
    import transformers
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": list(GRID_TOKENS)})
    tok.chat_template = CHAT_TEMPLATE.replace("IMAGE", "[IMG]")
    ids = tuple(tok.convert_tokens_to_ids(t) for t in GRID_TOKENS)
    text_cfg = transformers.MistralConfig(vocab_size=len(tok), sliding_window=None, **TEXT_TINY)
    cfg = transformers.Mistral3Config(text_config=text_cfg,
                                      vision_config=transformers.PixtralVisionConfig(**PIXTRAL_TINY),
                                      image_token_index=ids[0], spatial_merge_size=2, vision_feature_layer=-1,
                                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.Mistral3ForConditionalGeneration(cfg).to(torch.float32).eval()
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    processor = transformers.PixtralImageProcessor(size={"longest_edge": 56}, patch_size={"height": 7, "width": 7})
    processor.save_pretrained(path)
    with open(f"{path}/processor_config.json", "w") as f:
        json.dump({"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]",
                   "patch_size": 7, "spatial_merge_size": 2, "processor_class": "PixtralProcessor"}, f)
    return model, processor, ids


def hf_mistral3_greedy(model, processor, grid: tuple, ids: list[int], images: list[bytes],
                       n: int) -> tuple[list[int], list]:
    """(transformers' n greedy tokens after ids, whose [IMG] placeholders are expanded here to each image's grid,
    the expanded prompt). grid: the [IMG] / [IMG_BREAK] / [IMG_END] ids."""
    import numpy as np
    import torch
    from PIL import Image

    img_id, brk, end = grid
    arrs, sizes, prompt, k = [], [], [], 0
    for t in ids:
        if t != img_id:
            prompt.append(t)
            continue
        out = processor(images=Image.open(io.BytesIO(images[k])).convert("RGB"), return_tensors="np",
                        patch_size={"height": 14, "width": 14})
        arr = out["pixel_values"][0]
        rows, cols = arr.shape[1] // 14, arr.shape[2] // 14
        span = ([img_id] * cols + [brk]) * rows
        span[-1] = end
        prompt += span
        arrs.append(arr)
        sizes.append(arr.shape[1:])
        k += 1
    extra = {}
    if arrs:
        h, w = max(s[0] for s in sizes), max(s[1] for s in sizes)
        padded = np.zeros((len(arrs), 3, h, w), dtype=np.float32)
        for j, a in enumerate(arrs):
            padded[j, :, :a.shape[1], :a.shape[2]] = a
        extra = {"pixel_values": torch.from_numpy(padded), "image_sizes": torch.tensor(sizes)}
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), **extra,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=2)
    return out[0, len(prompt):].tolist(), prompt


IDEFICS3_MARKERS = ["<fake_token_around_image>", "<global-img>"] + [f"<row_{r}_col_{c}>" for r in range(1, 7)
                                                                    for c in range(1, 7)]


def build_tiny_idefics3(path, seed: int = 0):
    """An Idefics3ForConditionalGeneration (SmolVLM's architecture: 32-pixel tiles of 16 patches, a pixel shuffle
    by 2: 4 features a tile; images up to 64 pixels: at most 2 x 2 tiles plus the whole) saved to path; returns
    (the eval-mode float32 model, transformers' Idefics3Processor over its tokenizer and image processor)."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN] + IDEFICS3_MARKERS})
    tok.chat_template = CHAT_TEMPLATE.replace("IMAGE", IMAGE_TOKEN)
    vision = transformers.Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, image_size=32, patch_size=8)
    cfg = transformers.Idefics3Config(text_config=transformers.LlamaConfig(vocab_size=len(tok), **TEXT_TINY),
                                      vision_config=vision, scale_factor=2,
                                      image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN), tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.Idefics3ForConditionalGeneration(cfg).to(torch.float32).eval()
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    images = transformers.Idefics3ImageProcessor(size={"longest_edge": 64}, max_image_size={"longest_edge": 32},
                                                 do_image_splitting=True)
    images.save_pretrained(path)
    return model, transformers.Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=4)


def hf_idefics3_greedy(model, processor, text: str, images: list[bytes], n: int) -> tuple[list[int], int]:
    """(transformers' n greedy tokens for text with its <image> placeholders and the images, the prompt's length
    after the processor expanded it)."""
    import torch
    from PIL import Image

    inputs = processor(text=[text], images=[[Image.open(io.BytesIO(b)).convert("RGB") for b in images]],
                       return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=2,
                             pad_token_id=2)
    k = inputs["input_ids"].shape[1]
    return out[0, k:].tolist(), k


QWEN_VL_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")


def build_tiny_qwen_vl(path, version: str = "2.5", seed: int = 0):
    """A Qwen2_5_VLForConditionalGeneration (version 2.5: a 2-block windowed tower) or Qwen2VLForConditionalGeneration
    (2: a 2-block tower), 14-pixel patches merged 2 x 2, images of 4 to 12 merged features, multimodal rope sections
    2 / 3 / 3, saved to path; returns (the eval-mode float32 model, its image processor, the <|image_pad|> id)."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": list(QWEN_VL_TOKENS)})
    tok.chat_template = CHAT_TEMPLATE.replace("IMAGE", "".join(QWEN_VL_TOKENS))
    start, pad, end = (tok.convert_tokens_to_ids(t) for t in QWEN_VL_TOKENS)
    # weights drawn wide (initializer_range 0.5): sharp attention, so the output depends on the positions
    text = dict(vocab_size=len(tok), **TEXT_TINY, initializer_range=0.5,
                rope_parameters={"rope_type": "default", "rope_theta": 100.0, "mrope_section": [2, 3, 3]})
    common = dict(depth=2, num_heads=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    if version == "2.5":
        vision = dict(common, hidden_size=32, intermediate_size=64, out_hidden_size=64, window_size=56,
                      fullatt_block_indexes=[1])
        config_cls, model_cls = transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration
    else:
        vision = dict(common, embed_dim=32, hidden_size=64, mlp_ratio=2)
        config_cls, model_cls = transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration
    cfg = config_cls(text_config=text, vision_config=vision, image_token_id=pad, vision_start_token_id=start,
                     vision_end_token_id=end, video_token_id=pad + 100, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = model_cls(cfg).to(torch.float32).eval()
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    processor = transformers.Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 12, patch_size=14,
                                                   merge_size=2, temporal_patch_size=2)
    processor.save_pretrained(path)
    return model, processor, pad


def hf_qwen_vl_greedy(model, processor, pad: int, ids: list[int], images: list[bytes],
                      n: int) -> tuple[list[int], int]:
    """(transformers' n greedy tokens after ids, whose <|image_pad|> tokens are expanded here to each image's
    features, the expanded prompt's length)."""
    import numpy as np
    import torch
    from PIL import Image

    pixels, grids, prompt, k = [], [], [], 0
    for t in ids:
        if t != pad:
            prompt.append(t)
            continue
        out = processor(images=Image.open(io.BytesIO(images[k])).convert("RGB"), return_tensors="np")
        pixels.append(out["pixel_values"])
        grids.append(out["image_grid_thw"][0])
        prompt += [pad] * int(np.prod(out["image_grid_thw"][0]) // 4)
        k += 1
    ids_t = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids_t, pixel_values=torch.from_numpy(np.concatenate(pixels)),
                             image_grid_thw=torch.from_numpy(np.stack(grids)),
                             mm_token_type_ids=(ids_t == pad).int(), attention_mask=torch.ones_like(ids_t),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=2)
    return out[0, len(prompt):].tolist(), len(prompt)


@contextlib.contextmanager
def http_images(routes: dict):
    """A local http server for the test's images: path -> (status, headers, body); yields its base URL."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            status, headers, body = routes.get(self.path, (404, {}, b""))
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v.replace("{port}", str(self.server.server_address[1])))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


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
