"""EAGLE's held-out agreement by depth and rank, checked number by number on a case small enough to count by hand.

These numbers choose trees (``simulated_tau``, ``specheads calibrate``), so a wrong number of the right shape must
fail here: a base and a draft whose every choice the test sets, and the expected counts worked out in comments.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specheads.methods.eagle.train import eagle_agreement
from specheads.training.evaluate import simulated_tau

VOCAB = 8


class CountingBase(torch.nn.Module):
    """A base whose greedy token after token x is always x + 1 (mod 8); its only hidden state, the final one, is the
    token's one-hot vector, which its lm_head (a permutation) maps to the next token's, as a real base's logits are
    its lm_head over its final hidden state."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = torch.nn.Linear(VOCAB, VOCAB, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(torch.eye(VOCAB).roll(1, dims=0))  # row x + 1 reads column x

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False, **kwargs) -> SimpleNamespace:
        hidden = torch.nn.functional.one_hot(input_ids, VOCAB).float()  # [B, T, V]
        return SimpleNamespace(logits=self.lm_head(hidden), hidden_states=(hidden,))


class ScriptedDraft(torch.nn.Module):
    """A draft whose ranked candidates are a table: ``table[step][row][t] = (first, second)`` target ids, every other
    id after them in increasing order. Its draft ids are its target ids shifted by 3 (mod 8), so that an agreement
    that compared draft ids with the base's tokens would count other hits."""

    hidden_state_layers = (0,)

    def __init__(self, table: list[list[list[tuple[int, int]]]]) -> None:
        super().__init__()
        self.config = SimpleNamespace(draft_vocab_size=VOCAB)
        self.table = table

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return (draft_ids + 3) % VOCAB

    def forward(self, input_ids, features, attention_mask=None, steps=1, readout=None):
        tops = []
        for step in range(steps):
            scores = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1, VOCAB)  # [B, T - 1, Vd]
            for row, choices in enumerate(self.table[step]):
                for t, (first, second) in enumerate(choices):
                    target_scores = torch.arange(VOCAB, 0, -1).float()  # later ids rank lower
                    target_scores[first], target_scores[second] = 2 * VOCAB, 2 * VOCAB - 1
                    scores[row, t] = target_scores[(torch.arange(VOCAB) + 3) % VOCAB]  # indexed by draft id
            tops.append(readout(step, scores, torch.eye(VOCAB), None))  # F.linear(scores, eye) == scores
        return None, tops


# Row 0: every token is a target. The base's greedy tokens g = ids + 1 = [1, 2, 3, 4, 6, 7, 0, 1]; token j is the
# base's own where ids[j] == g[j - 1]: all but j = 4 (5, where the base wanted 4).
# Row 1: a 3-token prompt (no targets at 0-2) and two padding tokens; g = [5, 6, 7, 0, 1, 3, 1, 1]; token j is the
# base's own for j = 1-4, not for j = 5 (2, where the base wanted 1).
ROWS = [[0, 1, 2, 3, 5, 6, 7, 0], [4, 5, 6, 7, 0, 2, 0, 0]]
ATTENTION = [[1] * 8, [1, 1, 1, 1, 1, 1, 0, 0]]
LOSS = [[1] * 8, [0, 0, 0, 1, 1, 1, 0, 0]]

# Depth d + 1 (step d) at position t is scored against g[t + 1 + d], the base's token at t + 2 + d, where that token
# is a target and tokens t + 2 .. t + 1 + d are the base's own (the draft followed the base's path there).
#   row 0, depth 1: t = 0-5, wanted [2, 3, 4, 6, 7, 0], all counted (6)
#          depth 2: t = 0-4, wanted [3, 4, 6, 7, 0], t = 2 off the path (token 4): counted t = 0, 1, 3, 4 (4)
#          depth 3: t = 0-3, wanted [4, 6, 7, 0], t = 1, 2 off the path: counted t = 0, 3 (2)
#   row 1, depth 1: t = 0-5, wanted [6, 7, 0, 1, 3, 1], targets at tokens 3-5: counted t = 1, 2, 3 (3)
#          depth 2: t = 0-4, wanted [7, 0, 1, 3, 1], targets: t = 0, 1, 2, all on the path (3)
#          depth 3: t = 0-3, wanted [0, 1, 3, 1], targets: t = 0, 1, both on the path (2)
# The draft's (first, second) candidates; "rank r" is where the wanted token stands, (x) an uncounted position.
TABLE = [
    [  # depth 1
        # row 0: rank 0, rank 0, rank 1, rank 0, rank 7 (7 after 2-6), rank 1
        [(2, 5), (3, 0), (1, 4), (6, 1), (0, 1), (5, 0)],
        # row 1: (x), rank 0, rank 1, rank 1 (the first is the data's 2, not the base's 1), (x), (x)
        [(6, 0), (7, 3), (5, 0), (2, 1), (3, 0), (1, 0)],
    ],
    [  # depth 2
        # row 0: rank 0, rank 1, (x: would be rank 0), rank 0, rank 2 (0 after 1, 2)
        [(3, 2), (2, 4), (6, 0), (7, 6), (1, 2)],
        # row 1: rank 0, rank 0, rank 3 (1 after 4, 5, 0), (x), (x)
        [(7, 1), (0, 2), (4, 5), (3, 0), (1, 0)],
    ],
    [  # depth 3
        # row 0: rank 0, (x: would be rank 0), (x: would be rank 0), rank 1
        [(4, 0), (6, 7), (7, 0), (2, 0)],
        # row 1: rank 0, rank 1, (x), (x)
        [(0, 4), (3, 1), (3, 0), (1, 0)],
    ],
]


def _agreement() -> dict:
    batch = {
        "input_ids": torch.tensor(ROWS),
        "attention_mask": torch.tensor(ATTENTION),
        "loss_mask": torch.tensor(LOSS),
    }
    return eagle_agreement(CountingBase(), ScriptedDraft(TABLE), [batch], depth=3)


def test_agreement_by_depth_and_rank_counts_the_positions_the_draft_reached_on_the_bases_path() -> None:
    result = _agreement()
    assert result["positions"] == [6 + 3, 4 + 3, 2 + 2]
    # depth 1: rank 0 at 3 + 1 positions, rank 1 at 2 + 2, rank 7 at 1
    # depth 2: rank 0 at 2 + 2, rank 1 at 1, rank 2 at 1, rank 3 at 1
    # depth 3: rank 0 at 1 + 1, rank 1 at 1 + 1
    expected = [
        [4 / 9, 4 / 9, 0, 0, 0, 0, 0, 1 / 9],
        [4 / 7, 1 / 7, 1 / 7, 1 / 7, 0, 0, 0, 0],
        [2 / 4, 2 / 4, 0, 0, 0, 0, 0, 0],
    ]
    for depth, (row, wanted) in enumerate(zip(result["agreement_by_rank"], expected, strict=True)):
        assert row == pytest.approx(wanted), f"depth {depth + 1}"
    assert result["agreement_with_base_greedy"] == pytest.approx([4 / 9, 4 / 7, 2 / 4])
    assert result["top5_agreement"] == pytest.approx([8 / 9, 7 / 7, 4 / 4])
    # the draft's first candidate against the data's token: depth 1: row 0 at t = 0, 1, 3; row 1 at t = 1, 3
    # (where the base disagrees with the data); depth 2: t = 0, 3 and t = 0, 1; depth 3: row 1's t = 0 only
    assert result["accuracy_vs_data"] == pytest.approx([5 / 9, 4 / 7, 1 / 4])


def test_simulated_tau_of_the_measured_agreement_by_hand() -> None:
    """The trainer's tau estimate from the numbers above: a chain multiplies rank-0 agreement down the depths; a
    tree of N nodes adds the N most probable paths (ties in any order give the same sum here)."""
    tau = simulated_tau(_agreement()["agreement_by_rank"], chain=3, trees=(2, 3))
    assert tau["chain-3"] == pytest.approx(1 + 4 / 9 + 4 / 9 * 4 / 7 + 4 / 9 * 4 / 7 * 2 / 4)
    assert tau["tree-2"] == pytest.approx(1 + 4 / 9 + 4 / 9)  # ranks 0 and 1 at depth 1
    assert tau["tree-3"] == pytest.approx(1 + 4 / 9 + 4 / 9 + 4 / 9 * 4 / 7)  # then (0, 0) or (1, 0): 16/63 each
