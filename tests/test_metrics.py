"""The numbers of API section 4, checked on hand-computed examples."""

from __future__ import annotations

import pytest

from specheads.metrics import SpecStats, acceptance_rate_by_position, mean_accepted_length

API_STATS_FIELDS = {
    "steps",
    "new_tokens",
    "accepted_lengths",
    "mean_accepted_length",
    "acceptance_rate_by_position",
    "draft_time_s",
    "verify_time_s",
    "wall_time_s",
    "tokens_per_s",
}


def _stats() -> SpecStats:
    """Three steps of a chain of 3 drafts that accept 3, 0 and 1 drafts (tau = (4 + 1 + 2) / 3)."""
    stats = SpecStats()
    stats.record_step(emitted=4, accepted=3, drafted_depth=3)
    stats.record_step(emitted=1, accepted=0, drafted_depth=3)
    stats.record_step(emitted=2, accepted=1, drafted_depth=3)
    return stats


def test_mean_accepted_length_is_new_tokens_over_steps() -> None:
    assert mean_accepted_length(7, 3) == pytest.approx(7 / 3)
    assert mean_accepted_length(10, 10) == 1.0
    assert mean_accepted_length(0, 0) == 0.0
    stats = _stats()
    assert stats.steps == 3
    assert stats.new_tokens == 7
    assert stats.accepted_lengths == [4, 1, 2]
    assert stats.mean_accepted_length == pytest.approx(7 / 3)


def test_acceptance_rate_by_position_hand_computed() -> None:
    # Steps drafted to depths 3, 3, 2, 1, 0 and accepted 3, 1, 2, 0, 0 drafts.
    # depth 1: drafted by 4 steps, accepted by 3 -> 0.75
    # depth 2: drafted by 3 steps, accepted by 2 -> 2/3
    # depth 3: drafted by 2 steps, accepted by 1 -> 0.5
    rates = acceptance_rate_by_position([3, 1, 2, 0, 0], [3, 3, 2, 1, 0])
    assert rates == pytest.approx([0.75, 2 / 3, 0.5])
    assert acceptance_rate_by_position([], []) == []
    assert acceptance_rate_by_position([0, 0], [0, 0]) == []
    assert _stats().acceptance_rate_by_position == pytest.approx([2 / 3, 1 / 3, 1 / 3])


def test_merge_adds_both_generations() -> None:
    first = _stats()
    first.draft_time_s, first.verify_time_s, first.wall_time_s = 0.5, 1.0, 2.0
    second = SpecStats()
    second.record_step(emitted=3, accepted=2, drafted_depth=2)
    second.draft_time_s, second.verify_time_s, second.wall_time_s = 0.25, 0.5, 1.5

    merged = first.merge(second)

    assert merged.steps == 4
    assert merged.new_tokens == 10
    assert merged.accepted_lengths == [4, 1, 2, 3]
    assert merged.mean_accepted_length == pytest.approx(10 / 4)
    # depth 1: 4 drafted, 3 accepted; depth 2: 4 drafted, 2 accepted; depth 3: 3 drafted, 1 accepted
    assert merged.acceptance_rate_by_position == pytest.approx([0.75, 0.5, 1 / 3])
    assert merged.draft_time_s == pytest.approx(0.75)
    assert merged.verify_time_s == pytest.approx(1.5)
    assert merged.wall_time_s == pytest.approx(3.5)
    assert merged.tokens_per_s == pytest.approx(10 / 3.5)
    assert first.steps == 3 and second.steps == 1  # the inputs are left alone


def test_to_dict_has_exactly_the_api_fields() -> None:
    stats = _stats()
    stats.wall_time_s = 2.0
    data = stats.to_dict()
    assert set(data) == API_STATS_FIELDS
    assert data["accepted_lengths"] == [4, 1, 2]
    assert data["mean_accepted_length"] == pytest.approx(7 / 3)
    assert data["tokens_per_s"] == pytest.approx(3.5)


def test_tokens_per_s_without_time_is_zero() -> None:
    assert _stats().tokens_per_s == 0.0
    assert SpecStats().mean_accepted_length == 0.0
