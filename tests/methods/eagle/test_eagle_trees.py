"""EAGLE-2's tree family: what calibration records is what the drafter and exporter read back."""

from __future__ import annotations

import pytest

from specheads.heads.calibration import Calibration
from specheads.inference.trees import TreeError, family_of, family_of_kind
from specheads.methods.eagle.trees import TREES, DynamicTree


def test_the_recorded_tree_is_read_back_and_reported() -> None:
    fastest = DynamicTree(top_k=3, depth=5, total_tokens=11)
    record = {"choices": [[0]], **TREES.record(fastest), "draft_ms_per_level": 1.25}
    assert record["dynamic"] == {"top_k": 3, "depth": 5, "total_tokens": 11}  # tree.json's field, unchanged
    assert TREES.calibrated(Calibration.from_record(record)) == fastest
    assert TREES.calibrated(Calibration.from_record({"choices": [[0]]})) is None and TREES.calibrated(None) is None
    assert TREES.summary(record) == [
        "EAGLE-2 dynamic tree for this machine: {'top_k': 3, 'depth': 5, 'total_tokens': 11} (draft level 1.25 ms)"
    ]
    assert TREES.summary({"choices": [[0]]}) == []


def test_names_and_size_keywords_are_the_familys() -> None:
    assert family_of("dynamic") is TREES and family_of("dynamic-2-3-4") is TREES and family_of_kind("dynamic") is TREES
    assert family_of_kind("dynamic-2-3-4") is None  # only a bare kind takes size keywords
    assert TREES.parse("dynamic-2-3-4") == DynamicTree(2, 3, 4) and TREES.parse("ddtree-4") is None
    resized = TREES.override(DynamicTree(4, 4, 8), {TREES.overrides["depth"]: 2, TREES.overrides["tree_top_k"]: 3})
    assert resized == DynamicTree(top_k=3, depth=2, total_tokens=8) and resized.num_nodes == 8
    with pytest.raises(TreeError, match="top_k must be an integer >= 1"):
        TREES.override(DynamicTree(4, 4, 8), {"top_k": 0})
