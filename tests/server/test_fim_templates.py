"""Fill-in-the-middle templates without a server (fim_templates.py): the registry's layouts, detection from a
tokenizer's added tokens (one family, none, several), --completion-template's checks, the prompt ids (markers as
ids, the texts plain, a non-special marker written in the text refused), the completions parser's 400s, and
llama.cpp's /infill without a server: its parser, its prompt (input_extra in the repo-level layout: the repository
name line where the tokenizer has its token, the chunks behind the file separator, refused by name without one,
the current file's line), llama.cpp's cut to fit (fit, fit_sizes) and /tokenize with a suffix."""

from __future__ import annotations

import types

import pytest

from radixlang_runtime.fim_templates import (FIM_TEMPLATES, PREFIX, SUFFIX, completion_fim, detect_fim,
                                             no_fim_message)
from radixlang_runtime.prompt_encoder import PromptEncoder
from radixlang_runtime.protocol.limits import FieldError, RuntimeLimits
from radixlang_runtime.server.http_common import BadRequest
from radixlang_runtime.server.infill_api import FILE_LINE, REPO_LINE, SNIPPET, fit, fit_sizes, infill_ids, \
    parse_infill
from radixlang_runtime.server.openai_records import parse_completion
from radixlang_runtime.server.tokenize_api import tokenize_body
from radixlang_runtime.server_args import ServerArgs
from radixlang_runtime.server_cli import parse_server_args

QWEN = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
STAR = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
DEEPSEEK = ["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"]
SEP = "<|file_sep|>"
REPO = "<|repo_name|>"


def tokenizer(special: list[str] = (), plain: list[str] = ()):
    """The embedded tokenizer with `special` added as special tokens and `plain` as non-special added tokens."""
    from transformers import AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(special)})
    if plain:
        tok.add_tokens(list(plain))
    return tok


@pytest.fixture(scope="module")
def base():
    return tokenizer()


def test_the_registry_has_sglangs_names_in_psm_order():
    assert sorted(FIM_TEMPLATES) == ["deepseek_coder", "qwen_coder", "star_coder"]
    assert FIM_TEMPLATES["qwen_coder"].layout == (QWEN[0], PREFIX, QWEN[1], SUFFIX, QWEN[2])
    assert FIM_TEMPLATES["star_coder"].markers == tuple(STAR)
    assert FIM_TEMPLATES["deepseek_coder"].markers == tuple(DEEPSEEK)
    assert all(t.psm for t in FIM_TEMPLATES.values())


@pytest.mark.parametrize("name,markers", [("qwen_coder", QWEN), ("star_coder", STAR), ("deepseek_coder", DEEPSEEK)])
def test_detection_finds_the_family_whose_markers_are_tokens(base, name, markers):
    tok = tokenizer(markers)
    fim, matched = detect_fim(tok)
    assert matched == (name,)
    assert fim.template.name == name
    v = len(base)
    assert fim.marker_ids == {m: v + i for i, m in enumerate(markers)}
    assert completion_fim(None, tok) == fim


def test_no_markers_or_two_families_detect_nothing(base):
    assert detect_fim(base) == (None, ())
    assert completion_fim(None, base) is None
    assert "has none" in no_fim_message(base)
    two = tokenizer(STAR + QWEN)
    fim, matched = detect_fim(two)
    assert fim is None
    assert sorted(matched) == ["qwen_coder", "star_coder"]
    assert "several (star_coder, qwen_coder)" in no_fim_message(two)
    picked = completion_fim("qwen_coder", two)  # the flag picks
    assert picked.template.name == "qwen_coder"
    assert picked.marker_ids[QWEN[0]] == len(base) + 3
    with pytest.raises(ValueError, match=r"completion_template deepseek_coder: the tokenizer has no single token"):
        completion_fim("deepseek_coder", two)


def test_the_flag_takes_sglangs_names_only():
    assert parse_server_args(["--completion-template", "deepseek_coder"]).completion_template == "deepseek_coder"
    assert ServerArgs().completion_template is None
    with pytest.raises(ValueError, match=r"completion_template 'codellama': known are deepseek_coder, qwen_coder"):
        ServerArgs(completion_template="codellama")


def test_prompt_ids_put_the_markers_as_ids_and_the_texts_plain(base):
    tok = tokenizer(QWEN)
    fim, _ = detect_fim(tok)
    enc = PromptEncoder(tok)
    v = len(base)
    pre, suf = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))"
    p, s = tok.encode(pre, add_special_tokens=False), tok.encode(suf, add_special_tokens=False)
    assert fim.prompt_ids(enc.encode_literal(pre), enc.encode_literal(suf), [0]) == [0, v, *p, v + 1, *s, v + 2]
    spoof = "x = '<|fim_middle|>'"  # a user's text naming a marker stays text
    ids = fim.prompt_ids(enc.encode_literal(spoof), enc.encode_literal(""))
    assert ids[1:-2] == tok.encode(spoof, add_special_tokens=False, split_special_tokens=True)
    assert ids.count(v + 2) == 1 and ids[-1] == v + 2
    assert tok.encode(spoof, add_special_tokens=False).count(v + 2) == 1  # what parsing it whole would have run


def test_a_non_special_marker_in_the_text_is_refused(base):
    tok = tokenizer(plain=QWEN)  # added, not special: the tokenizer parses them out of plain text
    fim, _ = detect_fim(tok)
    enc = PromptEncoder(tok)
    assert fim.template.name == "qwen_coder"
    with pytest.raises(FieldError, match=r"suffix holds the fill-in-the-middle marker '<\|fim_prefix\|>'") as e:
        fim.prompt_ids(enc.encode_literal("a"), enc.encode_literal("b<|fim_prefix|>"))
    assert e.value.param == "suffix"
    with pytest.raises(FieldError) as e:
        fim.prompt_ids(enc.encode_literal("<|fim_middle|>"), enc.encode_literal("b"))
    assert e.value.param == "prompt"


def _state(tok, fim, ctx: int = 64, slots: int = 64, **args):
    tm = types.SimpleNamespace(tokenizer=tok, limits=RuntimeLimits(ctx, len(tok), slots), encoder=PromptEncoder(tok))
    return types.SimpleNamespace(tm=tm, fim=fim, served_model_name="m", args=ServerArgs(**args))


def test_the_completions_parser_takes_a_suffix_only_where_it_can_run(base):
    tok = tokenizer(QWEN)
    fim, _ = detect_fim(tok)
    req = parse_completion(_state(tok, fim), {"prompt": ["a", "b"], "suffix": "c", "n": 2, "stream": True})
    assert req.suffix == "c"
    assert req.prompts == ("a", "b")
    assert parse_completion(_state(base, None), {"prompt": "a", "suffix": ""}).suffix is None  # "": no suffix
    cases = [
        (_state(base, None), {"prompt": "a", "suffix": "b"}, "suffix", "this model's tokenizer has none"),
        (_state(tok, fim), {"prompt": "a", "suffix": "b", "echo": True}, "echo", "echo is not supported with suffix"),
        (_state(tok, fim), {"prompt": [1, 2], "suffix": "b"}, "suffix", "suffix needs a text prompt"),
        (_state(tok, fim), {"prompt": "a", "suffix": "b", "truncate_prompt_tokens": 3}, "truncate_prompt_tokens",
         "not supported with suffix"),
        (_state(tok, fim), {"prompt": "a", "suffix": 5}, "suffix", "suffix must be a string"),
    ]
    for state, body, param, words in cases:
        with pytest.raises(FieldError, match=words) as e:
            parse_completion(state, body)
        assert e.value.param == param


def test_extra_chunks_go_behind_the_file_separator(base):
    tok = tokenizer(QWEN + [SEP])
    fim, _ = detect_fim(tok)
    v = len(base)
    assert fim.file_sep_id == v + 3
    enc = PromptEncoder(tok)
    name, text = enc.encode_literal("a.py\n"), enc.encode_literal("X = 1\n")
    assert fim.repo_name_id is None  # no <|repo_name|> in this tokenizer: no project line
    assert fim.extra_ids([(name, text), ([], [])]) == [v + 3, *name, *text, v + 3, v + 3]
    assert fim.extra_ids([(name, text)], repo=[7], current=[8, 9]) == [v + 3, *name, *text, v + 3, 8, 9]
    ids = fim.prompt_ids(enc.encode_literal("p"), enc.encode_literal("s"), [0], extra=[v + 3, *name, *text])
    assert ids[:2 + len(name) + len(text)] == [0, v + 3, *name, *text] and ids[-1] == v + 2
    assert detect_fim(tokenizer(QWEN))[0].file_sep_id is None
    assert completion_fim("star_coder", tokenizer(STAR)).file_sep_id == 5  # the embedded vocabulary's <file_sep>


def test_the_repository_name_line_leads_the_chunks(base):
    """Qwen2.5-Coder's <|repo_name|> (an added token here) and StarCoder2's <repo_name> (the embedded vocabulary's
    id 3) open the layout, llama.cpp's project line after them; the current file's line closes it."""
    v = len(base)
    fim, _ = detect_fim(tokenizer(QWEN + [SEP, REPO]))
    assert (fim.file_sep_id, fim.repo_name_id) == (v + 3, v + 4)
    assert fim.extra_ids([([1], [2]), ([3], [4])], repo=[5, 6], current=[7]) == [v + 4, 5, 6, v + 3, 1, 2, v + 3, 3, 4,
                                                                                v + 3, 7]
    star = completion_fim("star_coder", tokenizer(STAR))
    assert star.repo_name_id == 3
    assert star.extra_ids([([1], [2])], repo=[5], current=[7]) == [3, 5, 5, 1, 2, 5, 7]
    plain_repo = tokenizer(QWEN + [SEP], plain=[REPO])  # parsed out of plain text: refused in a chunk
    fim, _ = detect_fim(plain_repo)
    enc = PromptEncoder(plain_repo)
    with pytest.raises(FieldError, match=r"input_extra holds the fill-in-the-middle marker '<\|repo_name\|>'"):
        fim.extra_ids([(enc.encode_literal("a\n"), enc.encode_literal("x" + REPO))])


def test_extra_chunks_follow_llama_cpps_text_separator_without_a_file_separator():
    """llama.cpp's format_infill without a file separator token: each chunk after the snippet separator's ids, no
    file names, no current-file line."""
    for markers in (QWEN, DEEPSEEK):
        fim, _ = detect_fim(tokenizer(markers))
        assert fim.file_sep_id is None and fim.repo_name_id is None
        assert fim.extra_ids([([1], [2]), ([3], [4, 5])], repo=[6], current=[7], snippet=[8, 9]) == [8, 9, 2, 8, 9,
                                                                                                      4, 5]
    plain_sep = tokenizer(QWEN, plain=[SEP])  # a non-special separator the tokenizer parses out of text
    fim, _ = detect_fim(plain_sep)
    enc = PromptEncoder(plain_sep)
    with pytest.raises(FieldError, match=r"input_extra holds the fill-in-the-middle marker '<\|file_sep\|>'"):
        fim.extra_ids([(enc.encode_literal("a\n"), enc.encode_literal("x" + SEP))])
    extra = fim.extra_ids([(enc.encode_literal("a\n"), enc.encode_literal("x"))])
    with pytest.raises(FieldError) as e:  # with chunks the separator is a marker of the prefix too
        fim.prompt_ids(enc.encode_literal(SEP), [], names=("input_prefix", "input_suffix"), extra=extra)
    assert e.value.param == "input_prefix"


def test_the_infill_parser_takes_llama_cpps_fields(base):
    tok = tokenizer(QWEN + [SEP])
    fim, _ = detect_fim(tok)
    state = _state(tok, fim)
    req = parse_infill(state, {"input_prefix": "a", "input_suffix": "b", "prompt": "c", "n_predict": -1, "seed": -1,
                               "repeat_penalty": 1.1, "top_k": 5, "stop": ["\n"], "cache_prompt": True,
                               "input_extra": [{"filename": "f.py", "text": "t"}, {"text": "u"}]})
    assert (req.prefix, req.suffix, req.prompt, req.options.max_tokens) == ("a", "b", "c", None)
    assert req.extra == (("f.py", "t"), ("tmp", "u"))
    assert req.options.sampling["repetition_penalty"] == 1.1 and req.options.sampling["top_k"] == 5
    assert req.options.sampling["sampling_seed"] is None and req.options.sampling["stop"] == ["\n"]
    assert parse_infill(state, {"n_predict": 3}).options.max_tokens == 3
    with pytest.raises(BadRequest, match="suffix needs fill-in-the-middle tokens") as e:
        parse_infill(_state(base, None), {"input_prefix": "a"})
    assert str(e.value) == no_fim_message(base)
    enc = PromptEncoder(tok)
    v = len(base)
    ids = infill_ids(_state(tok, fim, 4096, 4096, chunked_prefill_size=64), req)  # room for the chunks
    chunks = [v + 3, *enc.encode_literal("f.py\n"), *enc.encode_literal("t"), v + 3, *enc.encode_literal("tmp\n"),
              *enc.encode_literal("u"), v + 3, *enc.encode_literal("filename\n")]
    assert ids == [*enc.prefix_ids, *chunks, v, *enc.encode_literal("a"), *enc.encode_literal("c"), v + 1,
                   *enc.encode_literal("b"), v + 2]
    plain_tok = tokenizer(QWEN)  # no file separator: llama.cpp's text separator before each chunk
    plain_fim, _ = detect_fim(plain_tok)
    lit = PromptEncoder(plain_tok).encode_literal
    ids = infill_ids(_state(plain_tok, plain_fim, 4096, 4096, chunked_prefill_size=64), req)
    assert ids == [*enc.prefix_ids, *lit(SNIPPET), *lit("t"), *lit(SNIPPET), *lit("u"), v, *lit("a"), *lit("c"),
                   v + 1, *lit("b"), v + 2]
    assert lit(SNIPPET) == lit("\n\n--- snippet ---\n\n") and len(lit(SNIPPET)) > 1


def test_fit_cuts_as_llama_cpps_format_infill():
    prefix, suffix, extra = list(range(1000)), list(range(1000, 2000)), list(range(2000, 3000))
    p, s, e = fit(prefix, suffix, 5, extra, n_batch=64, n_ctx=512, n_predict=8)
    assert p == prefix[-48:]  # 3 * (64 // 4): the end, nearest the cursor
    assert s == suffix[:16 - 2 - 5]  # 64 // 4, less the two markers and the prompt: the start
    assert e == extra[-(512 - 64 - 2 * 8):]  # the context's newest tokens
    assert fit(prefix[:48], suffix[:9], 5, extra[:432], 64, 512, 8) == (prefix[:48], suffix[:9], extra[:432])
    assert fit([1, 2], [3], 0, [4], 64, 512, 8) == ([1, 2], [3], [4])  # short: untouched
    assert fit(prefix, suffix, 20, extra, 64, 512, 240) == (prefix[-48:], [], [])  # no room left for either
    p, s, e = fit(prefix, suffix, 0, extra, 4096, 8192, 0)
    assert (len(p), len(s), len(e)) == (1000, 1000, 1000)


def test_fit_sizes_are_the_prefill_chunk_and_the_context(base):
    def sizes(ctx, slots, **args):
        return fit_sizes(_state(base, None, ctx, slots, **args))

    assert sizes(512, 2048, chunked_prefill_size=64) == (64, 512)
    assert sizes(4096, 1024, chunked_prefill_size=256) == (256, 1024)  # the KV pool bounds the context
    assert sizes(4096, 4096, chunked_prefill_size=-1, max_prefill_tokens=512) == (512, 4096)  # chunking off
    assert sizes(512, 2048, chunked_prefill_size=8192) == (512, 512)  # at most the context
    assert sizes(512, 512) == (512, 512)  # unresolved sizes: the context


def test_a_long_infill_is_cut_to_fit_and_a_short_one_is_not(base):
    """With n_batch 64 and a 512-token context: the prefix's last 48 tokens, the suffix's first 16 - 2 - (the
    prompt's), the layout's last 512 - 64 - 2 * n_predict; the prompt whole."""
    tok = tokenizer(QWEN + [SEP, REPO])
    fim, _ = detect_fim(tok)
    state = _state(tok, fim, 512, 2048, chunked_prefill_size=64)
    enc = PromptEncoder(tok)
    v = len(base)
    pre, suf, typed = "a = b + c\n" * 40, "d = e * f\n" * 40, "g = "
    chunks = [{"filename": f"m{i}.py", "text": f"def f{i}(x):\n    return x + {i}\n" * 8} for i in range(6)]
    layout = [v + 4, *enc.encode_literal(REPO_LINE)]
    for c in chunks:
        layout += [v + 3, *enc.encode_literal(c["filename"] + "\n"), *enc.encode_literal(c["text"])]
    layout += [v + 3, *enc.encode_literal(FILE_LINE)]
    p, s, t = enc.encode_literal(pre), enc.encode_literal(suf), enc.encode_literal(typed)
    assert len(p) > 48 and len(s) > 16 and len(layout) > 512 and len(t) == 3
    req = parse_infill(state, {"input_prefix": pre, "input_suffix": suf, "prompt": typed, "input_extra": chunks,
                               "n_predict": 8})
    ids = infill_ids(state, req)
    kept = layout[-(512 - 64 - 16):]
    assert ids == [*enc.prefix_ids, *kept, v, *p[-48:], *t, v + 1, *s[:16 - 2 - 3], v + 2]
    assert len(ids) == len(enc.prefix_ids) + 432 + 1 + 48 + 3 + 1 + 11 + 1
    assert kept[0] != v + 4  # the oldest go first: the project line
    req = parse_infill(state, {"input_prefix": pre, "input_suffix": suf, "input_extra": chunks})  # n_predict unset
    assert infill_ids(state, req)[len(enc.prefix_ids):][:448] == layout[-448:]
    short = {"input_prefix": "x = ", "input_suffix": "\n", "prompt": "1", "input_extra": chunks[:1], "n_predict": 8}
    lit = enc.encode_literal
    want = [*enc.prefix_ids, v + 4, *lit(REPO_LINE), v + 3, *lit("m0.py\n"), *lit(chunks[0]["text"]), v + 3,
            *lit(FILE_LINE), v, *lit("x = "), *lit("1"), v + 1, *lit("\n"), v + 2]
    assert infill_ids(state, parse_infill(state, short)) == want


def test_the_infill_parts_name_their_field():
    tok = tokenizer(plain=QWEN + [SEP])  # added, not special: parsed out of plain text
    fim, _ = detect_fim(tok)
    state = _state(tok, fim)
    for body, param in (({"prompt": "<|fim_prefix|>"}, "prompt"), ({"input_prefix": "<|fim_middle|>"}, "input_prefix"),
                        ({"input_suffix": "<|fim_suffix|>"}, "input_suffix"),
                        ({"input_extra": [{"filename": SEP, "text": ""}]}, "input_extra")):
        with pytest.raises(FieldError) as e:
            infill_ids(state, parse_infill(state, body))
        assert e.value.param == param


def test_tokenize_with_a_suffix_answers_the_completions_ids(base):
    tok = tokenizer(QWEN)
    fim, _ = detect_fim(tok)
    state = _state(tok, fim)
    enc = PromptEncoder(tok)
    want = fim.prompt_ids(enc.encode_literal("a"), enc.encode_literal("b"), enc.prefix_ids)
    assert tokenize_body(state, {"prompt": "a", "suffix": "b"})["tokens"] == want
    assert tokenize_body(state, {"prompt": ["a"], "suffix": "b", "add_special_tokens": False})["tokens"] == [
        fim.prompt_ids(enc.encode_literal("a"), enc.encode_literal("b"))]
    assert tokenize_body(state, {"prompt": "a", "suffix": ""})["tokens"] == tok.encode("a")
    with pytest.raises(FieldError, match="this model's tokenizer has none") as e:
        tokenize_body(_state(base, None), {"prompt": "a", "suffix": "b"})
    assert e.value.param == "suffix"
    with pytest.raises(FieldError, match="suffix applies to \"prompt\" only"):
        tokenize_body(state, {"messages": [{"role": "user", "content": "a"}], "suffix": "b"})
