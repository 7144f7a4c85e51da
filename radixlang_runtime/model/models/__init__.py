"""The model registry: architecture name (config.json's `architectures[0]`) -> ModelFamily.

Adding a family is one file in this package (its config parser and model class) plus one line in
_FAMILIES. The runner builds whatever family_for returns; nothing else names an architecture. Architectures
with no file here run through transformers' own modeling code (TRANSFORMERS, --model-impl auto | transformers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.model.models import (deepseek, gemma2, gemma3, gemma4, gemma4_config, glm4_moe, gpt_oss,
                                            granite_hybrid, llama4, llama_family, mixtral, nemotron_h, nextn,
                                            olmo2, olmoe, phi3, qwen3_next, qwen_moe, sequence_classifier,
                                            transformers_fallback, vision_language)


@dataclass(frozen=True)
class ModelFamily:
    architecture: str
    parse: Callable[[dict], ModelConfig]  # config.json -> ModelConfig; ValueError names a field not honoured
    model_class: type  # (cfg, backend, rotary, shard, reduce) -> nn.Module with load_hf_state_dict, forward


_FAMILIES = (
    ModelFamily("LlamaForCausalLM", llama_family.parse_llama, llama_family.LlamaForCausalLM),
    ModelFamily("MistralForCausalLM", llama_family.parse_mistral, llama_family.LlamaForCausalLM),
    ModelFamily("Qwen2ForCausalLM", llama_family.parse_qwen2, llama_family.LlamaForCausalLM),
    ModelFamily("Qwen3ForCausalLM", llama_family.parse_qwen3, llama_family.LlamaForCausalLM),
    ModelFamily("SmolLM3ForCausalLM", llama_family.parse_smollm3, llama_family.LlamaForCausalLM),
    ModelFamily("Phi3ForCausalLM", phi3.parse_phi3, phi3.Phi3ForCausalLM),
    ModelFamily("MixtralForCausalLM", mixtral.parse_mixtral, mixtral.MoEForCausalLM),
    ModelFamily("Qwen2MoeForCausalLM", qwen_moe.parse_qwen2_moe, qwen_moe.MoEForCausalLM),
    ModelFamily("Qwen3MoeForCausalLM", qwen_moe.parse_qwen3_moe, qwen_moe.MoEForCausalLM),
    ModelFamily("OlmoeForCausalLM", olmoe.parse_olmoe, olmoe.MoEForCausalLM),
    ModelFamily("Olmo2ForCausalLM", olmo2.parse_olmo2, olmo2.Olmo2ForCausalLM),
    ModelFamily("Olmo3ForCausalLM", olmo2.parse_olmo3, olmo2.Olmo2ForCausalLM),
    ModelFamily("Gemma2ForCausalLM", gemma2.parse_gemma2, gemma2.Gemma2ForCausalLM),
    ModelFamily("Gemma3ForCausalLM", gemma3.parse_gemma3, gemma3.Gemma3ForCausalLM),
    ModelFamily("Gemma4ForCausalLM", gemma4_config.parse_gemma4, gemma4.Gemma4ForCausalLM),
    ModelFamily("Gemma4ForConditionalGeneration", gemma4_config.parse_gemma4_multimodal,
                gemma4.Gemma4ForCausalLM),  # its text model
    ModelFamily("Llama4ForCausalLM", llama4.parse_llama4, llama4.Llama4ForCausalLM),
    ModelFamily("Llama4ForConditionalGeneration", llama4.parse_llama4_multimodal, llama4.Llama4ForCausalLM),  # text
    # a vision tower and projector beside the text model (multimodal/): images as input embeddings
    ModelFamily("LlavaForConditionalGeneration", vision_language.parse_llava_model, llama_family.LlamaForCausalLM),
    ModelFamily("Mistral3ForConditionalGeneration", vision_language.parse_mistral3_model,
                llama_family.LlamaForCausalLM),
    ModelFamily("Idefics3ForConditionalGeneration", vision_language.parse_idefics3_model,
                llama_family.LlamaForCausalLM),
    ModelFamily("Qwen2VLForConditionalGeneration", vision_language.qwen_vl_parser("Qwen2VLForConditionalGeneration"),
                llama_family.LlamaForCausalLM),
    ModelFamily("Qwen2_5_VLForConditionalGeneration",
                vision_language.qwen_vl_parser("Qwen2_5_VLForConditionalGeneration"), llama_family.LlamaForCausalLM),
    ModelFamily("GptOssForCausalLM", gpt_oss.parse_gpt_oss, gpt_oss.GptOssForCausalLM),
    ModelFamily("DeepseekV2ForCausalLM", deepseek.parse_deepseek_v2, deepseek.DeepseekForCausalLM),
    ModelFamily("DeepseekV3ForCausalLM", deepseek.parse_deepseek_v3, deepseek.DeepseekForCausalLM),
    ModelFamily("Glm4MoeForCausalLM", glm4_moe.parse_glm4_moe, glm4_moe.MoEForCausalLM),
    # hybrid: Gated DeltaNet layers with a recurrent state (mem/state_pool.py) beside gated full attention
    ModelFamily("Qwen3NextForCausalLM", qwen3_next.parse_qwen3_next, qwen3_next.HybridForCausalLM),
    ModelFamily("Qwen3_5ForCausalLM", qwen3_next.parse_qwen3_5, qwen3_next.HybridForCausalLM),
    ModelFamily("Qwen3_5ForConditionalGeneration", qwen3_next.refuse_conditional_generation,
                qwen3_next.HybridForCausalLM),
    # hybrid: Mamba2 layers with a recurrent state beside softmax attention (Granite 4.0-H, Nemotron-H)
    ModelFamily("GraniteMoeHybridForCausalLM", granite_hybrid.parse_granite_hybrid,
                granite_hybrid.GraniteMoeHybridForCausalLM),
    ModelFamily("NemotronHForCausalLM", nemotron_h.parse_nemotron_h, nemotron_h.NemotronHForCausalLM),
    # the multi-token-prediction layer after the decoder, run alone: --speculative-algorithm NEXTN's draft
    ModelFamily("DeepseekV3ForCausalLMNextN", nextn.nextn_parse(deepseek.parse_deepseek_v3,
                                                                "DeepseekV3ForCausalLMNextN"), nextn.DeepseekNextN),
    ModelFamily("Glm4MoeForCausalLMNextN", nextn.nextn_parse(glm4_moe.parse_glm4_moe, "Glm4MoeForCausalLMNextN"),
                nextn.Glm4MoeNextN),
    ModelFamily("Qwen3NextForCausalLMMTP", nextn.mtp_parse(qwen3_next.parse_qwen3_next, "Qwen3NextForCausalLMMTP"),
                nextn.HybridMTP),
    ModelFamily("Qwen3_5ForCausalLMMTP", nextn.mtp_parse(qwen3_next.parse_qwen3_5, "Qwen3_5ForCausalLMMTP"),
                nextn.HybridMTP),
    # bare decoders (no LM head: what sentence-transformers saves for embedding models; --is-embedding)
    ModelFamily("LlamaModel", llama_family.parse_llama, llama_family.LlamaForCausalLM),
    ModelFamily("MistralModel", llama_family.parse_mistral, llama_family.LlamaForCausalLM),
    ModelFamily("Qwen2Model", llama_family.parse_qwen2, llama_family.LlamaForCausalLM),
    ModelFamily("Qwen3Model", llama_family.parse_qwen3, llama_family.LlamaForCausalLM),
    ModelFamily("SmolLM3Model", llama_family.parse_smollm3, llama_family.LlamaForCausalLM),
    # sequence classifiers: the decoder plus its score head on the last token (pooling models: /classify)
    ModelFamily("LlamaForSequenceClassification", sequence_classifier.parse_llama_classifier,
                sequence_classifier.SequenceClassifier),
    ModelFamily("Qwen2ForSequenceClassification", sequence_classifier.parse_qwen2_classifier,
                sequence_classifier.SequenceClassifier),
    ModelFamily("Qwen3ForSequenceClassification", sequence_classifier.parse_qwen3_classifier,
                sequence_classifier.SequenceClassifier),
    ModelFamily("MistralForSequenceClassification", sequence_classifier.parse_mistral_classifier,
                sequence_classifier.SequenceClassifier),
    ModelFamily("Gemma2ForSequenceClassification", sequence_classifier.parse_gemma2_classifier,
                sequence_classifier.Gemma2SequenceClassifier),
    ModelFamily("Gemma3TextForSequenceClassification", sequence_classifier.parse_gemma3_classifier,
                sequence_classifier.Gemma3SequenceClassifier),
)
REGISTRY: dict[str, ModelFamily] = {f.architecture: f for f in _FAMILIES}
SUPPORTED_ARCHS = tuple(REGISTRY)
# any decoder transformers can load, on its modeling code with attention in the paged KV pool
TRANSFORMERS = ModelFamily("transformers", transformers_fallback.parse_transformers,
                           transformers_fallback.TransformersForCausalLM)
MODEL_IMPLS = ("auto", "native", "transformers")


def family_for(architecture: str, model_impl: str = "native") -> ModelFamily:
    """native: the registry's file (or ValueError); transformers: TRANSFORMERS; auto: native where there is one."""
    if model_impl not in MODEL_IMPLS:
        raise ValueError(f"model_impl {model_impl!r}: choose one of {', '.join(MODEL_IMPLS)}")
    family = REGISTRY.get(architecture)
    if model_impl == "transformers" or (family is None and model_impl == "auto"):
        return TRANSFORMERS
    if family is None:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {', '.join(SUPPORTED_ARCHS)} "
                         "(others: --model-impl transformers)")
    return family
