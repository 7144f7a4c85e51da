"""The three ways `select` turns choice logprobs into a decision (SGLang's names and meta_info).

Input to a method, per choice i (PROTOCOL.md entries `[logprob, token_id, text]`):
- `input_token_logprobs[i]`: the entries of the choice's own tokens only (prompt tokens already
  removed by token id in backend/select_scoring.py), each logprob a real number;
- `unconditional_token_logprobs[i]`: the same tokens scored alone (first entry's logprob None → 0).
Invariants: ties go to the first choice; a decision is always one of `choices`.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Dict, List, Optional


@dataclass
class ChoicesDecision:
    decision: str
    meta_info: Optional[Dict[str, Any]] = None


def _values(entries: List[Any]) -> List[float]:
    return [float(e[0]) for e in entries if e[0] is not None]


def _mean(xs: List[float]) -> float:
    return sum(xs) / len(xs) if xs else float("-inf")


def _argmax(xs: List[float]) -> int:
    best = 0
    for i, x in enumerate(xs):
        if x > xs[best]:
            best = i
    return best


def pick(scores: List[float], temperature: float, rng: Optional[random.Random] = None) -> int:
    """argmax (first on ties) at temperature 0; else a draw from softmax(scores / temperature)."""
    if temperature <= 1e-5:
        return _argmax(scores)
    top = max(scores)
    weights = [math.exp((s - top) / temperature) for s in scores]
    return (rng or random).choices(range(len(scores)), weights=weights)[0]


class ChoicesSamplingMethod(ABC):
    @property
    def requires_unconditional_logprobs(self) -> bool:
        return False

    @abstractmethod
    def __call__(self, *, choices: List[str], normalized_prompt_logprobs: List[float],
                 input_token_logprobs: List[List[Any]], output_token_logprobs: List[List[Any]],
                 unconditional_token_logprobs: Optional[List[List[Any]]] = None,
                 temperature: float = 0.0) -> ChoicesDecision: ...


def _base_meta(normalized: List[float], inputs: List[List[Any]], outputs: List[List[Any]]) -> Dict[str, Any]:
    return {"normalized_prompt_logprobs": normalized, "input_token_logprobs": inputs,
            "output_token_logprobs": outputs}


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The highest mean logprob over the choice's tokens."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None, temperature=0.0) -> ChoicesDecision:
        best = pick(normalized_prompt_logprobs, temperature)
        return ChoicesDecision(choices[best], _base_meta(normalized_prompt_logprobs, input_token_logprobs,
                                                         output_token_logprobs))


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Token by token, keep the choices whose logprob at that position is the maximum; a shorter
    choice is padded with its own mean logprob."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None, temperature=0.0) -> ChoicesDecision:
        matrix = self.logprob_matrix(input_token_logprobs)
        width = len(matrix[0]) if matrix else 0
        remaining = list(range(len(choices)))
        for j in range(width):
            top = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == top]
            if len(remaining) == 1:
                break
        meta = _base_meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs)
        meta["greedy_logprob_matrix"] = matrix
        return ChoicesDecision(choices[remaining[0]], meta)

    @staticmethod
    def logprob_matrix(input_token_logprobs: List[List[Any]]) -> List[List[float]]:
        rows = [_values(e) for e in input_token_logprobs]
        width = max((len(r) for r in rows), default=0)
        return [r + [_mean(r)] * (width - len(r)) for r in rows]


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """The highest mean of (conditional - unconditional) logprobs over the choice's tokens."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None, temperature=0.0) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional token logprobs")
        scores = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs):
            c = [float(e[0]) for e in cond]
            u = [0.0 if e[0] is None else float(e[0]) for e in uncond]
            if len(c) != len(u):
                raise ValueError(f"choice scored on {len(c)} tokens but {len(u)} unconditional ones")
            scores.append(_mean([a - b for a, b in zip(c, u)]))
        best = pick(scores, temperature)
        meta = _base_meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs)
        meta["unconditional_token_logprobs"] = unconditional_token_logprobs
        meta["normalized_unconditional_prompt_logprobs"] = scores
        return ChoicesDecision(choices[best], meta)


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()


def normalized_logprob(entries: List[Any]) -> float:
    """Mean logprob of a choice's token entries (token_length_normalized's score)."""
    return _mean(_values(entries))
