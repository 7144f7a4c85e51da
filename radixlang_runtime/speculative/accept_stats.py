"""Verified drafts' accept lengths, for every drafter (n-gram and draft model; torch-free): a histogram of
accepted draft tokens per verification, shown in get_stats()["spec_accept_length"], /metrics and the live view."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class AcceptStats:
    """Verified drafts: accepted tokens per verification, as a histogram (SGLang's spec_accept_length is
    accepted + 1: the verified step's own token counts)."""

    verifications: int = 0
    histogram: dict[int, int] = field(default_factory=dict)  # accepted draft tokens -> verifications

    def add(self, accepted: int) -> None:
        self.verifications += 1
        self.histogram[accepted] = self.histogram.get(accepted, 0) + 1

    def mean_accept_length(self) -> float:
        """Tokens per verification step (accepted + the step's own), 0.0 before any."""
        if not self.verifications:
            return 0.0
        return 1.0 + sum(a * n for a, n in self.histogram.items()) / self.verifications

    def to_dict(self) -> dict:
        return {"verifications": self.verifications, "mean_accept_length": self.mean_accept_length(),
                "histogram": {str(a): n for a, n in sorted(self.histogram.items())}}

    @classmethod
    def from_dict(cls, d: dict) -> "AcceptStats":
        return cls(d["verifications"], {int(a): n for a, n in d["histogram"].items()})


def merge_accept_stats(per_replica: list[Optional[dict]]) -> Optional[dict]:
    """Data parallel: the replicas' to_dict() outputs as one (histograms summed; None where none drafts)."""
    parts = [AcceptStats.from_dict(d) for d in per_replica if d is not None]
    if not parts:
        return None
    out = AcceptStats()
    for p in parts:
        out.verifications += p.verifications
        for a, n in p.histogram.items():
            out.histogram[a] = out.histogram.get(a, 0) + n
    return out.to_dict()
