"""What a request may ask for, checked before it reaches the scheduler (torch-free).

The in-process Engine and the server's TokenizerManager run the same checks, so a bad request gets
the same ValueError (HTTP 400) on both paths instead of reaching the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlang_runtime.sampling_params import SamplingParams


@dataclass(frozen=True)
class RuntimeLimits:
    context_len: int
    vocab_size: int
    num_slots: int  # KV pool size in tokens
    grammar: bool = True  # constrained decoding available (--grammar-backend outlines)


def check_request(ids: list[int], sp: SamplingParams, limits: RuntimeLimits) -> None:
    if not ids:
        raise ValueError("the prompt is empty (no tokens)")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < limits.vocab_size for t in ids):
        raise ValueError(f"input_ids must be integers in [0, {limits.vocab_size})")
    sp.check_vocab(limits.vocab_size)
    if sp.constrained and not limits.grammar:
        raise ValueError("regex / json_schema need a grammar backend: the server runs with --grammar-backend none")
    if len(ids) + sp.max_new_tokens > limits.context_len:
        raise ValueError(
            f"prompt ({len(ids)} tokens) + max_new_tokens ({sp.max_new_tokens}) exceeds the context length "
            f"{limits.context_len}"
        )
    if len(ids) + sp.max_new_tokens > limits.num_slots:
        raise ValueError(
            f"prompt + max_new_tokens ({len(ids) + sp.max_new_tokens}) exceeds the KV pool "
            f"({limits.num_slots} tokens); raise --max-total-tokens"
        )
