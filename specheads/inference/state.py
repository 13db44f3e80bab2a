"""The small state objects that travel through the decode loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from specheads.inference import kv_cache
from specheads.inference.sampling import SamplingParams
from specheads.inference.trees import TreeBuffers, TreeSpec
from specheads.metrics import SpecStats


@dataclass
class DecodeState:
    """Everything one generation carries from step to step, for a batch of independent rows.

    The base's cache holds every committed token except the last one of each row (the *root*), which the next
    verification forward feeds together with the drafted tree. Rows finish independently; a finished row leaves
    the batch (``rows``), so it stops costing compute.

    Attributes:
        tokens: ``[B, capacity]`` token buffer; row b's committed tokens are ``tokens[b, :lengths[b]]``.
        lengths: committed tokens per row, prompt included.
        prompt_lengths: prompt tokens per row.
        cache: the base model's key/value cache (:class:`~specheads.inference.kv_cache.SlotCache`, one cache row per
            entry of ``rows``, ``lengths[row] - 1`` committed slots each).
        hidden_states: base hidden states of the tokens that entered the cache in the last forward, one tensor
            ``[len(rows), M, H]`` per layer a drafter asked for (empty when no drafter needs them); row i holds
            ``hidden_counts[i]`` of them (the rest is padding).
        hidden_counts: per entry of ``rows``, how many of ``hidden_states`` are real.
        finished: per row, whether generation has ended (EOS, ``max_new_tokens`` or the model's length limit).
        finish_reasons: per row, why it ended: ``"eos"``, ``"max_new_tokens"`` or ``"max_length"`` (the model's
            position limit came first), None while it runs.
        stats: statistics per row.
        rows: the rows still generating, in cache order.
        generators: per row, its random source (None at temperature 0 with greedy acceptance).
        draft: the drafter's per-generation state (its caches), set by ``drafter.reset``; kept here so that a
            drafter object can serve several generations at once.
        batch_draft_time_s / batch_verify_time_s: time the whole batch spent drafting / verifying.
        host_tokens: per row, its committed tokens on the host (``host_tokens[b] == tokens[b, :lengths[b]]``): what
            host-side drafters read and the next root, without a transfer.
    """

    tokens: torch.Tensor
    lengths: list[int]
    prompt_lengths: list[int]
    cache: Any
    hidden_states: tuple[torch.Tensor, ...] = ()
    finished: list[bool] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)
    stats: list[SpecStats] | SpecStats = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    hidden_counts: list[int] = field(default_factory=list)
    generators: list[torch.Generator | None] = field(default_factory=list)
    draft: Any = None
    batch_draft_time_s: float = 0.0
    batch_verify_time_s: float = 0.0
    host_tokens: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        batch = self.tokens.shape[0]
        if not self.rows:
            self.rows = list(range(batch))
        if not self.finished:
            self.finished = [False] * batch
        if not self.finish_reasons:
            self.finish_reasons = [None] * batch
        if isinstance(self.stats, SpecStats) or not self.stats:
            self.stats = [SpecStats() for _ in range(batch)]
        if not self.hidden_counts and self.hidden_states:
            self.hidden_counts = [self.hidden_states[0].shape[1]] * len(self.rows)
        if not self.generators:
            self.generators = [None] * batch

    @property
    def batch_size(self) -> int:
        """Rows taking part in the next forward."""
        return len(self.rows)

    def sequence(self, row: int = 0) -> torch.Tensor:
        """Committed tokens of one row, ``[lengths[row]]``."""
        return self.tokens[row, : self.lengths[row]]

    def new_tokens(self, row: int = 0) -> list[int]:
        if self.host_tokens:
            return self.host_tokens[row][self.prompt_lengths[row] :]
        return self.tokens[row, self.prompt_lengths[row] : self.lengths[row]].tolist()

    def append(self, row: int, new: list[int]) -> None:
        self.append_rows({row: new})

    def append_rows(self, new: dict[int, list[int]]) -> None:
        """Commit ``new[row]`` after each row's tokens, for all rows with one copy to the device."""
        rows = [row for row, tokens in new.items() for _ in tokens]
        if rows:
            columns = [self.lengths[row] + k for row, tokens in new.items() for k in range(len(tokens))]
            values = [token for tokens in new.values() for token in tokens]
            index = kv_cache.to_device([rows, columns, values], self.tokens.device)
            self.tokens[index[0], index[1]] = index[2]
        for row, tokens in new.items():
            self.lengths[row] += len(tokens)
            if self.host_tokens:
                self.host_tokens[row].extend(tokens)

    def last_hidden(self, layer: int = 0) -> torch.Tensor:
        """``[len(rows), H]`` the hidden state (of ``hidden_states[layer]``) of each row's last cached token."""
        hidden = self.hidden_states[layer]
        index = torch.tensor([count - 1 for count in self.hidden_counts], device=hidden.device)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), index]


@dataclass(frozen=True)
class DraftRequest:
    """What the decode loop asks of a drafter at each step.

    Attributes:
        sampling: the base's sampling settings; a drafter that samples uses the same ones, drawing row
            ``state.rows[i]``'s numbers from ``state.generators[state.rows[i]]`` so that each row's draws do not
            depend on its neighbours.
        max_depth: the deepest useful draft (tokens left to generate minus one, within the model's length limit), the
            largest over the rows of the batch; the engine cuts each row's proposal to that row's own limit.
        num_speculative_tokens: K for chain drafters (None: the drafter's default).
        tree: the tree for tree drafters: static buffers or a tree the drafter grows, of its method's own type
            (any :class:`~specheads.inference.trees.TreeSpec`: EAGLE-2's dynamic trees, DDTree budgets; None: the
            default).
        max_depths: each row's own depth limit (a drafter that samples stops each row there, so that a row draws
            the same random numbers alone or in any batch).
    """

    sampling: SamplingParams
    max_depth: int
    num_speculative_tokens: int | None = None
    tree: TreeSpec | None = None
    max_depths: tuple[int, ...] = ()


@dataclass
class Proposal:
    """Drafted tokens for one verification, of one row or of every row with the same tree.

    A drafter returns one Proposal for the batch (same tree for every row), or a list with one Proposal (``[1, N]``)
    or None per row of the batch, when the rows' trees differ.

    Attributes:
        tokens: ``[B, N]`` tokens of tree nodes 1..N (node 0, the root, is the last committed token).
        tree: the tree topology of the N nodes.
        draft_probs: ``[B, N, V]`` distribution each node's token was drawn from, or None for deterministic
            proposals (top-k heads, prompt lookup, greedy drafts), which count as one-hot.
        attention_mask: ``[B, N + 1, N + 1]`` bool on the tokens' device, each row's tree attention (root first;
            ``tree.attention_mask`` of that row), when the drafter grew the tree there (an EAGLE-2 dynamic tree, say);
            None: the engine uploads the host tree's buffers (:meth:`TreeBuffers.on`, cached per tree).
        depths: ``[B, N + 1]`` each node's depth on the device, given with ``attention_mask``.
    """

    tokens: torch.Tensor
    tree: TreeBuffers
    draft_probs: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    depths: torch.Tensor | None = None


def rows_of(proposal: Proposal | list[Proposal | None] | None, batch: int) -> list[Proposal | None]:
    """A drafter's answer as one proposal (``[1, N]`` tokens) or None per row of a ``batch``-row step."""
    if proposal is None:
        return [None] * batch
    if isinstance(proposal, list):
        if len(proposal) != batch:
            raise RuntimeError(f"the drafter proposed for {len(proposal)} rows, the batch has {batch}")
        return proposal
    if proposal.tokens.shape[0] != batch:
        raise RuntimeError(f"the drafter proposed {proposal.tokens.shape[0]} rows, the batch has {batch}")
    return [
        Proposal(
            proposal.tokens[i : i + 1],
            proposal.tree,
            None if proposal.draft_probs is None else proposal.draft_probs[i : i + 1],
            None if proposal.attention_mask is None else proposal.attention_mask[i : i + 1],
            None if proposal.depths is None else proposal.depths[i : i + 1],
        )
        for i in range(batch)
    ]
