"""From drafters' proposals to one verify forward's inputs: the decode loop's tree shaping.

A drafter drafts for the deepest row of the batch; :func:`for_rows` cuts its answer to each row's own depth limit
(:func:`truncated`). :func:`pack_step` then lays every active row's root and tree into one ``[B, W]`` input with its
positions and its 4D tree mask (:func:`tree_shape` gives one proposal's mask and depths), and :func:`stacked_rows`
pads the rows' prefill hidden states into one batch. The decoder (:mod:`specheads.inference.decoder`) calls these;
they hold no state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specheads.inference import kv_cache
from specheads.inference.state import DecodeState, Proposal, rows_of
from specheads.inference.trees import TreeBuffers, tree_from_choices

_ROOT_ONLY = tree_from_choices(())  # the "tree" of a row that drafted nothing: its root alone


@dataclass
class StepInputs:
    """One verify forward's inputs for the active rows (see :func:`pack_step`).

    Attributes:
        trees: each row's tree (None: the row drafted nothing and feeds its root alone).
        cached: each row's committed slots in the base cache before the step.
        tokens: ``[B, W]`` each row's root then its tree's tokens, padded.
        positions: ``[B, W]`` position ids (cached length + node depth).
        mask: ``[B, 1, W, max(cached) + W]`` tree attention, or None (one row, a chain: the causal mask).
        draft_probs: each row's ``[N, V]`` draft distributions, or None (deterministic drafts).
    """

    trees: list[TreeBuffers | None]
    cached: list[int]
    tokens: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None
    draft_probs: list[torch.Tensor | None]


def pack_step(state: DecodeState, proposals: list[Proposal | None] | Proposal) -> StepInputs:
    """Every active row's root and tree in one ``[B, W]`` input, its positions and its 4D mask.

    The host knows the roots, lengths and tree shapes; they go to the device in one copy, and the mask is built
    there by broadcasting (:func:`kv_cache.tree_step_mask`). A tree's own mask and depths come from the proposal
    when the drafter built them on the device (a grown tree), else from the tree's device copy, uploaded once
    per tree (:meth:`TreeBuffers.on`).
    """
    rows, device = state.rows, state.tokens.device
    cached = [state.lengths[row] - 1 for row in rows]  # slots in the base cache; the root is fed now
    meta = kv_cache.to_device([[state.host_tokens[row][-1] for row in rows], cached], device)
    roots, lengths = meta[0], meta[1]
    if isinstance(proposals, Proposal):  # one tree for every row: no per-row work at all
        tree = proposals.tree
        trees: list[TreeBuffers | None] = [tree] * len(rows)
        tree_mask, depths = tree_shape(proposals, tree, device)
        tokens = torch.cat([roots[:, None], proposals.tokens.to(device)], dim=1)
        positions = lengths[:, None] + depths
        probs = proposals.draft_probs
        draft_probs = [None if probs is None else probs[i] for i in range(len(rows))]
        block = None if tree.is_chain else tree_mask
    elif all(p is None or p.tokens.shape[1] == 0 for p in proposals):  # plain decoding: each row feeds its root
        trees, draft_probs, block = [None] * len(rows), [None] * len(rows), None
        tokens, positions = roots[:, None], lengths[:, None]
        if len(rows) > 1:
            block = torch.ones(1, 1, 1, dtype=torch.bool, device=device)
    else:
        trees = [None if p is None or p.tokens.shape[1] == 0 else p.tree for p in proposals]
        width = max(1 if tree is None else tree.num_nodes + 1 for tree in trees)
        tokens = torch.zeros(len(rows), width, dtype=torch.long, device=device)
        tokens[:, 0] = roots
        for i, (tree, proposal) in enumerate(zip(trees, proposals, strict=True)):
            if tree is not None:
                tokens[i, 1 : tree.num_nodes + 1] = proposal.tokens[0]
        shapes = [tree_shape(p, tree, device, width) for p, tree in zip(proposals, trees, strict=True)]
        positions = lengths[:, None] + torch.cat([depths for _, depths in shapes])
        draft_probs = [None if p is None or p.draft_probs is None else p.draft_probs[0] for p in proposals]
        chains = all(tree is None or tree.is_chain for tree in trees) and len(rows) == 1
        block = None if chains else torch.cat([tree_mask for tree_mask, _ in shapes])
    if len(rows) == 1 and block is None:
        mask = None  # one row and a chain: the model's own causal mask over the cache is the same
    else:
        if block is None:
            block = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool, device=device).tril()[None]
        mask = kv_cache.tree_step_mask(lengths, max(cached), block)
    return StepInputs(trees, cached, tokens, positions, mask, draft_probs)


def for_rows(
    proposal: Proposal | list[Proposal | None] | None, limits: list[int], batch: int
) -> Proposal | list[Proposal | None]:
    """A drafter's answer for the step: one proposal for every row when its tree fits every row's depth limit,
    else one proposal (``[1, N]`` tokens, cut to the row's limit) or None per row."""
    if isinstance(proposal, Proposal) and proposal.tokens.shape[1] and proposal.tree.max_depth <= min(limits):
        if proposal.tokens.shape[0] != batch:
            raise RuntimeError(f"the drafter proposed {proposal.tokens.shape[0]} rows, the batch has {batch}")
        return proposal
    return [truncated(p, limit) for p, limit in zip(rows_of(proposal, batch), limits, strict=True)]


def truncated(proposal: Proposal | None, max_depth: int) -> Proposal | None:
    """A row's proposal cut to its own depth limit (the drafter drafted for the deepest row of the batch).

    Trees list their nodes by depth, so the nodes at depth <= ``max_depth`` are the first ones (and a device mask's
    first rows and columns are the cut tree's).
    """
    if proposal is None or proposal.tree.max_depth <= max_depth:
        return proposal
    tree = proposal.tree.truncated(max_depth)
    if tree.num_nodes == 0:
        return None
    count = tree.num_nodes
    probs = None if proposal.draft_probs is None else proposal.draft_probs[:, :count]
    if proposal.attention_mask is None:
        return Proposal(proposal.tokens[:, :count], tree, probs)
    mask, depths = proposal.attention_mask[:, : count + 1, : count + 1], proposal.depths[:, : count + 1]
    return Proposal(proposal.tokens[:, :count], tree, probs, mask, depths)


def stacked_rows(rows: tuple[torch.Tensor | None, ...], width: int) -> torch.Tensor:
    """``[B, width, H]``: each row's ``[1, n, H]`` hidden states (None: n = 0), padded with zeros after its n."""
    like = next(row for row in rows if row is not None)
    present = [like.new_zeros(1, 0, like.shape[-1]) if row is None else row for row in rows]
    return torch.cat([torch.nn.functional.pad(row, (0, 0, 0, width - row.shape[1])) for row in present])


def tree_shape(
    proposal: Proposal | None, tree: TreeBuffers | None, device: torch.device, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A proposal's tree attention ``[R, W, W]`` and depths ``[R, W]`` on ``device``, padded to ``width`` nodes
    (padding sees only itself, at depth 0): the proposal's own device tensors (R: its rows) when it has them, else
    the tree's cached device copy (R = 1, broadcast; ``tree`` None: the root alone)."""
    if tree is None or proposal is None or proposal.attention_mask is None:
        buffers = (_ROOT_ONLY if tree is None else tree).on(device, width)
        return buffers.attention_mask[None], buffers.depths[None]
    mask, depths = proposal.attention_mask.to(device), proposal.depths.to(device)
    size = mask.shape[-1]
    if width is not None and width > size:
        padding = width - size
        eye = torch.eye(width, dtype=torch.bool, device=device)
        mask = torch.nn.functional.pad(mask, (0, padding, 0, padding)) | eye
        depths = torch.nn.functional.pad(depths, (0, padding))
    return mask, depths
