"""A draft vocabulary chosen by coverage: the smallest set of the most frequent ids covering a share of the targets."""

from __future__ import annotations

import pytest
import torch

from specheads.heads.vocab import draft_vocab_coverage, draft_vocab_size_for_coverage, select_draft_vocab

# 6 ids seen 40, 30, 15, 10, 5, 0 times (100 targets): the top-k ids cover 40%, 70%, 85%, 95%, 100%, 100%.
COUNTS = torch.tensor([10, 40, 0, 30, 5, 15])


@pytest.mark.parametrize(
    ("coverage", "size"),
    [(0.4, 1), (0.41, 2), (0.7, 2), (0.70001, 3), (0.85, 3), (0.9, 4), (0.95, 4), (0.96, 5), (1.0, 5), (0.01, 1)],
)
def test_the_size_is_the_smallest_that_covers_the_share(coverage: float, size: int) -> None:
    assert draft_vocab_size_for_coverage(COUNTS, coverage) == size
    chosen = select_draft_vocab(COUNTS, size)
    assert draft_vocab_coverage(COUNTS, chosen) >= coverage
    if size > 1:  # one id fewer falls short
        assert draft_vocab_coverage(COUNTS, select_draft_vocab(COUNTS, size - 1)) < coverage


def test_coverage_of_the_chosen_ids_by_hand() -> None:
    assert draft_vocab_coverage(COUNTS, select_draft_vocab(COUNTS, 3)) == pytest.approx(0.85)
    assert sorted(select_draft_vocab(COUNTS, 3).tolist()) == [1, 3, 5]
    assert draft_vocab_coverage(COUNTS, torch.tensor([0, 4])) == pytest.approx(0.15)


def test_a_share_reached_exactly_is_not_lost_to_rounding() -> None:
    assert 0.07 * 100 > 7  # 7.000000000000001 in floating point
    assert draft_vocab_size_for_coverage(torch.ones(100), 0.07) == 7


@pytest.mark.parametrize("coverage", [0.0, -0.1, 1.01])
def test_a_coverage_outside_the_unit_interval_is_refused(coverage: float) -> None:
    with pytest.raises(ValueError, match="coverage must be in"):
        draft_vocab_size_for_coverage(COUNTS, coverage)


def test_no_targets_cannot_be_covered() -> None:
    with pytest.raises(ValueError, match="no target tokens"):
        draft_vocab_size_for_coverage(torch.zeros(5), 0.5)
