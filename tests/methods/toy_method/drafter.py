"""The toy drafter: a greedy chain from the base's last hidden state, and the cost model of one draft level."""

from __future__ import annotations

import statistics
import time

import torch

from specheads.methods.api_decode import (
    DecodeState,
    Drafter,
    DraftRequest,
    Proposal,
    TreeBuffers,
    check_chain_request,
    requested_tree,
    resolve_tree,
)

from .heads import ToyHeads


class ToyDrafter(Drafter):
    """Chains of the toy heads' top-1 tokens (deterministic, so one-hot for rejection sampling)."""

    name = "toy"
    hidden_state_layers: tuple[int, ...] = (-1,)

    def __init__(self, heads: ToyHeads, tree: str | list | None = None) -> None:
        self.heads = heads.eval()
        self.depth = heads.config.depth
        self.default_tree = resolve_tree(f"chain-{self.depth}" if tree is None else tree)

    def _tree(self, request: DraftRequest) -> TreeBuffers:
        return requested_tree(request, self.default_tree)

    def check_request(self, request: DraftRequest) -> None:
        check_chain_request(request, self.depth)
        tree = self._tree(request)
        if not tree.is_chain:
            raise ValueError("toy heads draft chains; use tree='chain-K'")
        if tree.max_depth > self.depth:
            raise ValueError(f"the chain is {tree.max_depth} deep; these toy heads draft {self.depth}")

    def max_nodes(self, request: DraftRequest) -> int:
        return self._tree(request).num_nodes

    @torch.inference_mode()
    def propose(self, state: DecodeState, request: DraftRequest) -> Proposal | None:
        if not state.hidden_states:  # a one-token prompt: no hidden state before the root yet
            return None
        tree = self._tree(request).truncated(request.max_depth)
        if tree.num_nodes == 0:
            return None
        states = self.heads(state.last_hidden(0), depth=tree.max_depth)  # [D, B, H]
        tokens = self.heads.logits(states).argmax(dim=-1).transpose(0, 1)  # [B, D]: a chain's nodes by depth
        return Proposal(tokens=tokens, tree=tree, draft_probs=None)


def draft_cost(heads: ToyHeads, repeats: int = 5) -> float:
    """Median ms of one draft level: one layer and the lm_head on one state."""
    weight = heads.layer.weight
    state = torch.zeros(1, heads.config.hidden_size, device=weight.device, dtype=weight.dtype)
    samples = []
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            heads.logits(heads(state, depth=1)).argmax(dim=-1)
            samples.append(1000 * (time.perf_counter() - start))
    return statistics.median(samples)
