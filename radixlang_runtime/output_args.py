"""ServerArgs' request-output flags (SGLang's --enable-return-hidden-states), checked at the edge: settings it
would not be honoured with are refused by name (ValueError). Torch-free; the model's own limit (a family whose
forward gives its final hidden states) is checked once the model is loaded (model/executor/runner.py)."""

from __future__ import annotations

from typing import Any


def check_output_args(args: Any) -> None:
    if not args.enable_return_hidden_states:
        return
    for name, on in (("speculative_algorithm", bool(args.speculative_algorithm)),
                     ("disaggregation_mode prefill / decode", args.disaggregation_mode != "null"),
                     ("is_embedding", args.is_embedding)):
        if on:
            raise ValueError(f"enable_return_hidden_states with {name} is not implemented")
