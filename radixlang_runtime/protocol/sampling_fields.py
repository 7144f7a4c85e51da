"""The names of a request's `sampling_params` fields: what the one intake (SamplingParams.from_dict) parses,
and so exactly what a client may send. No imports: the DSL (radixlang/ir.py) builds its wire dict from this
list, so the two cannot drift (tests/protocol/test_generate_intake.py checks it against SamplingParams' fields)."""

REQUEST_FIELDS: frozenset[str] = frozenset({
    "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "stop", "stop_token_ids", "stop_regex", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "n", "regex", "json_schema", "ebnf",
    "structural_tag", "sampling_seed", "logit_bias", "allowed_token_ids", "bad_words", "thinking_token_budget",
    "infill",
})
