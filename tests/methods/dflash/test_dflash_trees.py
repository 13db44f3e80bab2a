"""DDTree's tree family: what calibration records is what the drafter reads back."""

from __future__ import annotations

from specheads.heads.calibration import Calibration
from specheads.inference.trees import family_of, family_of_kind
from specheads.methods.dflash.trees import TREES, BlockTree


def test_the_recorded_budget_is_read_back_and_reported() -> None:
    record = {"choices": [[0]], **TREES.record(BlockTree(8)), "draft_ms_per_step": 2.5}
    assert record["budget"] == 8  # tree.json's field, unchanged
    assert TREES.calibrated(Calibration.from_record(record)) == BlockTree(8)
    assert TREES.calibrated(Calibration.from_record({"choices": [[0]]})) is None and TREES.calibrated(None) is None
    assert TREES.summary(record) == [
        "DDTree node budget for this machine (tree='ddtree'): 8 (one block forward 2.50 ms a step)"
    ]
    assert TREES.draft_per_step and [tree.num_nodes for tree in TREES.candidates([], 20)] == [2, 4, 8, 16]


def test_names_and_size_keywords_are_the_familys() -> None:
    assert family_of("ddtree") is TREES and family_of("ddtree-5") is TREES and family_of_kind("ddtree") is TREES
    assert TREES.parse("ddtree-5") == BlockTree(5) and TREES.parse("dynamic-1-1-1") is None
    assert TREES.override(BlockTree(16), {TREES.overrides["total_tokens"]: 3}) == BlockTree(3)
