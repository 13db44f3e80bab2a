"""Speculation trees: Medusa-style choice lists, chains and JSON files turned into tree buffers.

A tree has a root (node 0: the last committed token, not yet in the base's cache) and N drafted nodes. Every node
except the root has a parent with a smaller index, so nodes are in topological order. A Medusa choice list names
each node by its path of top-k ranks from the root, e.g. ``[[0], [0, 0], [1]]``: node ``[0, 1]`` is the second
candidate of head 1 under the first candidate of head 0 (Cai et al. 2024, arXiv 2401.10774).

Everything here is a pure function of the topology; no model is involved.
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import torch

# The named trees are package data (pyproject's package-data ``trees/*.json``), found beside this package in a checkout
# and in an installed wheel alike; the repository's configs/trees is a symlink to this folder, absent from a wheel.
TREES_DIR = Path(__file__).resolve().parents[1] / "trees"
_CHAIN_RE = re.compile(r"^chain-(\d+)$")
_DYNAMIC_RE = re.compile(r"^dynamic-(\d+)-(\d+)-(\d+)$")
_BLOCK_RE = re.compile(r"^ddtree-(\d+)$")
# How a grown kind (a registry entry's ``grows``) names its size too, as _DYNAMIC_RE and _BLOCK_RE read it.
_SIZED_FORMS = {"dynamic": "dynamic-K-D-N", "ddtree": "ddtree-N"}

Choices = tuple[tuple[int, ...], ...]


class TreeError(ValueError):
    """A tree specification that cannot be used."""


@dataclass(frozen=True, eq=False)
class TreeBuffers:
    """Static description of a speculation tree with ``N + 1`` nodes (node 0 is the root).

    Attributes:
        parents: ``parents[i]`` is the parent of node ``i``; ``parents[0] == -1``.
        depths: ``[N + 1]`` depth of each node (root 0); position of node i = prefix length + depths[i].
        attention_mask: ``[N + 1, N + 1]`` bool, True where node i may attend to node j (j is i or an ancestor);
            built on first use (a tree a drafter grew on the device comes with its mask there, and the host's is
            never needed).
        children: children of each node, in index order (the order candidates are tried).
        paths: ``[P, D + 1]`` node ids of every root-to-leaf path, padded with -1 (Medusa's retrieve indices).
        ranks: ``ranks[i]`` is the top-k rank of node i among its head's candidates (-1 for the root).
        choices: the Medusa choice paths of nodes 1..N.
        levels: ``depths`` as a tuple (host code reads it without touching a tensor).

    The tensors live on the CPU; :meth:`on` gives the device copies the decode loop uses, built once per device.
    """

    parents: tuple[int, ...]
    depths: torch.Tensor
    children: tuple[tuple[int, ...], ...]
    paths: torch.Tensor
    ranks: tuple[int, ...]
    choices: Choices
    levels: tuple[int, ...] = ()
    _on_device: dict = field(default_factory=dict, repr=False)

    def on(self, device: torch.device | str, width: int | None = None) -> DeviceTree:
        """This tree's buffers on ``device``, padded to ``width`` nodes (default: its own ``N + 1``); cached.

        Padding nodes sit at the root's depth and see only themselves, so no attention row is empty.
        """
        size = len(self.parents)
        width = size if width is None else width
        key = (str(device), width)
        buffers = self._on_device.get(key)
        if buffers is None:
            if width < size:
                raise TreeError(f"a tree of {size} nodes cannot be padded to {width}")
            mask = torch.eye(width, dtype=torch.bool)
            mask[:size, :size] = self.attention_mask
            depths = torch.zeros(width, dtype=torch.long)
            depths[:size] = self.depths
            parents = torch.zeros(width, dtype=torch.long)
            parents[1:size] = torch.tensor(self.parents[1:], dtype=torch.long)
            ranks = torch.zeros(width, dtype=torch.long)
            ranks[1:size] = torch.tensor(self.ranks[1:], dtype=torch.long)
            buffers = DeviceTree(mask.to(device), depths.to(device), parents.to(device), ranks.to(device))
            self._on_device[key] = buffers
        return buffers

    @cached_property
    def attention_mask(self) -> torch.Tensor:
        """``[N + 1, N + 1]`` bool, True where node i may attend to node j (j is i or an ancestor)."""
        size = len(self.parents)
        ancestors = [1] * size  # bit j of ancestors[i]: node i sees node j (itself or an ancestor)
        for node in range(1, size):
            ancestors[node] = ancestors[self.parents[node]] | (1 << node)
        return torch.tensor([[bool(bits >> j & 1) for j in range(size)] for bits in ancestors], dtype=torch.bool)

    @property
    def num_nodes(self) -> int:
        """Number of drafted nodes N (the root excluded)."""
        return len(self.parents) - 1

    @property
    def max_depth(self) -> int:
        return max(self.levels) if self.num_nodes else 0

    @property
    def is_chain(self) -> bool:
        """True when every node's parent is the node before it (a plain causal mask suffices)."""
        return all(parent == index - 1 for index, parent in enumerate(self.parents) if index > 0)

    def truncated(self, max_depth: int) -> TreeBuffers:
        """The sub-tree of nodes at depth <= ``max_depth`` (cached)."""
        if max_depth >= self.max_depth:
            return self
        return tree_from_choices(tuple(c for c in self.choices if len(c) <= max_depth))


@dataclass(frozen=True)
class DeviceTree:
    """A tree's buffers on the decoding device (see :meth:`TreeBuffers.on`), ``W`` nodes with padding.

    Attributes:
        attention_mask: ``[W, W]`` bool, node i sees node j (an ancestor or itself).
        depths: ``[W]`` depth of each node.
        parents: ``[W]`` parent of each node (the root and padding: 0).
        ranks: ``[W]`` top-k rank of each node among its parent's candidates (the root and padding: 0).
    """

    attention_mask: torch.Tensor
    depths: torch.Tensor
    parents: torch.Tensor
    ranks: torch.Tensor


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

    @classmethod
    def parse(cls, text: str) -> DynamicTree | None:
        """``"dynamic-K-D-N"`` (top_k K, depth D, total_tokens N), the form the CLI and bench take; else None."""
        match = _DYNAMIC_RE.match(text)
        return None if match is None else cls(*(int(group) for group in match.groups()))

    @property
    def name(self) -> str:
        return f"dynamic-{self.top_k}-{self.depth}-{self.total_tokens}"


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
        match = _BLOCK_RE.match(text)
        return None if match is None else cls(int(match.group(1)))

    @property
    def name(self) -> str:
        return f"ddtree-{self.total_tokens}"


def validate_choices(choices: Sequence[Sequence[int]]) -> Choices:
    """Check a Medusa choice list and return it sorted by (depth, path).

    Raises:
        TreeError: when a path is empty, holds a negative or non-integer rank, is repeated, or its parent path is
            missing.
    """
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence):
        raise TreeError(f"a tree must be a list of paths like [[0], [0, 0], [1]], got {type(choices).__name__}")
    paths: list[tuple[int, ...]] = []
    for position, path in enumerate(choices):
        if isinstance(path, (str, bytes)) or not isinstance(path, Sequence) or len(path) == 0:
            raise TreeError(f"tree path #{position} must be a non-empty list of top-k ranks, got {path!r}")
        for rank in path:
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                raise TreeError(f"tree path #{position} {list(path)}: ranks must be non-negative integers")
        paths.append(tuple(path))
    if len(set(paths)) != len(paths):
        duplicates = sorted({p for p in paths if paths.count(p) > 1})
        raise TreeError(f"tree has repeated paths: {[list(p) for p in duplicates]}")
    present = set(paths)
    for path in paths:
        if len(path) > 1 and path[:-1] not in present:
            raise TreeError(f"tree path {list(path)} has no parent path {list(path[:-1])}")
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


@lru_cache(maxsize=64)
def tree_from_choices(choices: Choices) -> TreeBuffers:
    """Build the tree buffers of a validated, sorted choice tuple (see :func:`validate_choices`)."""
    index_of = {path: i + 1 for i, path in enumerate(choices)}
    parents = (-1,) + tuple(index_of.get(path[:-1], 0) for path in choices)
    ranks = (-1,) + tuple(path[-1] for path in choices)
    return _buffers(parents, ranks, choices)


def tree_from_parents(parents: Sequence[int]) -> TreeBuffers:
    """Tree buffers for an arbitrary topology (dynamic trees); ``parents[0]`` must be -1. Cached by topology."""
    return _tree_from_parents(tuple(int(p) for p in parents))


@lru_cache(maxsize=4096)
def _tree_from_parents(parents: tuple[int, ...]) -> TreeBuffers:
    if not parents or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i > 0):
        raise TreeError("parents must start with -1 and point to earlier nodes")
    # Name each node by its path of sibling ranks so that truncation and golden tests work the same way.
    paths: list[tuple[int, ...]] = [()]
    sibling_count: dict[int, int] = {}
    for parent in parents[1:]:
        rank = sibling_count.get(parent, 0)
        sibling_count[parent] = rank + 1
        paths.append(paths[parent] + (rank,))
    return _buffers(parents, (-1,) + tuple(p[-1] for p in paths[1:]), tuple(paths[1:]))


def _buffers(parents: tuple[int, ...], ranks: tuple[int, ...], choices: Choices) -> TreeBuffers:
    size = len(parents)
    depths = [0] * size
    children: list[list[int]] = [[] for _ in range(size)]
    for node in range(1, size):
        parent = parents[node]
        depths[node] = depths[parent] + 1
        children[parent].append(node)
    leaves = [node for node in range(size) if not children[node]]
    max_depth = max(depths)
    chains = []
    for leaf in leaves:
        chain = []
        node = leaf
        while node >= 0:
            chain.append(node)
            node = parents[node]
        chains.append(chain[::-1] + [-1] * (max_depth + 1 - len(chain)))
    return TreeBuffers(
        parents=parents,
        depths=torch.tensor(depths, dtype=torch.long),
        children=tuple(tuple(c) for c in children),
        paths=torch.tensor(chains, dtype=torch.long).reshape(len(leaves), max_depth + 1),
        ranks=ranks,
        choices=choices,
        levels=tuple(depths),
    )


def chain_choices(length: int) -> Choices:
    """The choice list of a chain of ``length`` drafted tokens: ``[[0], [0, 0], ...]``."""
    return tuple((0,) * depth for depth in range(1, length + 1))


def resolve_tree(spec: str | Path | Sequence[Sequence[int]]) -> TreeBuffers:
    """Turn a user's ``tree=`` value into tree buffers.

    Args:
        spec: ``"chain-K"``; the name of a tree shipped in the package (a JSON file in ``specheads/trees/``, named
            without ``.json``); a path to a JSON file ``{"choices": [...]}``; or a Medusa choice list.

    Raises:
        TreeError: for an unknown name, an unreadable file or a malformed tree.
    """
    if isinstance(spec, (str, Path)):
        text = str(spec)
        if text == "dynamic" or _DYNAMIC_RE.match(text):
            raise TreeError(f"{grown_tree_owners('dynamic')}; this drafter takes static trees only")
        if text == "ddtree" or _BLOCK_RE.match(text):
            raise TreeError(f"{grown_tree_owners('ddtree')}; this drafter takes static trees only")
        match = _CHAIN_RE.match(text)
        if match:
            length = int(match.group(1))
            if length < 1:
                raise TreeError("chain-K needs K >= 1")
            return tree_from_choices(chain_choices(length))
        return tree_from_choices(validate_choices(_load_tree_file(text)))
    return tree_from_choices(validate_choices(spec))


def _load_tree_file(text: str) -> list:
    # A bare name means a shipped tree; anything that looks like a path is a path (never both).
    looks_like_path = text.endswith(".json") or "/" in text or "\\" in text
    candidates = [Path(text)] if looks_like_path else [TREES_DIR / f"{text}.json"]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise TreeError(f"unknown tree {text!r}; {tree_forms()}")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise TreeError(f"cannot read tree file {path}: {error}") from error
    if not isinstance(data, dict) or "choices" not in data:
        raise TreeError(f"tree file {path} must hold an object with a 'choices' list")
    return data["choices"]


def available_trees() -> list[str]:
    """Names of the tree files shipped in the package (``specheads/trees/``)."""
    return sorted(p.stem for p in TREES_DIR.glob("*.json")) if TREES_DIR.is_dir() else []


def tree_forms() -> str:
    """Every form a ``tree=`` value takes, in words, for the error that refuses an unknown one: read from the
    shipped tree files and from the registry (the kinds each method's drafter grows), so a new one is listed."""
    from specheads.registry import HEAD_TYPES, methods_growing

    grown = dict.fromkeys(kind for entry in HEAD_TYPES.values() for kind in entry.grows)
    forms = [
        f"'{kind}'" + (f" / '{_SIZED_FORMS[kind]}'" if kind in _SIZED_FORMS else "") + f" ({methods_growing(kind)})"
        for kind in grown
    ]
    return (
        f"a tree is 'chain-K', a tree JSON file, a shipped tree {available_trees()}, 'auto' (the tree calibrated for "
        f"the heads) or a tree grown while decoding: {', '.join(forms)}"
    )


def grow_tree(agreement_by_rank: Sequence[Sequence[float]], max_nodes: int) -> list[tuple[tuple[int, ...], float]]:
    """Nodes in the order a greedy search adds them: the most probable path not yet in the tree first.

    Returns:
        ``[(path, probability), ...]`` of length <= ``max_nodes``; every prefix of the list is a valid tree.
    """
    depth_limit, ranks = len(agreement_by_rank), len(agreement_by_rank[0])
    frontier = [(-float(agreement_by_rank[0][rank]), (rank,)) for rank in range(ranks)]
    heapq.heapify(frontier)
    nodes: list[tuple[tuple[int, ...], float]] = []
    while frontier and len(nodes) < max_nodes:
        negative, path = heapq.heappop(frontier)
        probability = -negative
        nodes.append((path, probability))
        if len(path) < depth_limit:
            for rank in range(ranks):
                heapq.heappush(frontier, (-(probability * float(agreement_by_rank[len(path)][rank])), path + (rank,)))
    return nodes


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


def grown_tree_owners(kind: str) -> str:
    """``tree='<kind>' is grown by the drafters of methods [...]``: the registry entries whose tree family grows it
    (the wording of every refusal of a grown tree)."""
    from specheads.registry import methods_growing

    what = {"dynamic": "EAGLE-2 dynamic trees", "ddtree": "DDTree trees"}.get(kind, f"{kind} trees")
    return f"tree={kind!r} ({what}) is grown by the drafters of methods {methods_growing(kind)}"


class TreeFamily:
    """The trees a method's drafter grows beyond static trees: what calibration times for it and what it records.

    A method's registry entry names its family (``trees``); the default is static trees only. Calibration asks the
    family for the grown trees worth timing next to the static candidates, records the fastest through
    :meth:`record`, and charges the method's draft cost per depth, or once per step when one draft forward drafts
    every depth (:attr:`draft_per_step`).

    Attributes:
        kinds: the ``tree=`` names the drafter grows (``"dynamic"``, ``"ddtree"``).
        draft_per_step: one draft forward drafts every depth (a block drafter).
    """

    kinds: tuple[str, ...] = ()
    draft_per_step: bool = False

    def candidates(self, statics: Sequence[Sequence[Sequence[int]]], max_nodes: int) -> list[Any]:
        """Grown trees to time next to the static candidate trees ``statics`` (none by default)."""
        return []

    def record(self, fastest: Any) -> dict[str, Any]:
        """The calibration record's fields for the fastest grown tree (see :class:`~specheads.heads.calibration.
        Calibration`)."""
        return {}


STATIC = TreeFamily()  # static trees only: the tree family of a registry entry that names none
