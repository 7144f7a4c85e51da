"""Speculative decoding: the n-gram and draft-model drafters, draft proposal and acceptance, the online step cost,
acceptance statistics, and the draft model's runner (docs/SPECULATIVE.md)."""
