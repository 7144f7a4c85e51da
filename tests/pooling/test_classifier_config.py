"""classifier.py and the registry without a server: a *ForSequenceClassification config.json read into labels and
an activation, what is not implemented refused by name, the activations against torch's."""

from __future__ import annotations

import json

import pytest

from radixlang_runtime.classifier import (classifier_activation, classifier_architecture, classifier_labels,
                                          classifier_pad_id, classify_probs, cross_encoder_score,
                                          without_trailing_pad)
from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.pooling import PoolingConfig, read_pooling_config

TINY = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 64}


def _cfg(arch: str = "Qwen3ForSequenceClassification", **extra) -> dict:
    return {"architectures": [arch], **TINY, **extra}


def test_labels_from_id2label_or_num_labels():
    assert classifier_labels(_cfg(id2label={"1": "yes", "0": "no"})) == ("no", "yes")
    assert classifier_labels(_cfg(num_labels=3)) == ("LABEL_0", "LABEL_1", "LABEL_2")
    assert classifier_labels(_cfg()) == ("LABEL_0", "LABEL_1")  # transformers' default num_labels
    with pytest.raises(ValueError, match="id2label"):
        classifier_labels(_cfg(id2label={"0": "a", "2": "b"}))


@pytest.mark.parametrize("extra, labels, activation", [
    ({}, 2, "softmax"),
    ({"problem_type": "single_label_classification"}, 3, "softmax"),
    ({}, 1, "sigmoid"),
    ({"problem_type": "multi_label_classification"}, 3, "sigmoid"),
    ({"problem_type": "regression"}, 1, "identity"),
])
def test_activation_follows_problem_type(extra, labels, activation):
    assert classifier_activation(_cfg(**extra), labels) == activation


@pytest.mark.parametrize("extra, name", [
    ({"problem_type": "ordinal"}, "problem_type"),
    ({"sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"},
     "sbert_ce_default_activation_function"),
    ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}}, "activation_fn"),
])
def test_unimplemented_settings_are_refused_by_name(extra, name):
    with pytest.raises(ValueError, match=name):
        classifier_activation(_cfg(**extra), 1)


def test_architectures():
    assert classifier_architecture(_cfg()) == "Qwen3ForSequenceClassification"
    assert classifier_architecture(_cfg("Qwen3ForCausalLM")) is None
    with pytest.raises(ValueError, match="Phi3ForSequenceClassification is not supported"):
        classifier_architecture(_cfg("Phi3ForSequenceClassification"))
    for arch, impl in (("Phi3ForSequenceClassification", "auto"), ("LlamaForSequenceClassification",
                                                                     "transformers")):
        with pytest.raises(ValueError, match=arch):
            ModelConfig.from_dict(_cfg(arch), impl)


def test_model_config_names_the_classifier():
    for arch in ("LlamaForSequenceClassification", "MistralForSequenceClassification",
                 "Qwen2ForSequenceClassification", "Qwen3ForSequenceClassification",
                 "Gemma2ForSequenceClassification"):
        cfg = ModelConfig.from_dict(_cfg(arch, num_labels=3))
        assert cfg.architecture == arch and cfg.num_labels == 3
    assert ModelConfig.from_dict(_cfg("Qwen3ForCausalLM")).num_labels == 0
    assert ModelConfig.from_dict(_cfg("Qwen2ForSequenceClassification")).attention_bias is True
    with pytest.raises(ValueError, match="quantization_config"):
        ModelConfig.from_dict(_cfg(quantization_config={"quant_method": "fp8"}))


def test_pooling_config_of_a_classifier_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_cfg(id2label={"0": "neg", "1": "pos"})))
    cfg = read_pooling_config(str(tmp_path))
    assert cfg.classifies and cfg.labels == ("neg", "pos") and cfg.activation == "softmax"
    assert cfg.mode == "last" and cfg.normalize is False and cfg.source == "classifier"
    assert PoolingConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.pad_token_id is None
    (tmp_path / "config.json").write_text(json.dumps(_cfg(pad_token_id=7)))
    padded = read_pooling_config(str(tmp_path))
    assert padded.pad_token_id == 7 and PoolingConfig.from_dict(json.loads(json.dumps(padded.to_dict()))) == padded
    (tmp_path / "config.json").write_text(json.dumps(_cfg("Qwen3Model")))
    assert not read_pooling_config(str(tmp_path)).classifies


def test_trailing_pad_tokens_are_cut_where_transformers_pools():
    assert without_trailing_pad([5, 6, 0, 0], 0) == [5, 6]
    assert without_trailing_pad([5, 0, 6, 0], 0) == [5, 0, 6]  # a pad inside the prompt is read
    assert without_trailing_pad([0, 0, 0], 0) == [0]  # all pads: transformers pools position 0
    assert without_trailing_pad([5, 6, 0], None) == [5, 6, 0]  # no pad token: the last token, whatever it is
    assert classifier_pad_id(_cfg()) is None and classifier_pad_id(_cfg(pad_token_id=3)) == 3
    for bad in ("3", -1, True, [3]):
        with pytest.raises(ValueError, match="pad_token_id"):
            classifier_pad_id(_cfg(pad_token_id=bad))


def test_probabilities_equal_torch():
    import torch

    logits = [0.3, -1.2, 2.5]
    t = torch.tensor(logits, dtype=torch.float64)
    assert classify_probs(logits, "softmax") == pytest.approx(t.softmax(0).tolist(), abs=1e-12)
    assert classify_probs(logits, "sigmoid") == pytest.approx(t.sigmoid().tolist(), abs=1e-12)
    assert classify_probs(logits, "identity") == logits
    assert classify_probs([-800.0, 800.0], "sigmoid") == [0.0, 1.0]  # no overflow
    assert cross_encoder_score([-0.7]) == pytest.approx(torch.tensor(-0.7).sigmoid().item(), abs=1e-7)


def test_a_classifier_refuses_what_pooling_models_refuse():
    from radixlang_runtime.server_args import ServerArgs

    args = ServerArgs(model_path="m", quantization="int8")  # the runner turns is_embedding on for a classifier
    with pytest.raises(ValueError, match="quantization 'int8' is not implemented with a pooling model"):
        args.replace(is_embedding=True)
