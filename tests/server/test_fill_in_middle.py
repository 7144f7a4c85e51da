"""/v1/completions `suffix` on real servers: a tiny random Llama (float32) whose tokenizer has fill-in-the-middle
markers added as special tokens and its embeddings resized. The runtime's prompt is
BOS + [<|fim_prefix|>] + prefix ids + [<|fim_suffix|>] + suffix ids + [<|fim_middle|>] (the template told from the
tokenizer), its greedy output transformers' on those ids token for token (and native /generate's on them);
--completion-template picks star_coder on a tokenizer that holds two families; n, streaming, stop strings and
logprobs work as for any completion; echo, token-id prompts and truncate_prompt_tokens with a suffix answer 400.
llama.cpp's /infill on the same servers: its greedy middle is the completion's for the same prefix and suffix,
`prompt` runs after the prefix, `input_extra` chunks go before the template in the repo-level layout (the
repository-name token and llama.cpp's project line, each chunk behind the file separator token, the current file's
line: Qwen's added tokens, StarCoder2's in the embedded vocabulary), streaming and stop words in llama.cpp's shape,
/tokenize with a `suffix` answers the ids the completion runs, and on a server whose prefill chunk is 64 tokens a
long prefix, suffix and context are cut to llama.cpp's sizes (short ones whole). llama.vim's request: its body
taken whole, llama.cpp's infill sampler deciding the middle where the candidates leave it no choice,
response_fields cutting the answer to the paths asked, n_indent cutting a dedented line of the greedy middle,
t_max_predict_ms and t_max_prompt_ms ending it early, each early end leaving the KV pool whole and counted in
/metrics as a finished request, not an aborted one; timings' prompt_ms leaves out the time the request queued
behind another.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from radixlang_runtime.server.infill_stops import indent_cut
from server_utils import ServerProcess, assert_idle_and_whole, sse_events
from tiny_checkpoints import build_tiny, hf_greedy

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=0, eos_token_id=2, tie_word_embeddings=False,
            initializer_range=0.3, max_position_embeddings=512)
QWEN = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
SEP = "<|file_sep|>"  # Qwen's file separator: on the first tokenizer only
REPO = "<|repo_name|>"  # Qwen's repository name: on the first tokenizer only
STAR = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nprint(add(1, 2))\n"
SPOOF = "s = '<|fim_middle|>'\n"  # marker text in the user's code: plain text
NEW = 8
ROWS = 6  # the embedding rows added for the markers


def fim_tokenizer(path, markers: list[str]):
    """The embedded tokenizer adding BOS <|endoftext|> (id 0) with `markers` added as special tokens."""
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    tok.bos_token = "<|endoftext|>"
    tok.add_bos_token = True
    tok.add_special_tokens({"additional_special_tokens": markers})
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One model with ROWS new rows (random, seeded), saved twice: beside a tokenizer with Qwen's markers (ids
    V..V+2), its file separator (V+3) and repository name (V+4), and beside one with Qwen's and then StarCoder's
    markers (V+3..V+5)."""
    import torch

    qwen, both = tmp_path_factory.mktemp("fim_qwen"), tmp_path_factory.mktemp("fim_both")
    model = build_tiny(qwen, "LlamaConfig", TINY, {})
    v = model.config.vocab_size
    model.resize_token_embeddings(v + ROWS)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model.get_input_embeddings().weight[v:] = torch.randn(ROWS, 64, generator=g) * 0.3
        model.get_output_embeddings().weight[v:] = torch.randn(ROWS, 64, generator=g) * 0.3
    for path, markers in ((qwen, QWEN + [SEP, REPO]), (both, QWEN + STAR)):
        model.save_pretrained(path, safe_serialization=True)
        fim_tokenizer(path, markers)
    return model, fim_tokenizer(qwen, QWEN + [SEP, REPO]), str(qwen), str(both)


@pytest.fixture(scope="module")
def detected(tiny):
    """--chunked-prefill-size 128 (llama.cpp's n_batch for /infill's cut) leaves input_extra 512 - 128 - 2 * n_predict
    tokens of the 512-token context (the default chunk, cut to the whole context, would leave it none)."""
    srv = ServerProcess("--model-path", tiny[2], "--dtype", "float32", "--max-total-tokens", "2048",
                        "--chunked-prefill-size", "128")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def named(tiny):
    srv = ServerProcess("--model-path", tiny[3], "--dtype", "float32", "--max-total-tokens", "2048",
                        "--completion-template", "star_coder", "--chunked-prefill-size", "128")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def small(tiny):
    """The first model again, its prefill chunk 64 tokens (what plays llama.cpp's n_batch), one request running at a
    time (the next one queues), and /metrics."""
    srv = ServerProcess("--model-path", tiny[2], "--dtype", "float32", "--max-total-tokens", "2048",
                        "--chunked-prefill-size", "64", "--max-running-requests", "1", "--enable-metrics")
    yield srv
    srv.stop()


def plain(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False, split_special_tokens=True)


def layout(tok, markers: list[str], prefix: str, suffix: str) -> list[int]:
    p, s, m = tok.convert_tokens_to_ids(markers)
    return [0, p, *plain(tok, prefix), s, *plain(tok, suffix), m]


def complete(srv, **body) -> dict:
    r = httpx.post(srv.url + "/v1/completions", timeout=120, json={
        "max_tokens": NEW, "min_tokens": NEW, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("prefix", [PREFIX, SPOOF + PREFIX])
def test_the_detected_template_runs_transformers_greedy_on_its_ids(tiny, detected, prefix):
    model, tok, _, _ = tiny
    ids = layout(tok, QWEN, prefix, SUFFIX)
    v = model.config.vocab_size - ROWS
    assert ids[1] == v and ids[-1] == v + 2 and ids.count(v + 2) == 1  # the spoof's text holds no marker id
    want = hf_greedy(model, ids, NEW)
    assert hf_greedy(model, tok(prefix).input_ids, NEW) != want  # the layout matters
    out = complete(detected, prompt=prefix, suffix=SUFFIX, logprobs=1)
    choice = out["choices"][0]
    assert out["usage"]["prompt_tokens"] == len(ids)
    assert choice["text"] == tok.decode(want, skip_special_tokens=True)  # only the middle
    assert choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == NEW
    native = httpx.post(detected.url + "/generate", timeout=120, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}})
    assert native.json()["output_ids"] == want


def test_an_empty_suffix_is_a_plain_completion(tiny, detected):
    model, tok, _, _ = tiny
    ids = tok(PREFIX).input_ids
    out = complete(detected, prompt=PREFIX, suffix="")
    assert out["usage"]["prompt_tokens"] == len(ids)
    assert out["choices"][0]["text"] == tok.decode(hf_greedy(model, ids, NEW), skip_special_tokens=True)


def test_n_streaming_and_stop_strings(tiny, detected):
    model, tok, _, _ = tiny
    text = tok.decode(hf_greedy(model, layout(tok, QWEN, PREFIX, SUFFIX), NEW), skip_special_tokens=True)
    assert len(text) >= 6
    stop = text[3:6]
    cut = text[:text.index(stop)]
    with httpx.stream("POST", detected.url + "/v1/completions", timeout=120, json={
            "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": NEW, "temperature": 0, "n": 2, "stream": True,
            "stop": [stop]}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        events = sse_events(lines)
    assert events[-1] == "[DONE]"
    texts, finishes = ["", ""], [None, None]
    for e in events[:-1]:
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
            finishes[c["index"]] = c["finish_reason"] or finishes[c["index"]]
    assert texts == [cut, cut]
    assert finishes == ["stop", "stop"]


def test_what_a_suffix_cannot_go_with(detected):
    cases = [({"echo": True}, "echo"), ({"prompt": [1, 2, 3]}, "suffix"), ({"truncate_prompt_tokens": 4},
                                                                          "truncate_prompt_tokens")]
    for extra, param in cases:
        r = httpx.post(detected.url + "/v1/completions", timeout=30, json={
            "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 2, **extra})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param


def test_the_start_logs_the_template_once(detected, named):
    assert detected.tail(200_000).count("completion template qwen_coder (told from the tokenizer's tokens)") == 1
    assert named.tail(200_000).count("completion template star_coder (--completion-template)") == 1


def test_the_flag_picks_star_coder_on_a_tokenizer_with_two_families(tiny, named):
    model, tok, _, both = tiny
    from transformers import AutoTokenizer

    tok2 = AutoTokenizer.from_pretrained(both)
    ids = layout(tok2, STAR, PREFIX, SUFFIX)
    v = model.config.vocab_size - ROWS
    assert ids[1] == v + 3 and ids[-1] == v + 5
    want = hf_greedy(model, ids, NEW)
    assert hf_greedy(model, layout(tok2, QWEN, PREFIX, SUFFIX), NEW) != want  # the other family's answer differs
    out = complete(named, prompt=PREFIX, suffix=SUFFIX)
    assert out["usage"]["prompt_tokens"] == len(ids)
    assert out["choices"][0]["text"] == tok2.decode(want, skip_special_tokens=True)


# ------------------------------------------------------------------ llama.cpp's /infill
def infill(srv, **body) -> dict:
    r = httpx.post(srv.url + "/infill", timeout=120, json={"n_predict": NEW, "temperature": 0, "ignore_eos": True,
                                                           **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_infill_answers_the_completions_middle_token_for_token(tiny, detected):
    model, tok, _, _ = tiny
    ids = layout(tok, QWEN, PREFIX, SUFFIX)
    want = hf_greedy(model, ids, NEW)
    out = infill(detected, input_prefix=PREFIX, input_suffix=SUFFIX)
    text = tok.decode(want, skip_special_tokens=True)
    assert out["content"] == text
    assert complete(detected, prompt=PREFIX, suffix=SUFFIX, ignore_eos=True)["choices"][0]["text"] == text
    assert out["tokens_predicted"] == NEW and out["tokens_evaluated"] == len(ids)
    assert out["stop"] is True and out["stop_type"] == "limit" and out["truncated"] is False
    tokenized = httpx.post(detected.url + "/tokenize", timeout=30, json={"prompt": PREFIX, "suffix": SUFFIX}).json()
    assert tokenized["tokens"] == ids  # the ids the completion runs


def test_infill_prompt_follows_the_prefix_and_extra_chunks_lead(tiny, detected):
    model, tok, _, _ = tiny
    v = model.config.vocab_size - ROWS
    head, typed = PREFIX[:10], PREFIX[10:]
    ids = layout(tok, QWEN, PREFIX, SUFFIX)
    typed_ids = [*ids[:2], *plain(tok, head), *plain(tok, typed), *ids[2 + len(plain(tok, PREFIX)):]]
    out = infill(detected, input_prefix=head, prompt=typed, input_suffix=SUFFIX)
    assert out["tokens_evaluated"] == len(typed_ids)
    assert out["content"] == tok.decode(hf_greedy(model, typed_ids, NEW), skip_special_tokens=True)
    chunks = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}, {"text": "X = 1\n"}]
    extra_ids = [0, v + 4, *plain(tok, "myproject\n"), v + 3, *plain(tok, "util.py\n"), *plain(tok, chunks[0]["text"]),
                 v + 3, *plain(tok, "tmp\n"), *plain(tok, chunks[1]["text"]), v + 3, *plain(tok, "filename\n"),
                 *ids[1:]]
    want = hf_greedy(model, extra_ids, NEW)
    assert want != hf_greedy(model, ids, NEW)  # the context matters
    out = infill(detected, input_prefix=PREFIX, input_suffix=SUFFIX, input_extra=chunks)
    assert out["tokens_evaluated"] == len(extra_ids)
    assert out["content"] == tok.decode(want, skip_special_tokens=True)


def test_infill_streams_and_stops_at_a_word(tiny, detected):
    model, tok, _, _ = tiny
    text = tok.decode(hf_greedy(model, layout(tok, QWEN, PREFIX, SUFFIX), NEW), skip_special_tokens=True)
    stop = text[3:6]
    with httpx.stream("POST", detected.url + "/infill", timeout=120, json={
            "input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": NEW, "temperature": 0, "stream": True,
            "ignore_eos": True, "stop": [stop]}) as r:
        assert r.status_code == 200
        events = sse_events(r.iter_lines())
    assert "".join(e["content"] for e in events) == text[:text.index(stop)]
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert events[-1]["stop_type"] == "word" and events[-1]["stopping_word"] == stop
    whole = infill(detected, input_prefix=PREFIX, input_suffix=SUFFIX, stop=[stop])
    assert whole["content"] == text[:text.index(stop)] and whole["stop_type"] == "word"


def test_infill_refuses_by_field(detected):
    cases = [({"input_prefix": 5}, "input_prefix"), ({"input_extra": "x"}, "input_extra"),
             ({"input_extra": [{"text": "a", "path": "b"}]}, "input_extra"), ({"n_indent": "4"}, "n_indent"),
             ({"samplers": ["top_p", "infill"]}, "samplers"), ({"penalty_last_n": 64}, "penalty_last_n"),
             ({"samplers": ["top_k", "infill"], "top_k": 5000}, "top_k"),
             ({"response_fields": "content"}, "response_fields"), ({"t_max_predict_ms": 1.5}, "t_max_predict_ms"),
             ({"stream": "yes"}, "stream"), ({"n_predict": -2}, "n_predict"), ({"repeat_penalty": 0}, "repeat_penalty"),
             ({"input_extra": [{"text": "<|file_sep|>"}]}, None)]  # special text stays text: runs
    for body, param in cases:
        r = httpx.post(detected.url + "/infill", timeout=60, json={
            "input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 1, **body})
        assert r.status_code == (200 if param is None else 400), (body, r.text)
        if param is not None:
            assert r.json()["error"]["param"] == param, (body, r.text)


def test_star_coders_file_separator_is_the_embedded_vocabularys(tiny, named):
    """The embedded tokenizer holds StarCoder2's <repo_name> (id 3) and <file_sep> (id 5): the named template lays
    chunks out with them."""
    model, _, _, both = tiny
    from transformers import AutoTokenizer

    tok2 = AutoTokenizer.from_pretrained(both)
    assert tok2.convert_tokens_to_ids(["<repo_name>", "<file_sep>"]) == [3, 5]
    ids = [0, 3, *plain(tok2, "myproject\n"), 5, *plain(tok2, "a.py\n"), *plain(tok2, "X = 1\n"), 5,
           *plain(tok2, "filename\n"), *layout(tok2, STAR, PREFIX, SUFFIX)[1:]]
    out = infill(named, input_prefix=PREFIX, input_suffix=SUFFIX, input_extra=[{"filename": "a.py", "text": "X = 1\n"}])
    assert out["tokens_evaluated"] == len(ids)
    assert out["content"] == tok2.decode(hf_greedy(model, ids, NEW), skip_special_tokens=True)


# ------------------------------------------------------------------ llama.vim's request
DEDENT = "    xdef(1=x("  # a prefix whose greedy middle starts a line after a newline, indented by spaces
LONG = 160
LLAMA_VIM_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                    "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                    "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]


def llama_vim_body(**change) -> dict:
    """llama.vim's /infill body, field for field (the older penalty_last_n too)."""
    return {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "",
            "input_extra": [{"text": "X = 1\n", "time": [1733, 5000], "filename": "a.py"},
                            {"text": "Y = 2\n", "time": 1733.5, "filename": "b.py"}],
            "n_predict": NEW, "n_indent": 0, "top_k": 40, "top_p": 0.99, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 60_000,
            "t_max_predict_ms": 60_000, "response_fields": LLAMA_VIM_FIELDS, "penalty_last_n": 0, **change}


def test_llama_vims_request(detected):
    r = httpx.post(detected.url + "/infill", timeout=120, json=llama_vim_body())  # samplers ending in "infill"
    assert r.status_code == 200, r.text
    out = r.json()
    assert sorted(out) == sorted(LLAMA_VIM_FIELDS)  # only the paths asked, under their paths
    assert isinstance(out["content"], str) and out["truncated"] is False
    assert 1 <= out["timings/predicted_n"] <= NEW  # the infill stage may end the tiny model's middle at once
    assert out["timings/prompt_ms"] > 0 and 0 < out["timings/prompt_n"]
    assert out["timings/prompt_per_token_ms"] == pytest.approx(out["timings/prompt_ms"] / out["timings/prompt_n"])
    again = httpx.post(detected.url + "/infill", timeout=120, json=llama_vim_body(
        seed=3, response_fields=["tokens_cached", "timings/prompt_n", "timings/none"])).json()
    assert set(again) == {"tokens_cached", "timings/prompt_n"}  # a path naming nothing is left out
    assert again["tokens_cached"] > 0 and again["timings/prompt_n"] < out["timings/prompt_n"]  # the cached prefix
    drawn = httpx.post(detected.url + "/infill", timeout=120, json=llama_vim_body(
        samplers=["top_k", "top_p"], ignore_eos=True, seed=1)).json()  # a whole middle, NEW tokens
    n, ms = drawn["timings/predicted_n"], drawn["timings/predicted_ms"]
    assert n == NEW and ms > 0 and drawn["timings/predicted_per_second"] == pytest.approx(1e3 * n / ms)
    assert drawn["timings/predicted_per_token_ms"] == pytest.approx(ms / n)


def infill_verdict(tiny, prefix: str):
    """What the infill stage keeps of the first step's candidates under llama.vim's top_k 40 / top_p 0.99 (the
    server's top_p over the whole distribution), from transformers' logits: None where the middle must end."""
    import torch

    from radixlang_runtime.constrained.vocab import token_byte_table
    from radixlang_runtime.model.executor.infill_sampling import infill_filter

    model, tok, _, _ = tiny
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([layout(tok, QWEN, prefix, SUFFIX)])).logits[0, -1].float(), -1)
    ps, order = probs.sort(descending=True)
    ps, order = ps[:40], order[:40]
    kept = ((ps.cumsum(0) - ps) <= 0.99).tolist()
    ids = [t for t, k in zip(order.tolist(), kept) if k]
    table = token_byte_table(tok, len(probs))
    return infill_filter(ids, [p for p, k in zip(ps.tolist(), kept) if k], lambda t: table[t] or b"",
                         {2}.__contains__)


def test_the_infill_stage_decides_the_middle(tiny, detected):
    """The tiny model spreads its first step thin: for PREFIX no text token reaches a fifth of the top 40, so
    the stage ends the middle at once whatever the seed; for "import " one token stays, so it is the middle's
    first token whatever the seed. Without the stage the same seeds draw other things."""
    _, tok, _, _ = tiny

    def middle(prefix: str, samplers: list[str], seed: int, n: int) -> dict:
        r = httpx.post(detected.url + "/infill", timeout=120, json={
            "input_prefix": prefix, "input_suffix": SUFFIX, "n_predict": n, "top_k": 40, "top_p": 0.99,
            "samplers": samplers, "seed": seed})
        assert r.status_code == 200, r.text
        return r.json()

    assert infill_verdict(tiny, PREFIX) is None
    kept = infill_verdict(tiny, "import ")
    assert kept is not None and len(kept) == 1
    ended = [middle(PREFIX, ["top_k", "top_p", "infill"], seed, NEW) for seed in range(5)]
    assert all(out["content"] == "" and out["stop_type"] == "eos" for out in ended), ended
    assert any(middle(PREFIX, ["top_k", "top_p"], seed, NEW)["content"] for seed in range(5))
    first = {middle("import ", ["top_k", "top_p", "infill"], seed, 1)["content"] for seed in range(5)}
    assert first == {tok.decode(kept)}
    assert len({middle("import ", ["top_k", "top_p"], seed, 1)["content"] for seed in range(5)}) > 1


def greedy_text(tiny, prefix: str, n: int) -> str:
    model, tok, _, _ = tiny
    return tok.decode(hf_greedy(model, layout(tok, QWEN, prefix, SUFFIX), n), skip_special_tokens=True)


def test_n_indent_cuts_a_dedented_line(tiny, detected):
    text = greedy_text(tiny, DEDENT, NEW * 3)
    line = text[text.index("\n") + 1:]
    indent = len(line) - len(line.lstrip(" \t"))
    cut = indent_cut(text, indent + 1)
    assert cut is not None and indent_cut(text, indent) is None
    body = dict(input_prefix=DEDENT, input_suffix=SUFFIX, n_predict=NEW * 3)
    out = infill(detected, n_indent=indent + 1, **body)
    assert out["content"] == text[:cut] and out["stop_type"] == "limit"
    assert out["tokens_predicted"] < NEW * 3  # stopped early: the request was aborted
    assert infill(detected, n_indent=indent, **body)["content"] == text  # indented enough: the whole middle
    with httpx.stream("POST", detected.url + "/infill", timeout=120, json={
            "n_predict": NEW * 3, "temperature": 0, "ignore_eos": True, "stream": True, "n_indent": indent + 1,
            "input_prefix": DEDENT, "input_suffix": SUFFIX}) as r:
        assert r.status_code == 200
        events = sse_events(r.iter_lines())
    assert "".join(e["content"] for e in events) == text[:cut]  # the cut line never went out
    assert events[-1]["stop"] is True and events[-1]["stop_type"] == "limit"
    with httpx.Client(base_url=detected.url, timeout=60) as client:
        assert_idle_and_whole(client)


def test_time_limits_end_the_middle_early(tiny, detected):
    text = greedy_text(tiny, DEDENT, LONG)
    body = dict(input_prefix=DEDENT, input_suffix=SUFFIX, n_predict=LONG)
    out = infill(detected, t_max_predict_ms=1, **body)
    assert out["stop_type"] == "limit" and out["tokens_predicted"] < LONG
    assert "\n" in out["content"] and text.startswith(out["content"])
    assert infill(detected, t_max_predict_ms=600_000, **body)["tokens_predicted"] == LONG
    late = infill(detected, t_max_prompt_ms=1, response_fields=["content", "stop_type", "timings/prompt_ms"], **body)
    assert late["content"] == "" and late["stop_type"] == "limit" and late["timings/prompt_ms"] > 1
    with httpx.Client(base_url=detected.url, timeout=60) as client:
        assert_idle_and_whole(client)


# ------------------------------------------------------------------ llama.cpp's sizes, /metrics, the prompt's time
def test_a_long_infill_is_cut_to_llama_cpps_sizes(tiny, small):
    """n_batch 64 and a 512-token context, n_predict 8: the prefix's last 48 tokens, the suffix's first 64 / 4 - 2,
    the context layout's last 512 - 64 - 2 * 8 (its oldest tokens, the project line first, go); short ones whole."""
    model, tok, _, _ = tiny
    v = model.config.vocab_size - ROWS
    assert httpx.get(small.url + "/server_info", timeout=30).json()["chunked_prefill_size"] == 64
    assert httpx.get(small.url + "/get_model_info", timeout=30).json()["max_context_length"] == 512
    pre, suf = "a = b + c\n" * 40, "d = e * f\n" * 40
    chunks = [{"filename": f"m{i}.py", "text": f"def f{i}(x):\n    return x + {i}\n" * 8} for i in range(6)]
    extra = [v + 4, *plain(tok, "myproject\n")]
    for c in chunks:
        extra += [v + 3, *plain(tok, c["filename"] + "\n"), *plain(tok, c["text"])]
    extra += [v + 3, *plain(tok, "filename\n")]
    p, s = plain(tok, pre), plain(tok, suf)
    assert len(p) > 48 and len(s) > 14 and len(extra) > 432
    ids = [0, *extra[-432:], v, *p[-48:], v + 1, *s[:14], v + 2]
    out = infill(small, input_prefix=pre, input_suffix=suf, input_extra=chunks)
    assert out["tokens_evaluated"] == len(ids) == 1 + 432 + 1 + 48 + 1 + 14 + 1
    assert out["content"] == tok.decode(hf_greedy(model, ids, NEW), skip_special_tokens=True)
    assert out["truncated"] is False  # as llama.cpp: the cut is no truncation
    short = infill(small, input_prefix=PREFIX, input_suffix=SUFFIX, input_extra=chunks[:1])
    short_ids = [0, v + 4, *plain(tok, "myproject\n"), v + 3, *plain(tok, "m0.py\n"), *plain(tok, chunks[0]["text"]),
                 v + 3, *plain(tok, "filename\n"), *layout(tok, QWEN, PREFIX, SUFFIX)[1:]]
    assert short["tokens_evaluated"] == len(short_ids)
    assert short["content"] == tok.decode(hf_greedy(model, short_ids, NEW), skip_special_tokens=True)


def metric(srv, name: str) -> float:
    for line in httpx.get(srv.url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_limits_early_end_is_a_finished_request_not_an_abort(tiny, small):
    counts = ("radixlang:num_requests_total", "radixlang:num_aborted_requests_total")
    before = [metric(small, name) for name in counts]
    text = greedy_text(tiny, DEDENT, NEW * 3)
    line = text[text.index("\n") + 1:]
    indent = len(line) - len(line.lstrip(" \t"))
    out = infill(small, n_indent=indent + 1, input_prefix=DEDENT, input_suffix=SUFFIX, n_predict=NEW * 3)
    assert out["stop_type"] == "limit" and out["tokens_predicted"] < NEW * 3
    with httpx.stream("POST", small.url + "/infill", timeout=120, json={
            "input_prefix": DEDENT, "input_suffix": SUFFIX, "n_predict": LONG, "temperature": 0, "ignore_eos": True,
            "stream": True, "t_max_predict_ms": 1}) as r:
        events = sse_events(r.iter_lines())
    assert events[-1]["stop_type"] == "limit" and events[-1]["tokens_predicted"] < LONG
    assert [metric(small, name) for name in counts] == [before[0] + 2, before[1]]
    with httpx.Client(base_url=small.url, timeout=60) as client:
        assert_idle_and_whole(client)  # ended early all the same: its memory freed
    assert [metric(small, name) for name in counts] == [before[0] + 2, before[1]]  # counted once


def test_prompt_ms_leaves_the_queue_out(small):
    """One request runs at a time: an infill sent while another decodes waits for it to end, which its
    prompt_ms (from the prefill's start) leaves out, as llama.cpp's does."""
    blocker = {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 480, "min_new_tokens": 480,
                                                                 "temperature": 0}}
    with httpx.stream("POST", small.url + "/generate", timeout=120, json=blocker) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))  # it runs: the one running slot is taken
        sent = time.perf_counter()
        with ThreadPoolExecutor(1) as pool:
            queued = pool.submit(infill, small, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=1)
            for _ in lines:
                pass
            waited = time.perf_counter() - sent
            out = queued.result()
    assert waited > 0.1, f"the blocker ended {waited:.2f} s after the infill was sent: too soon to queue it"
    assert 0 < out["timings"]["prompt_ms"] < waited * 1e3 / 3, (out["timings"], waited)
