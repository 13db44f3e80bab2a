"""The base's features waiting for a drafter that reads them (EAGLE's pairs; block drafters' context).

After every base forward the tokens that entered the base's cache bring their hidden states
(``DecodeState.hidden_states``, ragged per row); a feature drafter fuses them and queues them here until its next
proposal feeds them to its own cache. Rows are ragged: row i holds ``counts[i]`` features, the rest is padding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specheads.inference import kv_cache


@dataclass
class FeatureQueue:
    """Fused base features not yet fed to the drafter, per row of the batch.

    Attributes:
        features: ``[A, M, H]``, or None when nothing is queued.
        counts: per row, how many of ``features`` are real.
    """

    features: torch.Tensor | None = None
    counts: list[int] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.features is None or max(self.counts, default=0) == 0

    def push(self, fused: torch.Tensor, counts: list[int]) -> None:
        """Queue ``fused`` (``[A, M, H]``, row i's first ``counts[i]`` real) after what each row already holds."""
        if self.features is None:
            self.features, self.counts = fused, list(counts)
            return
        total = [a + b for a, b in zip(self.counts, counts, strict=True)]
        merged = fused.new_zeros(fused.shape[0], max(total), fused.shape[2])
        for i, (a, b) in enumerate(zip(self.counts, counts, strict=True)):  # rare: a proposal skipped its feed
            merged[i, :a] = self.features[i, :a]
            merged[i, a : a + b] = fused[i, :b]
        self.features, self.counts = merged, total

    def take(self) -> tuple[torch.Tensor, list[int]]:
        """Everything queued (``[A, W, H]`` with W the longest row, and the counts); the queue is empty afterwards."""
        if self.features is None:
            raise RuntimeError("the feature queue is empty")
        features, counts = self.features[:, : max(self.counts)], self.counts
        self.features, self.counts = None, []
        return features, counts

    def keep_rows(self, keep: list[int]) -> None:
        """Rows left the batch: keep those of ``keep`` (indices into the previous rows)."""
        if self.features is not None:
            self.features = self.features[kv_cache.to_device(keep, self.features.device)]
            self.counts = [self.counts[i] for i in keep]
