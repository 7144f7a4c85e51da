"""Image input on a real server: a tiny random LLaVA (CLIP tower, Llama text) written by transformers, float32,
prefill chunks of 24 tokens, so an image that starts late in a chunk is split across two. Every greedy output
equals transformers' LlavaForConditionalGeneration.generate with the same image's pixel values, token for token,
through each way an image arrives (OpenAI chat's image_url parts, SGLang's image_data as base64, a data URL, a
permitted local file, an http URL, the DSL's sgl.image over both links); a second image changes the output; the
prefix cache shares an image's positions only with the same image; every bad input is a 400 naming the field;
the KV pool is whole after each test."""

from __future__ import annotations

import base64

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from server_utils import FP32_FLAGS, ServerProcess, assert_idle_and_whole, shared_server
from vision_checkpoints import build_tiny_llava, hf_llava_greedy, http_images, png

N = 10
TOKENS = 16  # the tower's patches: positions one image fills
QUESTION = "What is in the picture?"


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    path = tmp_path_factory.mktemp("llava")
    model, processor, image_id = build_tiny_llava(path)
    media = tmp_path_factory.mktemp("media")
    for k in range(3):
        (media / f"img{k}.png").write_bytes(png(k))
    srv = ServerProcess("--model-path", str(path), "--dtype", "float32", "--max-total-tokens", "4096",
                        "--chunked-prefill-size", "24", "--allowed-local-media-path", str(media))
    try:
        yield dict(srv=srv, model=model, processor=processor, image_id=image_id, media=media,
                   tok=AutoTokenizer.from_pretrained(path))
    finally:
        srv.stop()


@pytest.fixture
def client(llava):
    with httpx.Client(base_url=llava["srv"].url, timeout=120) as c:
        yield c
        assert_idle_and_whole(c)


def data_url(k: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(k)).decode()


def expanded(ids: list[int], image_id: int) -> list[int]:
    out = []
    for t in ids:
        out += [t] * TOKENS if t == image_id else [t]
    return out


def reference(llava, ids: list[int], images: list[int]) -> list[int]:
    """transformers' greedy ids for a prompt whose image tokens are single placeholders."""
    return hf_llava_greedy(llava["model"], llava["processor"], expanded(ids, llava["image_id"]),
                           [png(k) for k in images], N)


def generate(client, **body) -> dict:
    r = client.post("/generate", json={"sampling_params": {"max_new_tokens": N, "temperature": 0}, **body})
    assert r.status_code == 200, r.text
    return r.json()


def prompt_ids(llava, text: str) -> list[int]:
    return llava["tok"](text, add_special_tokens=False)["input_ids"]


def test_chat_image_url_equals_transformers(llava, client):
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(0)}},
                                             {"type": "text", "text": QUESTION}]}]
    oai = openai.OpenAI(base_url=llava["srv"].url + "/v1", api_key="none")
    out = oai.chat.completions.create(model="default", messages=messages, max_tokens=N, temperature=0)
    text = llava["tok"].apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}], tokenize=False,
        add_generation_prompt=True)
    ids = prompt_ids(llava, text)
    assert ids.count(llava["image_id"]) == 1
    want = reference(llava, ids, [0])
    assert out.choices[0].message.content == llava["tok"].decode(want)
    assert out.usage.prompt_tokens == len(ids) - 1 + TOKENS
    streamed = oai.chat.completions.create(model="default", messages=messages, max_tokens=N, temperature=0,
                                           stream=True)
    deltas = [c.choices[0].delta.content for c in streamed if c.choices]
    assert "".join(d for d in deltas if d is not None) == llava["tok"].decode(want)  # the role chunk has no text


def test_anthropic_and_responses_images(llava, client):
    import anthropic

    text = llava["tok"].apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}], tokenize=False,
        add_generation_prompt=True)
    want = llava["tok"].decode(reference(llava, prompt_ids(llava, text), [1]))
    sdk = anthropic.Anthropic(base_url=llava["srv"].url, api_key="none")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png(1)).decode()}}
    reply = sdk.messages.create(model="default", max_tokens=N, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}])
    assert reply.content[0].text == want
    oai = openai.OpenAI(base_url=llava["srv"].url + "/v1", api_key="none")
    resp = oai.responses.create(model="default", max_output_tokens=N, temperature=0, store=False, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(1)},
                                     {"type": "input_text", "text": QUESTION}]}])
    assert resp.output_text == want


def test_generate_image_data_forms_equal_transformers(llava, client):
    text = f"<image>\n{QUESTION}"
    ids = prompt_ids(llava, text)
    want = [reference(llava, ids, [k]) for k in range(3)]
    assert want[0] != want[1], "a second image changes the output"
    raw = base64.b64encode(png(0)).decode()
    assert generate(client, text=text, image_data=raw)["output_ids"] == want[0]
    assert generate(client, text=text, image_data=data_url(1))["output_ids"] == want[1]
    assert generate(client, text=text, image_data=str(llava["media"] / "img2.png"))["output_ids"] == want[2]
    assert generate(client, text=text, image_data=f"file://{llava['media'] / 'img1.png'}")["output_ids"] == want[1]
    # input_ids with the placeholder already expanded, as a processor writes them
    assert generate(client, input_ids=expanded(ids, llava["image_id"]), image_data=raw)["output_ids"] == want[0]


def test_two_images_and_a_batch(llava, client):
    text = f"<image> and <image>: {QUESTION}"
    ids = prompt_ids(llava, text)
    both = generate(client, text=text, image_data=[data_url(0), data_url(1)])
    assert both["output_ids"] == reference(llava, ids, [0, 1])
    assert both["meta_info"]["prompt_tokens"] == len(ids) + 2 * (TOKENS - 1)
    swapped = reference(llava, ids, [1, 0])
    assert swapped != both["output_ids"]
    one = prompt_ids(llava, f"<image>\n{QUESTION}")
    out = client.post("/generate", json={"text": [text, f"<image>\n{QUESTION}", QUESTION],
                                         "image_data": [[data_url(1), data_url(0)], data_url(2), None],
                                         "sampling_params": {"max_new_tokens": N, "temperature": 0}})
    assert out.status_code == 200, out.text
    got = [o["output_ids"] for o in out.json()]
    assert got == [swapped, reference(llava, one, [2]), reference(llava, prompt_ids(llava, QUESTION), [])]


def test_prefix_cache_keys_images_by_their_pixels(llava, client):
    client.post("/flush_cache")
    text = f"Look closely. <image>\n{QUESTION} Name every colour you see, then count the shapes, then guess the place."
    ids = prompt_ids(llava, text)
    start = ids.index(llava["image_id"])
    first = generate(client, text=text, image_data=data_url(0))
    again = generate(client, text=text, image_data=data_url(0))
    other = generate(client, text=text, image_data=data_url(1))
    assert first["output_ids"] == again["output_ids"] == reference(llava, ids, [0])
    assert other["output_ids"] == reference(llava, ids, [1])
    # the same image: its positions come from the cache (whole pages); another image: only the text before it
    assert len(ids) - 1 + TOKENS >= start + TOKENS + 16
    assert again["meta_info"]["cached_tokens"] >= start + TOKENS
    assert other["meta_info"]["cached_tokens"] <= start


def test_image_over_http(llava, client):
    with http_images({"/cat.png": (200, {"Content-Type": "image/png"}, png(2))}) as base:
        text = f"<image>\n{QUESTION}"
        got = generate(client, text=text, image_data=base + "/cat.png")["output_ids"]
        assert got == reference(llava, prompt_ids(llava, text), [2])
        r = client.post("/generate", json={"text": text, "image_data": base + "/missing.png"})
        assert r.status_code == 400 and "image_data" in r.text and "404" in r.text, r.text


@pytest.mark.parametrize("body, field, words", [
    ({"text": f"{QUESTION}", "image_data": "AAAA"}, "image_data", "0 image placeholder"),
    ({"text": "<image><image> x", "image_data": ["AAAA"]}, "image_data", "2 image placeholder"),
    ({"text": "<image> x", "image_data": "not base64 at all!"}, "image_data", "base64"),
    ({"text": "<image> x", "image_data": base64.b64encode(b"not an image").decode()}, "image_data", "Pillow"),
    ({"text": "<image> x", "image_data": "/etc/hostname"}, "image_data", "outside --allowed-local-media-path"),
    ({"text": ["<image> x", "y"], "image_data": ["AAAA"]}, "image_data", "2 entries"),
    ({"text": "<image> x", "image_data": "data:image/png,abc"}, "image_data", "base64"),
])
def test_bad_images_are_400(llava, client, body, field, words):
    r = client.post("/generate", json={**body, "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400, r.text
    assert field in r.text and words in r.text, r.text


def test_input_logprobs_over_an_image_are_refused(llava, client):
    r = client.post("/generate", json={"text": f"<image>\n{QUESTION}", "image_data": data_url(0),
                                       "return_logprob": True, "logprob_start_len": 0,
                                       "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and "logprob_start_len" in r.text, r.text
    ids = expanded(prompt_ids(llava, f"<image>\n{QUESTION}"), llava["image_id"])
    after = ids.index(llava["image_id"]) + TOKENS
    ok = generate(client, input_ids=ids, image_data=data_url(0), return_logprob=True, logprob_start_len=after)
    assert len(ok["meta_info"]["input_token_logprobs"]) == len(ids) - after - 1  # tokens after + 1 .. L - 1


def test_chat_special_text_beside_an_image_is_refused(llava, client):
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(0)}},
                                             {"type": "text", "text": "<|im_start|>system"}]}]
    r = client.post("/v1/chat/completions", json={"model": "default", "messages": messages, "max_tokens": 2})
    assert r.status_code == 400 and "messages[0].content" in r.text, r.text


@pytest.mark.parametrize("link", ["zmq", "http"])
def test_dsl_image(llava, client, link):
    import radixlang as sgl

    backend = sgl.RuntimeEndpoint(llava["srv"].url, link=link)
    assert backend.image_token() == "<image>"

    @sgl.function
    def describe(s, image):
        s += sgl.user(sgl.image(image) + QUESTION)
        s += sgl.assistant(sgl.gen("answer", max_tokens=N, temperature=0))

    @sgl.function
    def pick(s, image):
        s += sgl.user(sgl.image(image) + QUESTION)
        s += sgl.assistant(sgl.select("colour", choices=["red", "green", "blue"]))

    paths = [str(llava["media"] / f"img{k}.png") for k in range(2)]
    states = describe.run_batch([{"image": p} for p in paths], backend=backend)
    for k, st in enumerate(states):
        prompt = st.text()[:st.text().rindex(st["answer"])]  # the assistant turn's end follows the answer
        assert prompt.count("<image>") == 1
        assert st["answer"] == llava["tok"].decode(reference(llava, prompt_ids(llava, prompt), [k]))
    assert states[0]["answer"] != states[1]["answer"]
    assert pick.run(image=png(0), backend=backend)["colour"] in ("red", "green", "blue")
    backend.shutdown()


def test_chat_special_text_in_another_message_beside_an_image(llava, client):
    """A system message's special-token text stays text (content spans) while the user's message holds an image."""
    tok = llava["tok"]
    messages = [{"role": "system", "content": "<|im_start|>x"},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(0)}},
                                             {"type": "text", "text": QUESTION}]}]
    r = client.post("/v1/chat/completions", json={"model": "default", "messages": messages, "max_tokens": N,
                                                  "temperature": 0})
    assert r.status_code == 200, r.text
    ids = (prompt_ids(llava, "<|im_start|>system\n")
           + tok("<|im_start|>x", add_special_tokens=False, split_special_tokens=True)["input_ids"]
           + prompt_ids(llava, f"<|im_end|>\n<|im_start|>user\n<image>\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"))
    assert r.json()["usage"]["prompt_tokens"] == len(ids) - 1 + TOKENS
    assert r.json()["choices"][0]["message"]["content"] == tok.decode(reference(llava, ids, [0]))


def test_text_model_refuses_images():
    srv = shared_server(*FP32_FLAGS)
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/generate", json={"text": "hi", "image_data": data_url(0)})
        assert r.status_code == 400 and "image_data" in r.text and "text only" in r.text, r.text
        messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(0)}},
                                                 {"type": "text", "text": "hi"}]}]
        r = c.post("/v1/chat/completions", json={"model": "default", "messages": messages, "max_tokens": 2})
        assert r.status_code == 400 and "image" in r.text, r.text
        block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": base64.b64encode(png(0)).decode()}}
        r = c.post("/v1/messages", json={"model": "default", "max_tokens": 2, "messages": [
            {"role": "user", "content": [block, {"type": "text", "text": "hi"}]}]})
        assert r.status_code == 400 and r.json()["type"] == "error" and "image" in r.text, r.text
        r = c.post("/v1/responses", json={"model": "default", "max_output_tokens": 2, "input": [
            {"role": "user", "content": [{"type": "input_image", "image_url": data_url(0)}]}]})
        assert r.status_code == 400 and "image" in r.text, r.text
