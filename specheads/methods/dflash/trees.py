"""DDTree (Ringel et al. 2026, arXiv 2604.12989), the tree family block drafters grow, owned here end to end.

A :class:`BlockTree` is a node budget: the drafter grows the ``total_tokens`` best paths through the per-depth
distributions of one block forward (:func:`specheads.methods.dflash.drafter.ddtree`). Its family (:data:`TREES`,
named by DFlash's registry entry) tells the engine everything else about it: the names ``"ddtree"`` (the drafter's
calibrated budget) and ``"ddtree-N"``, the ``total_tokens`` keyword that resizes it, the budgets calibration times,
the ``"budget"`` field of ``tree.json`` that records the fastest, and how the drafter reads it back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specheads.methods.api_decode import TreeError, TreeFamily

KIND = "ddtree"  # the tree= name
RECORD = "budget"  # the field of the calibration record
_NAME_RE = re.compile(r"^ddtree-(\d+)$")


@dataclass(frozen=True)
class BlockTree:
    """A DDTree (Ringel et al. 2026, arXiv 2604.12989): the ``total_tokens`` best paths through the per-depth
    distributions of one block drafter forward, grown best-first (the drafter's :func:`ddtree` builder).

    Attributes:
        total_tokens: drafted nodes verified (the root not counted).
    """

    total_tokens: int

    def __post_init__(self) -> None:
        value = self.total_tokens
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TreeError(f"a DDTree's node budget (total_tokens) must be an integer >= 1, got {value!r}")

    @property
    def num_nodes(self) -> int:
        """The most nodes a tree of this budget verifies."""
        return self.total_tokens

    @classmethod
    def parse(cls, text: str) -> BlockTree | None:
        """``"ddtree-N"`` (a budget of N nodes), the form the CLI and bench take; else None."""
        match = _NAME_RE.match(text)
        return None if match is None else cls(int(match.group(1)))

    @property
    def name(self) -> str:
        return f"{KIND}-{self.total_tokens}"


class BlockTrees(TreeFamily):
    """DDTree node budgets 2..64 (within ``max_nodes``) over one block forward; recorded as ``budget``."""

    kinds = (KIND,)
    sized_form = "ddtree-N"
    description = "DDTree trees"
    overrides = {"total_tokens": "total_tokens"}
    draft_per_step = True

    def parse(self, text: str) -> BlockTree | None:
        return BlockTree.parse(text)

    def candidates(self, statics: Sequence[Sequence[Sequence[int]]], max_nodes: int) -> list[Any]:
        return [BlockTree(size) for size in (2, 4, 8, 16, 32, 64) if size <= max_nodes]

    def record(self, fastest: Any) -> dict[str, Any]:
        return {RECORD: fastest.total_tokens}

    def calibrated(self, calibration: Any) -> BlockTree | None:
        budget = calibration.record.get(RECORD) if calibration is not None else None
        return None if budget is None else BlockTree(int(budget))

    def summary(self, record: dict[str, Any]) -> list[str]:
        if RECORD not in record:
            return []
        return [
            f"DDTree node budget for this machine (tree={KIND!r}): {record[RECORD]} (one block forward "
            f"{record['draft_ms_per_step']:.2f} ms a step)"
        ]


TREES = BlockTrees()  # the registry entry's tree family
