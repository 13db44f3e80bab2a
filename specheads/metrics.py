"""The numbers specheads reports, defined once for inference, benchmarks and training alike.

* step: one base-model verification forward after the prefill.
* tau (mean accepted length): new tokens / steps. It includes the token the base adds after the accepted drafts, so
  plain decoding has tau = 1 and a chain of K drafts gives tau in [1, K + 1].
* acceptance rate at depth d: drafts accepted at depth d / steps that drafted depth d.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def mean_accepted_length(new_tokens: int, steps: int) -> float:
    """tau = new tokens / verification steps (0.0 before the first step)."""
    return new_tokens / steps if steps else 0.0


def acceptance_rate_by_position(accepted_drafts: Sequence[int], drafted_depths: Sequence[int]) -> list[float]:
    """Per-depth acceptance rates.

    Args:
        accepted_drafts: per step, how many drafted tokens were accepted (the base's own token excluded).
        drafted_depths: per step, the depth of the deepest drafted node.

    Returns:
        ``rates[d - 1]`` = steps that accepted a draft at depth d / steps that drafted depth d, for d = 1..max depth.
    """
    max_depth = max(drafted_depths, default=0)
    rates = []
    for depth in range(1, max_depth + 1):
        drafted = sum(1 for d in drafted_depths if d >= depth)
        accepted = sum(1 for a, d in zip(accepted_drafts, drafted_depths, strict=True) if d >= depth and a >= depth)
        rates.append(accepted / drafted if drafted else 0.0)
    return rates


@dataclass
class SpecStats:
    """Statistics of one generation (or of several, merged with :meth:`merge`).

    Attributes:
        steps: verification forwards after the prefill.
        new_tokens: tokens emitted.
        accepted_lengths: tokens emitted per step (accepted drafts + the base's token, cut at EOS/max_new_tokens).
        accepted_drafts: drafted tokens accepted per step, before any cut.
        drafted_depths: depth of the deepest drafted node per step (0 when nothing was drafted).
        draft_time_s: time spent drafting: proposing, and the drafter taking each commit in (its ``accepted`` hook,
            e.g. an EAGLE head fusing the base's new features).
        verify_time_s: time spent in verification forwards, acceptance and cache commits (the rest of each step:
            the two add up to the steps' wall time, the prefill not included).
        wall_time_s: total time of the generation, prefill included.
    """

    steps: int = 0
    new_tokens: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    accepted_drafts: list[int] = field(default_factory=list)
    drafted_depths: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    wall_time_s: float = 0.0

    def record_step(self, emitted: int, accepted: int, drafted_depth: int) -> None:
        self.steps += 1
        self.new_tokens += emitted
        self.accepted_lengths.append(emitted)
        self.accepted_drafts.append(accepted)
        self.drafted_depths.append(drafted_depth)

    @property
    def mean_accepted_length(self) -> float:
        return mean_accepted_length(self.new_tokens, self.steps)

    @property
    def acceptance_rate_by_position(self) -> list[float]:
        return acceptance_rate_by_position(self.accepted_drafts, self.drafted_depths)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def merge(self, other: SpecStats) -> SpecStats:
        """Statistics of two generations taken together."""
        return SpecStats(
            steps=self.steps + other.steps,
            new_tokens=self.new_tokens + other.new_tokens,
            accepted_lengths=self.accepted_lengths + other.accepted_lengths,
            accepted_drafts=self.accepted_drafts + other.accepted_drafts,
            drafted_depths=self.drafted_depths + other.drafted_depths,
            draft_time_s=self.draft_time_s + other.draft_time_s,
            verify_time_s=self.verify_time_s + other.verify_time_s,
            wall_time_s=self.wall_time_s + other.wall_time_s,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "new_tokens": self.new_tokens,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_rate_by_position": self.acceptance_rate_by_position,
            "accepted_lengths": self.accepted_lengths,
            "draft_time_s": self.draft_time_s,
            "verify_time_s": self.verify_time_s,
            "wall_time_s": self.wall_time_s,
            "tokens_per_s": self.tokens_per_s,
        }

    def __repr__(self) -> str:
        """A short form; the per-step lists are in the fields and in :meth:`to_dict`."""
        return (
            f"SpecStats(new_tokens={self.new_tokens}, steps={self.steps}, "
            f"mean_accepted_length={self.mean_accepted_length:.2f}, tokens_per_s={self.tokens_per_s:.1f})"
        )

    def summary(self) -> str:
        rates = ", ".join(f"{r:.2f}" for r in self.acceptance_rate_by_position) or "-"
        return (
            f"tokens {self.new_tokens} | steps {self.steps} | tau {self.mean_accepted_length:.2f} | "
            f"{self.tokens_per_s:.1f} tok/s | acceptance by depth [{rates}] | "
            f"draft {self.draft_time_s:.2f}s verify {self.verify_time_s:.2f}s wall {self.wall_time_s:.2f}s"
        )
