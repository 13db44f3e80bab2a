"""The Medusa drafter: heads read the base's last hidden state and propose a static tree of their top-k tokens."""

from __future__ import annotations

import torch

from specheads.methods.api_decode import (
    DecodeState,
    Drafter,
    DraftRequest,
    Proposal,
    TreeBuffers,
    chain_choices,
    check_chain_request,
    resolve_tree,
    tree_from_choices,
)


class MedusaDrafter(Drafter):
    """Medusa heads propose a static tree: node (r1, ..., rd) holds head d's rank-rd candidate.

    The heads read the base's last hidden state of the last cached token; head k predicts the token k + 1 levels
    below the root (the root itself is the base's own token). Proposals are deterministic top-k candidates, which
    rejection sampling treats as one-hot (Cai et al. 2024; Medusa's ``generate_candidates``).
    """

    name = "medusa"
    hidden_state_layers: tuple[int, ...] = (-1,)

    def __init__(self, heads: torch.nn.Module, tree: str | list | None = None) -> None:
        self.heads = heads.eval()
        self.num_heads = heads.config.num_heads
        calibration = getattr(heads, "calibration", None)
        self.auto_tree = resolve_tree(calibration.tree) if calibration is not None else None  # [] is a valid tree
        if tree is None:
            self.default_tree = self.auto_tree or resolve_tree(f"chain-{self.num_heads}")
        else:
            self.default_tree = self.resolve(tree)
        self._check_depth(self.default_tree.max_depth)

    def resolve(self, tree: str | list) -> TreeBuffers:
        """A tree spec for these heads; ``"auto"`` is the tree calibrated for them on this machine."""
        if tree == "auto":
            if self.auto_tree is None:
                raise ValueError("tree='auto' needs a calibrated tree: run `specheads calibrate --base B --heads H`")
            return self.auto_tree
        return resolve_tree(tree)

    def _check_depth(self, depth: int) -> None:
        if depth > self.num_heads:
            raise ValueError(
                f"the tree is {depth} levels deep but there are only {self.num_heads} Medusa heads; "
                f"use a tree of depth <= {self.num_heads}"
            )

    def _tree(self, request: DraftRequest) -> TreeBuffers:
        if request.tree is not None:
            if not isinstance(request.tree, TreeBuffers):  # resolve() gives static trees only
                raise ValueError(f"Medusa heads take static trees, got {request.tree!r}")
            return request.tree
        if request.num_speculative_tokens is not None:
            return tree_from_choices(chain_choices(request.num_speculative_tokens))
        return self.default_tree

    def check_request(self, request: DraftRequest) -> None:
        if request.tree is None and request.num_speculative_tokens is not None:
            check_chain_request(request, self.num_heads)
        tree = self._tree(request)
        self._check_depth(tree.max_depth)
        vocab = self.heads.config.vocab_size
        if tree.num_nodes and max(tree.ranks[1:]) >= vocab:
            raise ValueError(f"the tree asks for rank {max(tree.ranks[1:])} but the vocabulary has {vocab} tokens")

    def max_nodes(self, request: DraftRequest) -> int:
        return self._tree(request).num_nodes

    def reset(self, state: DecodeState) -> None:
        return None

    @torch.inference_mode()
    def propose(self, state: DecodeState, request: DraftRequest) -> Proposal | None:
        if not state.hidden_states:  # a one-token prompt: no hidden state before the root yet
            return None
        tree = self._tree(request).truncated(request.max_depth)
        if tree.num_nodes == 0:
            return None
        hidden = state.last_hidden(0)  # [B, H] of each row's last cached token
        logits = self.heads(hidden, num_heads=tree.max_depth)  # [D, B, V]
        buffers = tree.on(logits.device)
        depths, ranks = buffers.depths[1:], buffers.ranks[1:]  # [N] each, on the device
        candidates = logits.topk(max(tree.ranks[1:]) + 1, dim=-1).indices  # [D, B, R]
        tokens = candidates[depths - 1, :, ranks].transpose(0, 1)  # [B, N]
        return Proposal(tokens=tokens, tree=tree, draft_probs=None)

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        return None
