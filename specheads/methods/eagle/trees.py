"""EAGLE-2's dynamic trees (Li et al. 2024, arXiv 2406.16858), the tree family EAGLE heads grow, owned here end to end.

A :class:`DynamicTree` is grown at decode time from the draft's confidence (the drafter's ``_dynamic``). Its family
(:data:`TREES`, named by EAGLE's registry entry) tells the engine everything else about it: the names ``"dynamic"``
(the drafter's default parameters) and ``"dynamic-K-D-N"``, the ``tree_top_k`` / ``depth`` / ``total_tokens``
keywords that resize it, the trees calibration times (one per shape of a static candidate, see
:func:`dynamic_parameters`), the ``"dynamic"`` field of ``tree.json`` that records the fastest, and how the drafter
reads it back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specheads.methods.api_decode import TreeError, TreeFamily
from specheads.methods.eagle.names import KIND

_NAME_RE = re.compile(r"^dynamic-(\d+)-(\d+)-(\d+)$")


@dataclass(frozen=True)
class DynamicTree:
    """An EAGLE-2 dynamic tree, grown at decode time from the draft's confidence (Li et al. 2024, arXiv 2406.16858).

    Attributes:
        top_k: nodes expanded per depth, and children kept per expanded node.
        depth: draft levels below the root.
        total_tokens: drafted nodes verified (the best by path probability; the root not counted).
    """

    top_k: int
    depth: int
    total_tokens: int

    def __post_init__(self) -> None:
        for name in ("top_k", "depth", "total_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TreeError(f"a dynamic tree's {name} must be an integer >= 1, got {value!r}")

    @property
    def max_depth(self) -> int:
        return self.depth

    @property
    def num_nodes(self) -> int:
        """The most nodes a tree of these parameters verifies."""
        return self.total_tokens

    @classmethod
    def parse(cls, text: str) -> DynamicTree | None:
        """``"dynamic-K-D-N"`` (top_k K, depth D, total_tokens N), the form the CLI and bench take; else None."""
        match = _NAME_RE.match(text)
        return None if match is None else cls(*(int(group) for group in match.groups()))

    @property
    def name(self) -> str:
        return f"{KIND}-{self.top_k}-{self.depth}-{self.total_tokens}"


def dynamic_parameters(choices: Sequence[Sequence[int]]) -> dict[str, int]:
    """EAGLE-2 ``top_k`` / ``depth`` / ``total_tokens`` able to grow a tree of this shape from the draft's confidence.

    ``top_k`` covers the widest rank used and the most nodes expanded at one depth; ``depth`` is the tree's depth and
    ``total_tokens`` its size (at least one node each).
    """
    if not choices:
        return {"top_k": 1, "depth": 1, "total_tokens": 1}
    depth = max(len(path) for path in choices)
    widest_rank = max(path[-1] for path in choices) + 1
    parents_per_depth = [len({tuple(p[:-1]) for p in choices if len(p) == d}) for d in range(2, depth + 1)]
    return {
        "top_k": max([widest_rank, *parents_per_depth]),
        "depth": depth,
        "total_tokens": len(choices),
    }


class DynamicTrees(TreeFamily):
    """EAGLE-2 dynamic trees: one per distinct ``(top_k, depth, total_tokens)`` that grows a static candidate's
    shape (:func:`dynamic_parameters`); recorded as ``dynamic``."""

    kinds = (KIND,)
    sized_form = "dynamic-K-D-N"
    description = "EAGLE-2 dynamic trees"
    overrides = {"tree_top_k": "top_k", "depth": "depth", "total_tokens": "total_tokens"}

    def parse(self, text: str) -> DynamicTree | None:
        return DynamicTree.parse(text)

    def candidates(self, statics: Sequence[Sequence[Sequence[int]]], max_nodes: int) -> list[Any]:
        params = {tuple(dynamic_parameters(c).values()): dynamic_parameters(c) for c in statics}
        return [DynamicTree(**p) for p in params.values()]

    def record(self, fastest: Any) -> dict[str, Any]:
        return {KIND: vars(fastest)}

    def calibrated(self, calibration: Any) -> DynamicTree | None:
        fields = calibration.record.get(KIND) if calibration is not None else None
        return DynamicTree(**fields) if fields else None

    def summary(self, record: dict[str, Any]) -> list[str]:
        if KIND not in record:
            return []
        level = record["draft_ms_per_level"]
        return [f"EAGLE-2 dynamic tree for this machine: {record[KIND]} (draft level {level:.2f} ms)"]


TREES = DynamicTrees()  # the registry entry's tree family
