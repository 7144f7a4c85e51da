"""pooling.py without a model: a sentence-transformers directory's pooling read (both module spellings), what is not
implemented refused by name, the edge's finishing steps, the chunk sums of mean pooling."""

from __future__ import annotations

import json
import math

import pytest

from radixlang_runtime.pooling import (PooledSum, PoolingConfig, PoolSpec, check_dimensions, finish_embedding,
                                       read_pooling_config, softmax_last)

OLD = "sentence_transformers.models."
NEW = {"Transformer": "sentence_transformers.base.modules.transformer.Transformer",
       "Pooling": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
       "Normalize": "sentence_transformers.base.modules.normalize.Normalize",
       "Dense": "sentence_transformers.sentence_transformer.modules.dense.Dense"}


def _write(d, modules: list[str], pooling: dict, config: dict | None = None, st: dict | None = None,
           bert: dict | None = None):
    (d / "config.json").write_text(json.dumps({"hidden_size": 8, **(config or {})}))
    paths = ["", "1_Pooling", "2_Normalize", "3_Dense"]
    (d / "modules.json").write_text(json.dumps([{"idx": i, "name": str(i), "path": paths[i], "type": t}
                                                for i, t in enumerate(modules)]))
    (d / "1_Pooling").mkdir(exist_ok=True)
    (d / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if st is not None:
        (d / "config_sentence_transformers.json").write_text(json.dumps(st))
    if bert is not None:
        (d / "sentence_bert_config.json").write_text(json.dumps(bert))
    return str(d)


def test_sentence_transformers_before_6(tmp_path):
    d = _write(tmp_path, [OLD + "Transformer", OLD + "Pooling", OLD + "Normalize"],
               {"word_embedding_dimension": 8, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False},
               st={"prompts": {"query": "query: "}, "default_prompt_name": "query"}, bert={"max_seq_length": 128})
    cfg = read_pooling_config(d)
    assert (cfg.mode, cfg.normalize, cfg.source, cfg.default_prompt, cfg.max_seq_length, cfg.chat_template) == \
        ("mean", True, "sentence-transformers", "query: ", 128, False)
    assert PoolingConfig.from_dict(cfg.to_dict()) == cfg


def test_sentence_transformers_6_without_normalize(tmp_path):
    d = _write(tmp_path, [NEW["Transformer"], NEW["Pooling"]], {"pooling_mode": "cls"},
               bert={"modality_config": {"text": {}, "message": {}}}, config={"matryoshka_dimensions": [4, 8]})
    cfg = read_pooling_config(d)
    assert (cfg.mode, cfg.normalize, cfg.chat_template, cfg.matryoshka, cfg.matryoshka_dimensions) == \
        ("cls", False, True, True, (4, 8))
    check_dimensions(cfg, 4)
    with pytest.raises(ValueError, match=r"dimensions 6 is not one the model was trained for"):
        check_dimensions(cfg, 6)


def test_a_plain_directory_gets_the_decoder_default(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    cfg = read_pooling_config(str(tmp_path))
    assert (cfg.mode, cfg.normalize, cfg.source, cfg.matryoshka) == ("last", True, "default", False)
    with pytest.raises(ValueError, match="not Matryoshka-trained"):
        check_dimensions(cfg, 4)


@pytest.mark.parametrize("modules, pooling, bert, match", [
    (["Transformer", "Pooling", "Dense"], {"pooling_mode": "mean"}, None, "Dense"),
    (["Transformer", "Pooling"], {"pooling_mode": "max"}, None, "'max' is not supported"),
    (["Transformer", "Pooling"], {"pooling_mode_weightedmean_tokens": True}, None, "weightedmean_tokens"),
    (["Transformer", "Pooling"], {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, None,
     "exactly one mode"),
    (["Transformer", "Pooling"], {"pooling_mode": "mean", "include_prompt": False}, None, "include_prompt"),
    (["Transformer", "Pooling"], {"pooling_mode": "mean"}, {"do_lower_case": True}, "do_lower_case"),
    (["Pooling", "Transformer"], {"pooling_mode": "mean"}, None, "pipeline"),
])
def test_what_is_not_implemented_is_refused_by_name(tmp_path, modules, pooling, bert, match):
    d = _write(tmp_path, [NEW[m] for m in modules], pooling, bert=bert)
    with pytest.raises(ValueError, match=match):
        read_pooling_config(d)


def test_finishing_steps():
    assert finish_embedding([3.0, 4.0, 12.0], normalize=True) == pytest.approx([3 / 13, 4 / 13, 12 / 13])
    assert finish_embedding([3.0, 4.0, 12.0], normalize=True, dimensions=2) == pytest.approx([0.6, 0.8])
    assert finish_embedding([3.0, 4.0], normalize=False) == [3.0, 4.0]
    assert softmax_last([0.0, math.log(3.0)]) == pytest.approx(0.75)


def test_mean_adds_the_chunks_and_divides_once():
    s = PooledSum(PoolSpec("mean"))
    s.add([1.0, 2.0], rows=2)
    s.add([3.0, 4.0], rows=2)
    assert s.result() == [1.0, 1.5]
    last = PooledSum(PoolSpec("last"))
    last.add([5.0, 6.0], rows=1)
    assert last.result() == [5.0, 6.0] and PooledSum(PoolSpec("cls")).result() is None
    with pytest.raises(ValueError, match="token_ids"):
        PoolSpec("token_logits")
    assert PoolSpec.from_wire(PoolSpec("token_logits", (3, 4)).to_wire()) == PoolSpec("token_logits", (3, 4))
