"""Prompt lookup as a second source for any drafter: both sources' drafts in one tree, verified by one forward.

Text repeats itself: code repeats names and lines, chat answers loop, extraction copies the prompt. A model-free
lookup (the longest suffix of the context that occurred before, and what followed it; Saxena 2023, SuffixDecoding
arXiv 2411.04975) is right at positions where a learned drafter is often wrong, and the other way round.
:class:`WithLookup` wraps any :class:`~specheads.inference.drafters.Drafter`: each step it asks the drafter for its
tree as usual, looks up each row's context, and grafts the lookup's continuations onto the drafter's tree as extra
branches from the root, merged where they share a prefix with the drafter's nodes. The base verifies the merged
tree in the same forward; the engine's acceptance rule does not know which source drafted which node.

Lossless in every mode: at temperature 0 the accepted path is the base's greedy path whatever the tree holds; with
``acceptance="rejection"`` a lookup node is a deterministic draft (a point mass: its draft probability is one-hot),
independent of the drafter's random draws, so tree rejection sampling stays exact with siblings from both sources.

The drafter's own state stays consistent whatever was accepted: drafters that rebuild from the committed tokens and
the base's features (EAGLE, DFlash, Medusa) do so unchanged; a drafter that keeps drafted tokens in a cache (the
draft model) is told how many of the accepted tokens lie on its own proposal, and feeds the rest as committed tokens.

How much each source proposes: the lookup proposes, per match length n, ``tokens_by_match[n]`` tokens (0: nothing),
for up to ``candidates`` distinct continuations (the most recent occurrences of the longest match first, then
shorter matches). ``calibrate --prompt-lookup`` measures the acceptance of lookup tokens by match length on the
calibration prompts and stores the table with the heads' calibration (``tree.json``); without one the defaults
below hold. ``skip_drafter_at``: from that match length on, a drafter that pays a forward per drafted token (the
draft model, :attr:`Drafter.per_token_cost`) does not draft for the step; the lookup's branch alone is verified.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from specheads.inference import kv_cache
from specheads.inference.drafters import Drafter
from specheads.inference.state import DecodeState, DraftRequest, Proposal, rows_of
from specheads.inference.trees import TreeBuffers, tree_from_parents

# Tokens proposed for a suffix match of length n (index n; lengths beyond the table use its last entry): nothing for a
# single repeated token, more the longer the match. The held-out SmolLM2 answers continue a repeated 4-gram correctly
# 91% of the time, so long matches earn long branches.
DEFAULT_TOKENS_BY_MATCH = (0, 0, 4, 6, 8)


@dataclass(frozen=True)
class PromptLookup:
    """Settings of the lookup source (see the module).

    Attributes:
        max_ngram: the longest context suffix looked up.
        min_ngram: the shortest suffix match that proposes.
        candidates: distinct continuations (branches) proposed per step at most.
        tokens_by_match: tokens proposed for a match of length n, at index n (the last entry serves longer matches).
        skip_drafter_at: a match of at least this length makes a per-token-cost drafter skip the step (None: never).
    """

    max_ngram: int = 8
    min_ngram: int = 2
    candidates: int = 2
    tokens_by_match: tuple[int, ...] = DEFAULT_TOKENS_BY_MATCH
    skip_drafter_at: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"PromptLookup needs 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.candidates < 1:
            raise ValueError(f"PromptLookup.candidates must be >= 1, got {self.candidates}")
        tokens = tuple(int(t) for t in self.tokens_by_match)
        if not tokens or min(tokens) < 0:
            raise ValueError(f"PromptLookup.tokens_by_match must be non-negative counts, got {self.tokens_by_match}")
        object.__setattr__(self, "tokens_by_match", tokens)
        if self.skip_drafter_at is not None and self.skip_drafter_at < self.min_ngram:
            raise ValueError(f"PromptLookup.skip_drafter_at must be >= min_ngram, got {self.skip_drafter_at}")

    def tokens_for(self, match: int) -> int:
        """Tokens proposed for a suffix match of ``match`` tokens."""
        return self.tokens_by_match[min(match, len(self.tokens_by_match) - 1)]

    @property
    def max_tokens(self) -> int:
        """The longest branch any match proposes."""
        return max(self.tokens_for(n) for n in range(self.min_ngram, self.max_ngram + 1))

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> PromptLookup:
        """Settings from a calibration record (``{"tokens_by_match": [...], ...}``); None: the defaults."""
        if not record:
            return cls()
        known = {k: v for k, v in record.items() if k in cls.__dataclass_fields__}
        if "tokens_by_match" in known:
            known["tokens_by_match"] = tuple(known["tokens_by_match"])
        return cls(**known)

    def record(self) -> dict[str, Any]:
        return {
            "max_ngram": self.max_ngram,
            "min_ngram": self.min_ngram,
            "candidates": self.candidates,
            "tokens_by_match": list(self.tokens_by_match),
            "skip_drafter_at": self.skip_drafter_at,
        }


def lookup_settings(value: bool | PromptLookup | dict[str, Any] | None) -> PromptLookup | None:
    """The ``prompt_lookup=`` argument of the API: False/None (off), True (defaults), settings or a record."""
    if value is None or value is False:
        return None
    if value is True:
        return PromptLookup()
    if isinstance(value, PromptLookup):
        return value
    if isinstance(value, dict):
        return PromptLookup.from_record(value)
    raise TypeError(f"prompt_lookup must be a bool, a PromptLookup or a dict, got {type(value).__name__}")


class SuffixIndex:
    """One row's context, indexed by its n-grams (``min_ngram`` to ``max_ngram`` tokens) as tokens are committed.

    :meth:`lookup` finds the longest suffix of the context that occurred earlier and returns the continuations of
    its occurrences, most recent first, then those of shorter matches, in time independent of the context's length.
    """

    def __init__(self, settings: PromptLookup) -> None:
        self.settings = settings
        self.ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> the positions just after its occurrences
        self.indexed = 0

    def _index(self, context: Sequence[int]) -> None:
        low, high = self.settings.min_ngram, self.settings.max_ngram
        for end in range(max(self.indexed, 1), len(context) + 1):
            for size in range(low, min(high, end) + 1):
                self.ends.setdefault(tuple(context[end - size : end]), []).append(end)
        self.indexed = len(context)

    def lookup(self, context: Sequence[int], limit: int) -> list[tuple[int, list[int]]]:
        """Up to ``candidates`` distinct ``(match length, continuation)`` pairs, each at most ``limit`` tokens."""
        self._index(context)
        total, found, seen = len(context), [], set()
        for size in range(min(self.settings.max_ngram, total - 1), self.settings.min_ngram - 1, -1):
            length = min(self.settings.tokens_for(size), limit)
            if length < 1:
                continue
            for end in reversed(self.ends.get(tuple(context[total - size :]), ())):
                if end >= total:
                    continue  # the suffix itself
                continuation = list(context[end : min(end + length, total)])
                key = tuple(continuation)
                if continuation and key not in seen:
                    seen.add(key)
                    found.append((size, continuation))
                    if len(found) >= self.settings.candidates:
                        return found
        return found

    def match_length(self, context: Sequence[int]) -> int:
        """The longest suffix match (0: none), after indexing ``context``."""
        found = self.lookup(context, max(1, self.settings.max_tokens))
        return found[0][0] if found else 0


@dataclass
class LookupStats:
    """What the lookup proposed and what the base accepted of it, by match length (for calibration).

    ``proposed[n]`` / ``accepted[n]``: lookup tokens proposed at match length n, and those accepted (tokens on the
    accepted path that only the lookup drafted); ``agreement[n][d]``: for a branch of match length n, how often its
    d-th token was accepted, against how often it was proposed (``offered[n][d]``).
    """

    proposed: dict[int, int] = field(default_factory=dict)
    accepted: dict[int, int] = field(default_factory=dict)
    offered: dict[int, list[int]] = field(default_factory=dict)
    taken: dict[int, list[int]] = field(default_factory=dict)
    skipped_drafts: int = 0

    def record(self, match: int, branch: Sequence[int], accepted: Sequence[int]) -> None:
        """A branch of ``match`` length was proposed; ``accepted`` are the tokens the base accepted this step."""
        common = 0
        for drafted, taken in zip(branch, accepted, strict=False):
            if drafted != taken:
                break
            common += 1
        offered = self.offered.setdefault(match, [])
        taken_list = self.taken.setdefault(match, [])
        while len(offered) < len(branch):
            offered.append(0)
            taken_list.append(0)
        for depth in range(len(branch)):
            offered[depth] += 1
            taken_list[depth] += int(depth < common)
        self.proposed[match] = self.proposed.get(match, 0) + len(branch)
        self.accepted[match] = self.accepted.get(match, 0) + common


@dataclass
class _Composed:
    """A composed generation's state: the drafter's own (``inner``), each row's index, the step's bookkeeping."""

    inner: Any
    indexes: list[SuffixIndex]
    inner_trees: list[tuple[tuple[int, ...], list[int]] | None]  # per row: the drafter's parents and tokens
    branches: list[list[tuple[int, list[int]]]]  # per row: the lookup's (match length, branch) of the step
    lengths: list[int]  # per row: committed tokens when the step was proposed
    stats: LookupStats


class WithLookup(Drafter):
    """``inner`` with prompt lookup as a second source in the same tree (see the module).

    Args:
        inner: any drafter (``NoDrafter`` makes lookup the only source).
        settings: the lookup's settings (:class:`PromptLookup`).

    Attributes:
        last_stats: the lookup's :class:`LookupStats` of the latest generation (of a batched generate's latest
            chunk), counted as it decodes; ``calibrate --prompt-lookup`` reads it.
    """

    def __init__(self, inner: Drafter, settings: PromptLookup | None = None) -> None:
        if isinstance(inner, WithLookup):
            raise ValueError("the drafter already has prompt lookup composed with it")
        self.inner = inner
        self.settings = settings or PromptLookup()
        self.name = f"{inner.name}+lookup"
        self.hidden_state_layers = inner.hidden_state_layers
        self.dynamic = inner.dynamic
        self.per_token_cost = inner.per_token_cost
        self.last_stats = LookupStats()

    def __getattr__(self, name: str) -> Any:
        # The wrapped drafter's own attributes (``head``, ``model``, calibration records) read through.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def check_request(self, request: DraftRequest) -> None:
        self.inner.check_request(request)

    def resolve(self, tree: Any) -> Any:
        return self.inner.resolve(tree)

    def extra_nodes(self, request: DraftRequest) -> int:
        return self.inner.extra_nodes(request) + self.settings.candidates * self.settings.max_tokens

    def max_nodes(self, request: DraftRequest) -> int:
        return self.inner.max_nodes(request) + self.settings.candidates * self.settings.max_tokens

    def gives_draft_probs(self, request: DraftRequest) -> bool:
        return self.inner.gives_draft_probs(request)

    @contextmanager
    def _inner_view(self, state: DecodeState) -> Iterator[_Composed]:
        """``state.draft`` as the wrapped drafter knows it, for the duration of one of its calls."""
        composed: _Composed = state.draft
        state.draft = composed.inner
        try:
            yield composed
        finally:
            composed.inner = state.draft
            state.draft = composed

    def reset(self, state: DecodeState) -> None:
        self.inner.reset(state)
        rows = len(state.rows)
        state.draft = _Composed(
            state.draft,
            [SuffixIndex(self.settings) for _ in range(rows)],
            [None] * rows,
            [[] for _ in range(rows)],
            [0] * rows,
            LookupStats(),
        )
        self.last_stats = state.draft.stats

    def propose(self, state: DecodeState, request: DraftRequest) -> list[Proposal | None] | None:
        composed: _Composed = state.draft
        rows = state.rows
        limits = request.max_depths or (request.max_depth,) * len(rows)
        branches = []
        for i, row in enumerate(rows):
            context = state.host_tokens[row] if state.host_tokens else state.sequence(row).tolist()
            branches.append(composed.indexes[i].lookup(context, limits[i]) if limits[i] > 0 else [])
        skip = (
            self.settings.skip_drafter_at is not None
            and self.per_token_cost
            and all(found and found[0][0] >= self.settings.skip_drafter_at for found in branches)
        )
        if skip:
            inner: list[Proposal | None] = [None] * len(rows)
            composed.stats.skipped_drafts += 1
        else:
            with self._inner_view(state):
                inner = rows_of(self.inner.propose(state, request), len(rows))
        composed.branches = branches
        composed.lengths = [state.lengths[row] for row in rows]
        proposals: list[Proposal | None] = []
        device = state.tokens.device
        for i, (proposal, found) in enumerate(zip(inner, branches, strict=True)):
            if proposal is None or proposal.tokens.shape[1] == 0:
                composed.inner_trees[i] = None
                proposal = None
            else:
                composed.inner_trees[i] = (proposal.tree.parents, proposal.tokens[0].tolist())
            proposals.append(merge(proposal, [branch for _, branch in found], device))
        return proposals

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        composed: _Composed = state.draft
        inner_counts = []
        for i, (row, count) in enumerate(zip(state.rows, num_accepted, strict=True)):
            start = composed.lengths[i]
            taken = state.host_tokens[row][start : start + count] if state.host_tokens else []
            if not state.host_tokens:
                taken = state.tokens[row, start : start + count].tolist()
            for match, branch in composed.branches[i]:
                composed.stats.record(match, branch, taken)
            tree = composed.inner_trees[i]
            inner_counts.append(0 if tree is None else path_on_tree(tree[0], tree[1], taken))
        with self._inner_view(state):
            self.inner.accepted(state, inner_counts)

    def keep_rows(self, state: DecodeState, keep: list[int]) -> None:
        composed: _Composed = state.draft
        composed.indexes = [composed.indexes[i] for i in keep]
        composed.inner_trees = [composed.inner_trees[i] for i in keep]
        composed.branches = [composed.branches[i] for i in keep]
        composed.lengths = [composed.lengths[i] for i in keep]
        with self._inner_view(state):
            self.inner.keep_rows(state, keep)


def path_on_tree(parents: Sequence[int], tokens: Sequence[int], taken: Sequence[int]) -> int:
    """How many of ``taken`` (the accepted tokens, in order) follow one root path of the tree (``parents`` of nodes
    0..N, node i's token ``tokens[i - 1]``)."""
    children: dict[int, list[int]] = {}
    for node in range(1, len(parents)):
        children.setdefault(parents[node], []).append(node)
    node, count = 0, 0
    for token in taken:
        nxt = next((c for c in children.get(node, ()) if tokens[c - 1] == token), None)
        if nxt is None:
            break
        node, count = nxt, count + 1
    return count


def merge(proposal: Proposal | None, branches: Sequence[Sequence[int]], device: torch.device) -> Proposal | None:
    """One row's drafter proposal (``[1, N]``, or None) with lookup ``branches`` grafted at its root.

    A branch follows the drafter's nodes while their tokens agree and adds nodes from there. Nodes are listed by
    depth (the drafter's first at each depth, in their order), as the engine's per-row truncation expects; a lookup
    node's draft probability is one-hot. Without a new node the drafter's proposal is returned as it was.
    """
    if proposal is None:
        parents: list[int] = [-1]
        tokens: list[int] = []
    else:
        parents = list(proposal.tree.parents)
        tokens = proposal.tokens[0].tolist()
    inner_count = len(tokens)
    child: dict[tuple[int, int], int] = {}
    for node in range(1, len(parents)):
        child.setdefault((parents[node], tokens[node - 1]), node)
    for branch in branches:
        node = 0
        for token in branch:
            nxt = child.get((node, token))
            if nxt is None:
                parents.append(node)
                tokens.append(int(token))
                nxt = len(parents) - 1
                child[(node, token)] = nxt
            node = nxt
    if len(tokens) == inner_count:
        return proposal
    depths = [0] * len(parents)
    for node in range(1, len(parents)):
        depths[node] = depths[parents[node]] + 1
    order = sorted(range(1, len(parents)), key=lambda n: (depths[n], n))
    new_index = {old: new for new, old in enumerate(order, 1)}
    new_index[0] = 0
    new_parents = [-1] + [new_index[parents[old]] for old in order]
    new_tokens = [tokens[old - 1] for old in order]
    tree: TreeBuffers = tree_from_parents(new_parents)
    token_tensor = kv_cache.to_device([new_tokens], device)
    probs = None
    if proposal is not None and proposal.draft_probs is not None:
        inner_probs = proposal.draft_probs[0]
        vocab = inner_probs.shape[-1]
        rows = []
        for old in order:
            if old <= inner_count:
                rows.append(inner_probs[old - 1])
            else:
                rows.append(torch.nn.functional.one_hot(torch.tensor(tokens[old - 1]), vocab).to(inner_probs))
        probs = torch.stack(rows)[None]
    return Proposal(token_tensor, tree, probs)
