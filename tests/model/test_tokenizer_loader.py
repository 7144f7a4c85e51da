"""model/loader/tokenizer.py: the class AutoTokenizer resolves, loaded directly from its name in another process,
gives the same tokenizer (ids, text, special tokens, chat template) without importing torch or transformers'
auto machinery; a name outside transformers is refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir
from radixlang_runtime.model.loader.tokenizer import class_ref, load_tokenizer

TEXTS = ["Hello world", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n", "  spaces\tand\nnewlines  ", "naïve café 東京"]


def _same(a, b) -> None:
    assert type(a) is type(b)
    for text in TEXTS:
        ids = a.encode(text)
        assert ids == b.encode(text)
        assert a.decode(ids) == b.decode(ids)
        assert a.decode(ids, skip_special_tokens=True) == b.decode(ids, skip_special_tokens=True)
    assert a.all_special_ids == b.all_special_ids
    assert (a.bos_token_id, a.eos_token_id, a.pad_token_id) == (b.bos_token_id, b.eos_token_id, b.pad_token_id)
    assert a.chat_template == b.chat_template
    msgs = [{"role": "user", "content": "Hi"}]
    assert a.apply_chat_template(msgs, tokenize=False) == b.apply_chat_template(msgs, tokenize=False)


@pytest.fixture(scope="module", params=["TokenizersBackend", "Qwen2Tokenizer", "LlamaTokenizer"])
def tokenizer_dir(request, tmp_path_factory):
    """The embedded tokenizer's files under tokenizer classes of different transformers modules."""
    out = tmp_path_factory.mktemp(request.param)
    src = embedded_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(f"{src}/{name}", out / name)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = request.param
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return str(out)


def test_the_resolved_class_loads_the_same_tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(tokenizer_dir)
    ref = class_ref(auto)
    assert ref is not None and ref.startswith("transformers."), ref
    assert ref.split(":")[1] == type(auto).__qualname__
    _same(load_tokenizer(tokenizer_dir, ref), auto)
    _same(load_tokenizer(tokenizer_dir), auto)  # no name: AutoTokenizer


def test_another_process_loads_it_without_torch(tokenizer_dir):
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(tokenizer_dir)
    ref = class_ref(auto)
    code = ("import sys; from radixlang_runtime.model.loader.tokenizer import load_tokenizer; "
            f"t = load_tokenizer({tokenizer_dir!r}, {ref!r}); "
            "print(t.encode('Hello world'), 'torch' in sys.modules, 'transformers.models.auto' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [*str(auto.encode("Hello world")).split(), "False", "False"]


def test_a_class_outside_transformers_is_refused(tokenizer_dir):
    with pytest.raises(ValueError, match="not a transformers tokenizer class: 'os:path'"):
        load_tokenizer(tokenizer_dir, "os:path")
    with pytest.raises(ValueError, match="not a transformers tokenizer class"):
        load_tokenizer(tokenizer_dir, "transformers.tokenization_utils_tokenizers")

    class Local:  # a class of a checkpoint's own code has no importable name: None, AutoTokenizer everywhere
        pass

    Local.__module__ = "transformers_modules.tiny.tokenization_tiny"
    assert class_ref(Local()) is None


def test_a_remembered_class_skips_autotokenizer_until_the_files_change(tokenizer_dir, tmp_path, monkeypatch, caplog):
    """load_remembered: the first load resolves through AutoTokenizer and remembers the class; the next load of
    the same files uses it (AutoTokenizer not called); a changed file, a damaged record or an unwritable cache
    falls back to AutoTokenizer, with the same tokenizer each time."""
    import os

    import transformers

    from radixlang_runtime.model.loader.tokenizer import load_remembered

    real = transformers.AutoTokenizer.from_pretrained
    calls: list[str] = []

    def counted(path, *a, **kw):
        calls.append(path)
        return real(path, *a, **kw)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", counted)
    want = real(tokenizer_dir)
    cache = tmp_path / "cache"
    _same(load_remembered(tokenizer_dir, str(cache)), want)
    assert len(calls) == 1
    records = list((cache / "tokenizer_classes").iterdir())
    assert len(records) == 1 and json.loads(records[0].read_text())["class"] == class_ref(want)
    _same(load_remembered(tokenizer_dir, str(cache)), want)
    assert len(calls) == 1  # remembered
    cfg = os.path.join(tokenizer_dir, "tokenizer_config.json")
    os.utime(cfg, ns=(os.stat(cfg).st_atime_ns, os.stat(cfg).st_mtime_ns + 10**9))  # the files changed: a new key
    _same(load_remembered(tokenizer_dir, str(cache)), want)
    assert len(calls) == 2 and len(list((cache / "tokenizer_classes").iterdir())) == 2
    for record in (cache / "tokenizer_classes").iterdir():
        record.write_text('{"class": "transformers.nowhere:Nothing"}')  # damaged: resolved again, with a warning
    _same(load_remembered(tokenizer_dir, str(cache)), want)
    assert len(calls) == 3 and "resolving it again" in caplog.text
    _same(load_remembered(tokenizer_dir, str(cache)), want)  # the record was written anew
    assert len(calls) == 3
    blocked = tmp_path / "file"
    blocked.write_text("")  # a cache root that is a file: nothing can be written under it
    _same(load_remembered(tokenizer_dir, str(blocked)), want)
    assert len(calls) == 4
