"""Speculation trees: Medusa-style choice lists, chains and JSON files turned into tree buffers.

A tree has a root (node 0: the last committed token, not yet in the base's cache) and N drafted nodes. Every node
except the root has a parent with a smaller index, so nodes are in topological order. A Medusa choice list names
each node by its path of top-k ranks from the root, e.g. ``[[0], [0, 0], [1]]``: node ``[0, 1]`` is the second
candidate of head 1 under the first candidate of head 0 (Cai et al. 2024, arXiv 2401.10774).

Everything here is a pure function of the topology; no model is involved.

Trees a drafter grows while decoding (EAGLE-2's dynamic trees, DDTree budgets, ...) belong to the method that grows
them: each method describes its own as a :class:`TreeFamily` (their names, size keywords, calibration record), which
the engine reads through :func:`tree_families` without naming any kind.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import torch

# The named trees are package data (pyproject's package-data ``trees/*.json``), found beside this package in a checkout
# and in an installed wheel alike; the repository's configs/trees is a symlink to this folder, absent from a wheel.
TREES_DIR = Path(__file__).resolve().parents[1] / "trees"
_CHAIN_RE = re.compile(r"^chain-(\d+)$")

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
    """Tree buffers for an arbitrary topology (grown trees); ``parents[0]`` must be -1. Cached by topology."""
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
        TreeError: for an unknown name, the name of a tree some family grows (:func:`family_of`: the drafter that
            asked takes static trees), an unreadable file or a malformed tree.
    """
    if isinstance(spec, (str, Path)):
        text = str(spec)
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
        family = None if looks_like_path else family_of(text)
        if family is not None:
            raise TreeError(f"{grown_tree_owners(family)}; this drafter takes static trees only")
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
    shipped tree files and from the tree families (:func:`tree_families`), so a new one is listed."""
    forms = [
        f"'{kind}'" + (f" / '{family.sized_form}'" if family.sized_form else "") + f" ({_owners(family)})"
        for family in tree_families()
        for kind in family.kinds
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


# ------------------------------------------------------------------------------------------------ grown trees
@runtime_checkable
class TreeSpec(Protocol):
    """What the engine reads of any tree a request names: static :class:`TreeBuffers`, or a tree a family grows
    while decoding (a method's own type, such as EAGLE-2's dynamic trees or DFlash's DDTree budgets)."""

    @property
    def num_nodes(self) -> int:
        """The most drafted nodes one step of this tree verifies (the root not counted)."""
        ...


class TreeFamily:
    """The trees a method's drafter grows while decoding, beyond static trees, described by the method that owns them.

    The engine never names a kind; it asks the families (:func:`tree_families`): :func:`resolve_tree` refuses a
    family's tree names for a drafter of static trees, naming who grows them; ``GenerationConfig`` checks the size
    keywords a kind takes (:attr:`overrides`) and the decoder applies them to the drafter's own tree of that kind
    (:meth:`override`); calibration times :meth:`candidates` next to the static ones, charges the method's draft cost
    per depth or once a step (:attr:`draft_per_step`), records the fastest (:meth:`record`) and reports it
    (:meth:`summary`); the drafter reads the record back (:meth:`calibrated`). A method's registry entry names its
    family (``trees``; default :data:`STATIC`, static trees only); a family without an entry is made known with
    :func:`register_tree_family`.

    Attributes:
        kinds: the bare ``tree=`` names of the family's trees (each the drafter's own default size).
        sized_form: how a name gives the size too, in words (``"<kind>-N"``), which :meth:`parse` reads.
        description: what the trees are, in words, for messages.
        overrides: ``{generate keyword: tree field}``: the keywords (``tree_top_k``, ``depth``, ``total_tokens``) that
            resize a bare kind, and the field of the tree each sets.
        draft_per_step: one draft forward drafts every depth (a block drafter).
    """

    kinds: tuple[str, ...] = ()
    sized_form: str = ""
    description: str = ""
    overrides: Mapping[str, str] = MappingProxyType({})
    draft_per_step: bool = False

    def parse(self, text: str) -> Any | None:
        """The tree a sized name (:attr:`sized_form`) gives, else None."""
        return None

    def names(self, text: str) -> bool:
        """``text`` names one of this family's trees (a bare kind or a sized name, even one of a size it refuses)."""
        if text in self.kinds:
            return True
        try:
            return self.parse(text) is not None
        except TreeError:  # the family's form with a bad size (``ddtree-0``): still the family's name
            return True

    def override(self, tree: Any, fields: dict[str, int]) -> Any:
        """``tree`` (a drafter's own tree of a bare kind) with the ``fields`` the :attr:`overrides` keywords set."""
        return dataclasses.replace(tree, **fields)

    def candidates(self, statics: Sequence[Sequence[Sequence[int]]], max_nodes: int) -> list[Any]:
        """Grown trees to time next to the static candidate trees ``statics`` (none by default)."""
        return []

    def record(self, fastest: Any) -> dict[str, Any]:
        """The calibration record's fields for the fastest grown tree (``tree.json``; see :class:`~specheads.heads.
        calibration.Calibration`)."""
        return {}

    def calibrated(self, calibration: Any) -> Any | None:
        """The grown tree a :class:`~specheads.heads.calibration.Calibration` recorded (:meth:`record`'s fields in its
        ``record``), None when it holds none or ``calibration`` is None."""
        return None

    def summary(self, record: dict[str, Any]) -> list[str]:
        """The lines ``specheads calibrate`` prints about what :meth:`record` wrote into ``record`` (default: none)."""
        return []


STATIC = TreeFamily()  # static trees only: the tree family of a registry entry that names none
_REGISTERED: list[TreeFamily] = []  # families made known without a registry entry (register_tree_family)


def register_tree_family(family: TreeFamily) -> TreeFamily:
    """Make ``family``'s trees known to the engine without a registry entry (a drafter built by hand, a test): its
    names are then refused for static drafters with its description, and its bare kinds take its size keywords.

    A method's family needs no call: its registry entry names it. Returns ``family``.

    Raises:
        TreeError: one of its kinds names another family's tree.
    """
    for kind in family.kinds:
        other = family_of(kind)
        if other is not None and other is not family:
            raise TreeError(f"tree={kind!r} already names {other.description or type(other).__name__}")
    if family not in _REGISTERED:
        _REGISTERED.append(family)
    return family


def unregister_tree_family(family: TreeFamily) -> None:
    """Forget a family :func:`register_tree_family` made known (no error when it was not)."""
    if family in _REGISTERED:
        _REGISTERED.remove(family)


def tree_families() -> list[TreeFamily]:
    """Every family of grown trees: each method's (its registry entry's ``trees``, imported on first use), in
    registry order, then those made known with :func:`register_tree_family`."""
    from specheads.registry import HEAD_TYPES

    families = [entry.tree_family() for entry in HEAD_TYPES.values()] + _REGISTERED
    return [family for family in dict.fromkeys(families) if family.kinds]


def family_of(text: str) -> TreeFamily | None:
    """The family whose tree ``text`` names (a bare kind or a sized name), None when no family's does."""
    return next((family for family in tree_families() if family.names(text)), None)


def family_of_kind(tree: Any) -> TreeFamily | None:
    """The family one of whose bare kinds ``tree`` is (the names that take size keywords), else None."""
    if not isinstance(tree, str):
        return None
    return next((family for family in tree_families() if tree in family.kinds), None)


def _owners(family: TreeFamily) -> list[str]:
    """The methods whose registry entries name ``family``."""
    from specheads.registry import HEAD_TYPES

    return [name for name, entry in HEAD_TYPES.items() if entry.tree_family() is family]


def grown_tree_owners(family: TreeFamily) -> str:
    """``tree='<kind>' (...) is grown by the drafters of methods [...]``: who grows ``family``'s trees (the wording
    of every refusal of a grown tree)."""
    owners = _owners(family)
    by = f"the drafters of methods {owners}" if owners else "drafters of its own (registered without a method)"
    return f"tree={family.kinds[0]!r} ({family.description or 'grown trees'}) is grown by {by}"
