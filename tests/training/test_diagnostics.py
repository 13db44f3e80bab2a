"""Where agreement is lost (specheads.training.diagnostics), by hand: the n-gram rule, the positions scored at each
depth, the groups they fall into, the base's confidence, and the paired bootstrap between two heads."""

from __future__ import annotations

import pytest
import torch

from specheads.training.diagnostics import (
    StratifiedAgreement,
    confidence_bin,
    ngram_continuations,
    paired_bootstrap,
    scored_positions,
)


# ---------------------------------------------------------------------------------------------------- the n-gram rule
def test_the_longest_suffix_seen_before_predicts_what_followed_it() -> None:
    #      0  1  2  3  4  5  6  7  8  9 10 11 12 13 14
    ids = [1, 2, 3, 4, 5, 8, 2, 3, 4, 6, 1, 2, 3, 4, 0]
    predicted = ngram_continuations(ids)
    # 9: [2, 3, 4] was at 1..3, then 5. 13: [1, 2, 3] was at 0..2, then 4. 14: the 4-gram [1, 2, 3, 4] (at 0..3, then
    # 5) wins over the 3-gram [2, 3, 4] whose latest occurrence (6..8) was followed by 6.
    assert predicted == [-1] * 9 + [5, -1, -1, -1, 4, 5]
    assert ngram_continuations(ids, max_n=3)[14] == 6  # 3-grams only: the latest occurrence's continuation


def test_only_the_answer_is_history() -> None:
    ids = [5, 6, 7, 8, 5, 6, 7, 9]
    assert ngram_continuations(ids) == [-1] * 7 + [8]
    assert ngram_continuations(ids, start=4) == [-1] * 8  # the first [5, 6, 7] is prompt, not answer
    assert ngram_continuations(ids, start=1) == [-1] * 8  # the suffix must lie in the answer too


# ---------------------------------------------------------------------------------------------------- scored positions
# One row of 9 tokens whose answer starts at 1 and loops; the base follows the data except at 7 (it says 9 there).
IDS = torch.tensor([[0, 3, 4, 5, 3, 4, 5, 3, 4]])
VALID = torch.tensor([[False] + [True] * 8])
GREEDY = torch.tensor([[3, 4, 5, 3, 4, 5, 9, 4, 5]])  # the base's token after each position: the data's, but at 7
P_TOP1 = torch.tensor([[0.5, 0.95, 0.2, 0.6, 0.3, 0.5, 0.1, 0.99, 0.4]])
# depth 1 predicts token t + 2: right at t = 0, 2, 6 (targets 2, 4, 8); depth 2 token t + 3: right at t = 0, 1, 4
DRAFTED = [torch.tensor([[4, 0, 3, 0, 0, 0, 4, 0]]), torch.tensor([[5, 3, 0, 0, 9, 0, 0, 0]])]
T2D = torch.tensor([False, False, False, True, True, False, False, False, False, True])  # ids 3, 4, 9


def test_each_depth_scores_the_positions_on_the_base_path() -> None:
    depth1, depth2 = scored_positions(IDS, VALID, GREEDY, DRAFTED)
    assert depth1.target.tolist() == [2, 3, 4, 5, 6, 7, 8]
    assert depth1.wanted.tolist() == [4, 5, 3, 4, 5, 9, 4]
    assert depth1.hit.tolist() == [True, False, True, False, False, False, True]
    # depth 2 at t is scored only where the data's token t + 2 is the base's: not at t = 5 (token 7 is 3, not 9)
    assert depth2.target.tolist() == [3, 4, 5, 6, 7]
    assert depth2.wanted.tolist() == [5, 3, 4, 5, 9]
    assert depth2.hit.tolist() == [True, True, False, False, True]
    assert depth1.row.tolist() == [0] * 7


def test_positions_fall_into_their_groups() -> None:
    strata = StratifiedAgreement(depth=2)
    strata.add(IDS, VALID, P_TOP1, scored_positions(IDS, VALID, GREEDY, DRAFTED), T2D)
    summary = strata.summary()
    first, second = ({name: (g["agreement"], g["positions"]) for name, g in d.items()} for d in summary["depths"])
    assert first["all"] == (pytest.approx(3 / 7), 7)
    assert first["copy"] == (1.0, 1)  # target 8: [4, 5, 3] followed by 4 before, and the base says 4
    assert first["novel"] == (pytest.approx(2 / 6), 6)  # target 7: the rule says 3, the base 9
    assert first["in_vocab"] == (pytest.approx(3 / 5), 5)
    assert first["off_vocab"] == (0.0, 2)  # the base's 5 (targets 3 and 6) is not in the draft vocabulary
    # the base's probability of its own token at target j is P_TOP1[j - 1]: 0.95 .2 .6 .3 .5 .1 .99
    assert first["p1 [0.9, 1.0)"] == (1.0, 2)
    assert first["p1 [0.0, 0.3)"] == (0.0, 2)
    assert first["p1 [0.5, 0.7)"] == (0.5, 2)
    assert first["p1 [0.3, 0.5)"] == (0.0, 1)
    assert summary["depths"][0]["copy"]["share"] == pytest.approx(1 / 7)
    assert second["all"] == (pytest.approx(3 / 5), 5)
    assert "copy" not in second and second["novel"] == (pytest.approx(3 / 5), 5)
    assert summary["base_top1_above_half"] == pytest.approx(3 / 7)  # 0.95, 0.6, 0.99: one half itself is not above
    assert strata.rows == [[(3, 7), (3, 5)]]
    assert list(summary["depths"][0])[:5] == ["all", "copy", "novel", "in_vocab", "off_vocab"]


def test_an_ngram_of_the_prompt_is_not_a_copy() -> None:
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8]])  # the answer (from 4) repeats the prompt
    valid = torch.tensor([[False] * 4 + [True] * 4])
    greedy = torch.tensor([[6, 7, 8, 5, 6, 7, 8, 1]])  # the base follows the data
    drafted = [torch.zeros(1, 7, dtype=torch.long)]
    strata = StratifiedAgreement(depth=1)
    strata.add(ids, valid, torch.full((1, 8), 0.9), scored_positions(ids, valid, greedy, drafted), None)
    groups = strata.summary()["depths"][0]
    assert groups["all"]["positions"] == 4 and groups["novel"]["positions"] == 4 and "copy" not in groups


def test_without_a_draft_vocabulary_every_token_is_in_it() -> None:
    strata = StratifiedAgreement(depth=1)
    strata.add(IDS, VALID, P_TOP1, scored_positions(IDS, VALID, GREEDY, DRAFTED[:1]), None)
    groups = strata.summary()["depths"][0]
    assert groups["in_vocab"]["positions"] == 7 and "off_vocab" not in groups


@pytest.mark.parametrize(
    ("probability", "name"),
    [(0.0, "p1 [0.0, 0.3)"), (0.3, "p1 [0.3, 0.5)"), (0.4999, "p1 [0.3, 0.5)"), (0.9, "p1 [0.9, 1.0)"),
     (1.0, "p1 [0.9, 1.0)")],
)  # fmt: skip
def test_confidence_bins_are_half_open_but_the_last(probability: float, name: str) -> None:
    assert confidence_bin(probability) == name


# ---------------------------------------------------------------------------------------------------- paired bootstrap
def test_a_constant_difference_per_row_has_no_spread() -> None:
    first = [(1, 4), (2, 4), (0, 4), (3, 4)]
    second = [(2, 4), (3, 4), (1, 4), (4, 4)]  # every row one more hit: +1/4 whatever rows are drawn
    difference, low, high = paired_bootstrap(first, second, rounds=500)
    assert difference == low == high == pytest.approx(0.25)


def test_two_rows_by_hand() -> None:
    # Resampling 2 rows: {0, 0} gives (2 + 2 - 0 - 0) / 4 = 1, {1, 1} gives 0, mixed 0.5, each 1/4 / 1/4 / 1/2.
    difference, low, high = paired_bootstrap([(0, 2), (2, 2)], [(2, 2), (2, 2)], rounds=4000, seed=1)
    assert (difference, low, high) == (0.5, 0.0, 1.0)
    assert paired_bootstrap([(0, 2), (2, 2)], [(2, 2), (2, 2)], rounds=4000, level=0.2, seed=1)[1:] == (0.5, 0.5)


def test_the_interval_is_reproducible_and_holds_the_difference() -> None:
    generator = torch.Generator().manual_seed(0)
    counts = torch.randint(5, 30, (40,), generator=generator)
    first = [(int(torch.randint(0, int(c) + 1, (1,), generator=generator)), int(c)) for c in counts]
    second = [(min(h + int(torch.randint(0, 3, (1,), generator=generator)), c), c) for h, c in first]
    result = paired_bootstrap(first, second, rounds=1000, seed=3)
    assert result == paired_bootstrap(first, second, rounds=1000, seed=3)
    difference, low, high = result
    assert 0 < low < difference < high


def test_heads_scored_on_other_positions_cannot_be_paired() -> None:
    with pytest.raises(ValueError, match="same positions"):
        paired_bootstrap([(1, 4), (2, 4)], [(1, 4), (2, 5)])
    with pytest.raises(ValueError, match="same positions"):
        paired_bootstrap([(1, 4), (2, 4)], [(1, 4)])
    with pytest.raises(ValueError, match="no scored positions"):
        paired_bootstrap([(0, 0)], [(0, 0)])
