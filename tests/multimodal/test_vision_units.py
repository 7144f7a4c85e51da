"""The image path's parts without a server: the config's refusals, the vision encoder against transformers'
get_image_features for each tower / strategy / feature-layer choice (Mistral3's Pixtral grid too), the in-process
Engine's greedy ids against transformers (SigLIP tower with Qwen2 text and an image split across prefill chunks and
encoded once; Mistral3 with two images of different sizes; Idefics3's tiles; Qwen2.5-VL's multimodal rope), the
placeholders' expansion, the wire record, and the image sources' rules (data URLs, hosts, redirects)."""

from __future__ import annotations

import base64

import types

import numpy as np
import pytest
import torch

from radixlang_runtime.multimodal.image_prep import ImagePrep
from radixlang_runtime.multimodal.image_source import ImageSources
from radixlang_runtime.multimodal.vision_spec import parse_llava
from radixlang_runtime.protocol.image_input import PAD_BASE, ImageInput, is_pad, pixel_digest, with_pads
from radixlang_runtime.protocol.limits import FieldError
from radixlang_runtime.protocol.messages import TokenizedGenerateReq, decode, encode
from radixlang_runtime.protocol.sampling_params import SamplingParams
from conftest import assert_whole
from vision_checkpoints import (build_tiny_idefics3, build_tiny_llava, build_tiny_mistral3, build_tiny_qwen_vl,
                                hf_idefics3_greedy, hf_llava_greedy, hf_mistral3_greedy, hf_qwen_vl_greedy,
                                http_images, png)

LLAVA = {"architectures": ["LlavaForConditionalGeneration"], "image_token_index": 5,
         "text_config": {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 1,
                         "num_attention_heads": 4, "intermediate_size": 128},
         "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32, "image_size": 28, "patch_size": 7}}


@pytest.mark.parametrize("change, words", [
    ({"vision_config": {"model_type": "pixtral", "image_size": 28, "patch_size": 7}}, "vision_config.model_type"),
    ({"vision_feature_select_strategy": "cls"}, "vision_feature_select_strategy"),
    ({"projector_hidden_act": "tanh"}, "projector_hidden_act"),
    ({"image_grid_pinpoints": [[336, 672]]}, "image_grid_pinpoints"),
    ({"vision_feature_layer": "last"}, "vision_feature_layer"),
    ({"vision_config": {"model_type": "clip_vision_model", "image_size": 30, "patch_size": 7}}, "image_size"),
])
def test_llava_config_refusals(change, words):
    with pytest.raises(ValueError, match=words):
        parse_llava({**LLAVA, **change})


def test_llava_text_model_refusals():
    from radixlang_runtime.model.loader.config import ModelConfig

    cfg = ModelConfig.from_dict(LLAVA)
    assert cfg.architecture == "LlavaForConditionalGeneration" and cfg.vision.tokens == 16
    with pytest.raises(ValueError, match="text_config.model_type"):
        ModelConfig.from_dict({**LLAVA, "text_config": {**LLAVA["text_config"], "model_type": "gemma"}})
    with pytest.raises(ValueError, match="outside the text model's vocabulary"):
        ModelConfig.from_dict({**LLAVA, "image_token_index": 100})
    with pytest.raises(ValueError, match="quantization_config"):
        ModelConfig.from_dict({**LLAVA, "quantization_config": {"quant_method": "awq"}})


def test_qwen2_5_vl_hub_config():
    """The hub's flat Qwen2.5-VL config.json (text fields at the top, rope_scaling of type mrope)."""
    from radixlang_runtime.model.loader.config import ModelConfig

    flat = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "vocab_size": 1000,
            "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "rope_theta": 1000000.0, "use_sliding_window": False, "sliding_window": 32768,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "tie_word_embeddings": True,
            "image_token_id": 900, "vision_config": {"depth": 2, "hidden_size": 32, "out_hidden_size": 256,
                                                     "in_chans": 3, "spatial_merge_size": 2, "temporal_patch_size": 2}}
    cfg = ModelConfig.from_dict(flat)
    assert cfg.mrope_section == (16, 24, 24) and cfg.rope.theta == 1000000.0 and cfg.tie_word_embeddings
    assert cfg.vision.layout == "patches" and cfg.vision.merge == 2 and cfg.vision.image_token_id == 900
    with pytest.raises(ValueError, match="mrope_section"):
        ModelConfig.from_dict({**flat, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 25]}})


@pytest.mark.parametrize("tower, text, strategy, layer", [
    ("clip", "llama", "default", -2), ("clip", "llama", "full", [-2, -1]), ("siglip", "qwen2", "full", [-1, -3])])
def test_encoder_matches_transformers(tmp_path, tower, text, strategy, layer):
    from radixlang_runtime.model.loader.config import ModelConfig
    from radixlang_runtime.model.loader.weights import SafetensorsDir
    from radixlang_runtime.model.models.vision_language import vision_prefixes
    from radixlang_runtime.multimodal.vision_encoder import VisionEncoder

    model, _, _ = build_tiny_llava(tmp_path, tower, text, strategy, layer)
    spec = ModelConfig.from_dir(str(tmp_path)).vision
    tensors = SafetensorsDir(str(tmp_path))
    enc = VisionEncoder(spec, tensors, vision_prefixes(tensors), torch.float32, torch.device("cpu"))
    pixels = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        want = model.get_image_features(pixels, vision_feature_layer=layer,
                                        vision_feature_select_strategy=strategy).pooler_output
    got = enc.features(pixels)
    assert got.shape == (2, spec.tokens, 64) and spec.tokens == 16 + (tower == "clip" and strategy == "full")
    torch.testing.assert_close(got, torch.stack(list(want)), rtol=1e-5, atol=1e-5)


def test_engine_greedy_with_a_split_image(tmp_path):
    from radixlang_runtime.entrypoints.engine import Engine

    model, processor, image_id = build_tiny_llava(tmp_path, "siglip", "qwen2", "full", -1)
    (tmp_path / "a.png").write_bytes(png(3))
    text = "A question first, then the image: <image> and after it some more words to read."
    engine = Engine(str(tmp_path), dtype="float32", chunked_prefill_size=16, max_total_tokens=1024)
    try:
        ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
        k = ids.index(image_id)
        assert k % 16 > 0, "the image starts inside a chunk, so two chunks share it"
        full = ids[:k] + [image_id] * 16 + ids[k + 1:]
        want = hf_llava_greedy(model, processor, full, [png(3)], 8)
        sp = {"max_new_tokens": 8, "temperature": 0}
        out = engine.generate(text, sp, image_data=str(tmp_path / "a.png"))
        assert out["output_ids"] == want
        assert engine.runner.images.encoded == 1
        penalized = engine.generate(text, {**sp, "repetition_penalty": 1.3}, image_data=png_b64(3))
        assert len(penalized["output_ids"]) == 8
        assert engine.runner.images.encoded == 1  # the same pixels: kept, not encoded again
        # a tower that fails fails its request with the error, and the engine goes on whole
        encoder = engine.runner.images.encoder
        engine.runner.images.encoder = types.SimpleNamespace(features=lambda *a: (_ for _ in ()).throw(
            RuntimeError("tower down")))
        with pytest.raises(RuntimeError, match="tower down"):
            engine.generate(text, sp, image_data=png_b64(4))
        engine.runner.images.encoder = encoder
        assert engine.generate(text, sp, image_data=png_b64(4))["meta_info"]["completion_tokens"] == 8
        assert_whole(engine)
    finally:
        engine.shutdown()


def test_mistral3_grid_encoder_and_engine(tmp_path):
    from radixlang_runtime.entrypoints.engine import Engine
    from radixlang_runtime.model.loader.config import ModelConfig
    from radixlang_runtime.model.loader.weights import SafetensorsDir
    from radixlang_runtime.model.models.vision_language import vision_prefixes
    from radixlang_runtime.multimodal.vision_encoder import VisionEncoder

    model, processor, grid = build_tiny_mistral3(tmp_path)
    spec = ModelConfig.from_dir(str(tmp_path)).vision
    assert (spec.unit, spec.merge, spec.tokens) == (14, 2, 0)
    tensors = SafetensorsDir(str(tmp_path))
    enc = VisionEncoder(spec, tensors, vision_prefixes(tensors), torch.float32, torch.device("cpu"))
    pixels = torch.randn(1, 3, 28, 42)
    with torch.no_grad():
        want = model.get_image_features(pixels, image_sizes=torch.tensor([[28, 42]]),
                                        vision_feature_layer=-1).pooler_output[0]
    torch.testing.assert_close(enc.features(pixels)[0], want, rtol=1e-5, atol=1e-5)

    images = [png(1, (40, 34)), png(2, (50, 20))]
    text = "Look: [IMG] and then [IMG], what is there?"
    engine = Engine(str(tmp_path), dtype="float32", chunked_prefill_size=16, max_total_tokens=1024)
    try:
        ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
        want, prompt = hf_mistral3_greedy(model, processor, grid, ids, images, 8)
        swapped, _ = hf_mistral3_greedy(model, processor, grid, ids, images[::-1], 8)
        assert want != swapped
        sp = {"max_new_tokens": 8, "temperature": 0}
        out = engine.generate(text, sp, image_data=[base64.b64encode(b).decode() for b in images])
        assert out["output_ids"] == want and out["meta_info"]["prompt_tokens"] == len(prompt)
        assert engine.generate(text, sp, image_data=[png_b64_of(b) for b in images[::-1]])["output_ids"] == swapped
    finally:
        engine.shutdown()


def test_idefics3_tiles_engine(tmp_path):
    from radixlang_runtime.entrypoints.engine import Engine

    model, processor = build_tiny_idefics3(tmp_path)
    images = [png(4, (60, 40)), png(5, (20, 30)), png(6, (64, 20))]  # 2 x 2, 1 x 1 and 1 x 2 tiles (+ the whole)
    text = "<|im_start|>user\n<image>Compare it with <image> and <image>.<|im_end|>\n<|im_start|>assistant\n"
    want, prompt_len = hf_idefics3_greedy(model, processor, text, images, 8)
    other, _ = hf_idefics3_greedy(model, processor, text, images[::-1], 8)
    assert want != other
    engine = Engine(str(tmp_path), dtype="float32", chunked_prefill_size=32, max_total_tokens=2048)
    try:
        sp = {"max_new_tokens": 8, "temperature": 0}
        out = engine.generate(text, sp, image_data=[png_b64_of(b) for b in images])
        assert out["output_ids"] == want and out["meta_info"]["prompt_tokens"] == prompt_len
        assert engine.generate(text, sp, image_data=[png_b64_of(b) for b in images[::-1]])["output_ids"] == other
    finally:
        engine.shutdown()


@pytest.mark.parametrize("version", ["2.5", "2"])
def test_qwen_vl_multimodal_rope_engine(tmp_path, version):
    """Two images of different grids, prefill chunks that split them, decoding past the prompt (positions shifted by
    the images): transformers' ids token for token; a cache hit and a second image after a cached first one too.
    The contrast: the same engine with plain positions gives other ids (the model reads the positions)."""
    import dataclasses

    from radixlang_runtime.entrypoints.engine import Engine

    model, processor, pad = build_tiny_qwen_vl(tmp_path, version)
    images = [png(1, (60, 40)), png(2, (30, 90)), png(3, (50, 50))]
    text = ("Look <|vision_start|><|image_pad|><|vision_end|> and <|vision_start|><|image_pad|><|vision_end|> "
            "then answer it.")
    engine = Engine(str(tmp_path), dtype="float32", chunked_prefill_size=16, max_total_tokens=1024)
    try:
        ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
        sp = {"max_new_tokens": 10, "temperature": 0}
        cached = []
        for pair in ((0, 1), (1, 0), (0, 1), (0, 2)):  # the repeat is a cache hit; (0, 2) shares the first image
            want, prompt_len = hf_qwen_vl_greedy(model, processor, pad, ids, [images[k] for k in pair], 10)
            out = engine.generate(text, sp, image_data=[png_b64_of(images[k]) for k in pair])
            assert out["output_ids"] == want and out["meta_info"]["prompt_tokens"] == prompt_len, pair
            cached.append(out["meta_info"]["cached_tokens"])
        assert cached[0] == cached[1] == 0 and cached[2] >= 16  # whole pages of the repeat
        engine.flush_cache()
        engine.runner.cfg = dataclasses.replace(engine.runner.cfg, mrope_section=())
        plain = engine.generate(text, sp, image_data=[png_b64_of(images[k]) for k in (0, 2)])
        assert plain["output_ids"] != want
    finally:
        engine.shutdown()


def png_b64_of(data: bytes) -> str:
    return base64.b64encode(data).decode()


def png_b64(k: int) -> str:
    return base64.b64encode(png(k)).decode()


def _prep(tokens: int = 4, layout: str = "fixed") -> ImagePrep:
    prep = ImagePrep.__new__(ImagePrep)
    prep.token_id, prep.tokens, prep.shape, prep.layout = 9, tokens, [3, 2, 2], layout
    prep.unit, prep.separators, prep.max_images = 0, (-1, -1), 16
    prep.sources = ImageSources()
    prep._image = lambda data, where: (bytes(48), [3, 2, 2], [9] * tokens, [])
    return prep


@pytest.mark.parametrize("ids, slots", [
    ([1, 9, 2], [(1, 1)]), ([9, 9, 9, 9, 2], [(0, 4)]), ([9, 9, 1, 9], [(0, 1), (1, 1), (3, 1)]),
    ([9] * 8, [(0, 4), (4, 4)]), ([1, 2], [])])
def test_placeholders(ids, slots):
    assert _prep()._placeholders(ids) == slots


def test_attach_expands_and_counts():
    prep = _prep()
    ids, images = prep.attach([1, 9, 2, 9, 9, 9, 9, 3], ["AAAA", "AAAA"], "image_data")
    assert ids == [1, 9, 9, 9, 9, 2, 9, 9, 9, 9, 3]
    assert [(im.offset, im.length) for im in images] == [(1, 4), (6, 4)]
    with pytest.raises(FieldError, match="1 image placeholder"):
        prep.attach([1, 9, 2], ["AAAA", "AAAA"], "image_data")


def test_limit_mm_per_prompt():
    from radixlang_runtime.server_args import ServerArgs

    assert ServerArgs().images_per_prompt() == 16
    assert ServerArgs(limit_mm_per_prompt='{"image": 2, "video": 0}').images_per_prompt() == 2
    for bad, words in (('{"video": 1}', "video inputs are not served"), ("4", "JSON object"),
                       ('{"image": -1}', "JSON object")):
        with pytest.raises(ValueError, match=words):
            ServerArgs(limit_mm_per_prompt=bad)
    prep = _prep()
    prep.max_images = 2
    with pytest.raises(FieldError, match="at most 2 images per prompt"):
        prep.attach([9, 9, 9], ["AAAA"] * 3, "image_data")


def test_grid_span_and_features():
    prep = _prep(0, "grid")
    prep.unit, prep.separators = 2, (7, 8)
    prep.processor = lambda images, return_tensors, patch_size: {"pixel_values": np.zeros((1, 3, 4, 6))}
    prep.sources = types.SimpleNamespace(read=lambda ref, where: png(0))
    del prep._image
    ids, (im,) = prep.attach([1, 9, 2], ["AAAA"], "image_data")  # 2 rows of 3, a break, then the end
    assert ids == [1, 9, 9, 9, 7, 9, 9, 9, 8, 2] and (im.offset, im.length) == (1, 8)
    assert im.feature_positions() == [0, 1, 2, 4, 5, 6]
    padded = with_pads(ids, [im])
    assert [padded[i] for i in (0, 4, 8, 9)] == [1, 7, 8, 2]
    assert [padded[1 + q] for q in im.feature_positions()] == im.pad_ids() and len(im.pad_ids()) == 6
    assert ImageInput.from_wire(im.to_wire()) == im
    with pytest.raises(ValueError, match="malformed"):
        ImageInput.from_wire([1, 6, im.digest, im.pixels, im.shape, [0, 1, 2, 4, 5, 6], []])  # 6 is past the span


def test_image_input_wire_and_pads():
    a = ImageInput(3, 5, pixel_digest(bytes(48), [3, 2, 2]), bytes(48), [3, 2, 2])
    b = ImageInput(3, 5, pixel_digest(bytes(47) + b"\1", [3, 2, 2]), bytes(47) + b"\1", [3, 2, 2])
    assert all(is_pad(t) and t >= PAD_BASE for t in a.pad_ids()) and len(set(a.pad_ids())) == 5
    assert a.pad_ids() != b.pad_ids()
    assert with_pads(list(range(10)), [a])[:3] == [0, 1, 2] and with_pads(list(range(10)), [a])[3:8] == a.pad_ids()
    msg = TokenizedGenerateReq("r", with_pads(list(range(10)), [a]), SamplingParams(), images=[a])
    back = decode(encode(msg))
    assert back.images == [a] and back.input_ids == msg.input_ids
    with pytest.raises(ValueError, match="malformed"):
        ImageInput.from_wire([3, 5, a.digest, bytes(40), [3, 2, 2], [], []])
    with pytest.raises(ValueError, match="malformed"):
        ImageInput.from_wire([3, 5, a.digest, a.pixels, [3, 2, 2], []])


def test_sources_rules(tmp_path):
    src = ImageSources()
    assert src.read("data:image/png;base64," + png_b64(0), "x") == png(0)
    for bad, words in (("data:image/png,abc", "base64"), ("%%%", "base64"), ("ftp://h/x.png", "base64"),
                       (str(tmp_path / "a.png"), "--allowed-local-media-path"), (5, "must be")):
        with pytest.raises(FieldError, match=words):
            src.read(bad, "x")

    routes = {"/a.png": (200, {}, png(0)), "/hop": (302, {"Location": "http://localhost:{port}/a.png"}, b"")}
    with http_images(routes) as base:
        assert ImageSources(allowed_domains=("127.0.0.1",)).read(base + "/a.png", "x") == png(0)
        assert ImageSources().read(base + "/hop", "x") == png(0)
        with pytest.raises(FieldError, match="not in --allowed-media-domains"):
            ImageSources(allowed_domains=("example.org",)).read(base + "/a.png", "x")
        with pytest.raises(FieldError, match="'localhost' is not in --allowed-media-domains"):
            ImageSources(allowed_domains=("127.0.0.1",)).read(base + "/hop", "x")
