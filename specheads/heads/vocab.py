"""A draft vocabulary: a draft head that predicts only the most frequent target tokens, and the maps between them.

``d2t[i]`` is the offset from draft id i to its target id (``target = i + d2t[i]``, EAGLE-3's and the engines'
convention) and ``t2d`` marks the target ids in the draft vocabulary. Any head with a reduced vocabulary uses these.
"""

from __future__ import annotations

import torch


def draft_maps(target_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t, t2d)`` of the draft vocabulary whose target ids are ``target_ids`` (any order; checked)."""
    ids = torch.as_tensor(target_ids, dtype=torch.long).flatten().cpu()
    check_draft_map(ids, vocab_size, ids.numel())
    ids = ids.sort().values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(ids.numel()), t2d


def check_draft_map(target_ids: torch.Tensor, vocab_size: int, draft_vocab_size: int) -> None:
    """Every draft id must map to a distinct target id inside the base's vocabulary."""
    if target_ids.numel() != draft_vocab_size:
        raise ValueError(f"maps {target_ids.numel()} draft ids, expected {draft_vocab_size}")
    if target_ids.numel() and (int(target_ids.min()) < 0 or int(target_ids.max()) >= vocab_size):
        raise ValueError(
            f"points outside the base's vocabulary: target ids {int(target_ids.min())}..{int(target_ids.max())}, "
            f"vocabulary size {vocab_size}"
        )
    if target_ids.unique().numel() != target_ids.numel():
        raise ValueError("maps two draft ids to the same target id")


def select_draft_vocab(token_counts: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """The ``draft_vocab_size`` most frequent target ids (ties and unseen tokens by lowest id), sorted by id."""
    counts = torch.as_tensor(token_counts, dtype=torch.float64).flatten()
    vocab = counts.numel()
    if not 1 <= draft_vocab_size <= vocab:
        raise ValueError(f"draft_vocab_size must be in [1, {vocab}], got {draft_vocab_size}")
    # A stable sort by descending count keeps lower ids first among equals, so the choice is deterministic.
    order = torch.sort(-counts, stable=True).indices
    return order[:draft_vocab_size].sort().values


def draft_vocab_size_for_coverage(token_counts: torch.Tensor, coverage: float) -> int:
    """The smallest draft vocabulary whose ids (the most frequent, as :func:`select_draft_vocab` picks them) cover at
    least ``coverage`` of the counted target tokens.

    Raises:
        ValueError: ``coverage`` outside ``(0, 1]``, or no counted tokens.
    """
    counts = torch.as_tensor(token_counts, dtype=torch.float64).flatten()
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    total = float(counts.sum())
    if total <= 0:
        raise ValueError("no target tokens to cover: the training data counts none")
    covered = counts.sort(descending=True).values.cumsum(dim=0)  # [V] tokens covered by the top-k ids, k = 1..V
    # The first k whose top-k ids reach the share (a relative tolerance keeps coverage=1.0 exact in floating point)
    first = int(torch.searchsorted(covered, coverage * total * (1 - 1e-12)))
    return min(first + 1, counts.numel())


def draft_vocab_coverage(token_counts: torch.Tensor, target_ids: torch.Tensor) -> float:
    """The share of the counted target tokens whose id is in ``target_ids`` (a draft vocabulary)."""
    counts = torch.as_tensor(token_counts, dtype=torch.float64).flatten()
    total = float(counts.sum())
    return float(counts[torch.as_tensor(target_ids, dtype=torch.long)].sum()) / total if total > 0 else 0.0
