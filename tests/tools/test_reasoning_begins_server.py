"""Where a chat request's reasoning split begins, decided by its prompt, on a real server (the embedded model,
`--reasoning-parser deepseek-v3`, whose default is that an output is reasoning only when it opens `<think>`
itself, and a DeepSeek V3.1-style template: a `thinking` variable ends the prompt with `<think>` when true and
`</think>` otherwise). A prompt that left the block open is split as inside (the first tokens, up to the
`</think>` a thinking budget forces, are reasoning); a prompt that closed it is all content, even an output
that opens `<think>...</think>` (a regex makes the model write one). Each reply is checked against the parser's
split of the same greedy request's text on /generate, streamed and not."""

from __future__ import annotations

import json

import httpx
import pytest
from transformers import AutoTokenizer

from radixlang_runtime.model.loader.resolve import resolve_model_dir
from radixlang_runtime.reasoning_parser import INSIDE, DeepSeekV3Parser, Split
from radixlang_runtime.server.chat_render import render_chat
from server_utils import ServerProcess

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% if thinking %}<think>\n{% else %}</think>"
            "{% endif %}{% endif %}")
ASK = [{"role": "user", "content": "Write a long story about a dragon who learns to paint."}]
OPENS = r"<think>\n[a-z]{2,8}\n</think>\n\n[A-Z][a-z]{1,8}\."  # an output that writes a closed block itself


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--reasoning-parser", "deepseek-v3", "--chat-template", TEMPLATE, "--dtype", "float32",
                        "--max-total-tokens", "4096")
    yield srv
    assert srv.stop() in (0, 143), srv.tail()


def raw(server, thinking: bool, **sp) -> str:
    """The same greedy request on /generate: the text the chat route splits."""
    tok = AutoTokenizer.from_pretrained(resolve_model_dir(None))
    prompt = render_chat(tok, ASK, TEMPLATE, None, {"thinking": thinking})[0]
    assert prompt.endswith("<think>\n" if thinking else "</think>")
    r = httpx.post(server.url + "/generate", timeout=120,
                   json={"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 16, **sp}})
    assert r.status_code == 200, r.text
    return r.json()["text"]


def chat(server, thinking: bool, **extra) -> tuple[Split, Split]:
    """(the reply's split, the streamed deltas' split) of a chat request with this template variable."""
    body = {"model": "default", "messages": ASK, "temperature": 0, "max_tokens": 16,
            "chat_template_kwargs": {"thinking": thinking}, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    whole = Split(msg["reasoning_content"] or "", msg["content"] or "")
    streamed = Split()
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as s:
        lines = s.iter_lines()  # kept referenced: a dropped iterator would close the stream
        for line in lines:
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    streamed += Split(c["delta"].get("reasoning_content") or "", c["delta"].get("content") or "")
    return whole, streamed


def test_a_prompt_that_opened_the_block_is_split_as_inside(server):
    text = raw(server, True, thinking_token_budget=4)
    want = DeepSeekV3Parser.parse(text, INSIDE)
    assert want.reasoning and want.content  # both halves: the split is tested
    assert DeepSeekV3Parser.parse(text) == Split("", text)  # the parser's own default reads it all as content
    whole, streamed = chat(server, True, thinking_token_budget=4)
    assert whole == want
    assert streamed == want


def test_a_prompt_that_closed_the_block_is_all_content(server):
    text = raw(server, False, regex=OPENS)
    assert DeepSeekV3Parser.parse(text).reasoning  # the default would take the model's block as reasoning
    whole, streamed = chat(server, False, regex=OPENS)
    assert whole == Split("", text)
    assert streamed == Split("", text)
