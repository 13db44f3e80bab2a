"""The small state objects that travel through the decode loop."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from specheads.inference.sampling import SamplingParams
from specheads.inference.trees import DynamicTree, TreeBuffers
from specheads.metrics import SpecStats


@dataclass
class DecodeState:
    """Everything one generation carries from step to step.

    The base's cache holds every committed token except the last one of each row (the *root*), which the next
    verification forward feeds together with the drafted tree.

    Attributes:
        tokens: ``[B, capacity]`` token buffer; row b's committed tokens are ``tokens[b, :lengths[b]]``.
        lengths: committed tokens per row, prompt included.
        prompt_lengths: prompt tokens per row.
        cache: the base model's key/value cache (``lengths[b] - 1`` positions per row).
        hidden_states: base hidden states of the tokens that entered the cache in the last forward, one tensor
            ``[B, M, H]`` per layer a drafter asked for (empty when no drafter needs them).
        finished: per row, whether generation has ended (EOS, ``max_new_tokens`` or the model's length limit).
        stats: statistics of this generation.
    """

    tokens: torch.Tensor
    lengths: list[int]
    prompt_lengths: list[int]
    cache: DynamicCache
    hidden_states: tuple[torch.Tensor, ...] = ()
    finished: list[bool] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def sequence(self, row: int = 0) -> torch.Tensor:
        """Committed tokens of one row, ``[lengths[row]]``."""
        return self.tokens[row, : self.lengths[row]]

    def new_tokens(self, row: int = 0) -> list[int]:
        return self.tokens[row, self.prompt_lengths[row] : self.lengths[row]].tolist()

    def append(self, row: int, new: list[int]) -> None:
        start = self.lengths[row]
        self.tokens[row, start : start + len(new)] = torch.tensor(new, dtype=self.tokens.dtype)
        self.lengths[row] = start + len(new)


@dataclass(frozen=True)
class DraftRequest:
    """What the decode loop asks of a drafter at each step.

    Attributes:
        sampling: the base's sampling settings; a drafter that samples uses the same ones.
        generator: random source for sampling drafters.
        max_depth: the deepest useful draft (tokens left to generate minus one, within the model's length limit).
        num_speculative_tokens: K for chain drafters (None: the drafter's default).
        tree: the tree for tree drafters: static buffers or an EAGLE-2 :class:`DynamicTree` (None: the default).
    """

    sampling: SamplingParams
    generator: torch.Generator | None
    max_depth: int
    num_speculative_tokens: int | None = None
    tree: TreeBuffers | DynamicTree | None = None


@dataclass
class Proposal:
    """Drafted tokens for one verification.

    Attributes:
        tokens: ``[B, N]`` tokens of tree nodes 1..N (node 0, the root, is the last committed token).
        tree: the tree topology of the N nodes.
        draft_probs: ``[B, N, V]`` distribution each node's token was drawn from, or None for deterministic
            proposals (top-k heads, prompt lookup, greedy drafts), which count as one-hot.
    """

    tokens: torch.Tensor
    tree: TreeBuffers
    draft_probs: torch.Tensor | None = None
