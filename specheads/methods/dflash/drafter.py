"""DFlashDrafter: a block drafter proposes a chain or a tree from **one** forward of its layers per step.

The drafter keeps, per row of the batch and per draft layer, the context keys and values of every token in the
base's cache (``k_norm(k_proj(ctx))`` and ``v_proj(ctx)`` at the token's position, ``ctx`` the fused base features
the verify forward returned). Only committed tokens ever enter the base's cache, so nothing is rolled back: the
context always equals one rebuilt from the committed tokens. The block ``[root, mask, ...]`` sits at positions
``L - 1 ..`` (L committed tokens; the root is the last, whose features the base has not computed yet), attends to
the row's context and to itself, and is never kept.

Draft depth d reads slot d (DFlash) or d - 1 (DSpark) of the block. Proposals:

* ``chain-K`` at T=0: the argmax of every depth (DSpark: left to right, each depth's Markov bias from the token
  drafted before it); deterministic, verified as one-hot.
* ``chain-K`` at T>0: each depth's token sampled from its distribution (warped with the base's sampling settings;
  DSpark left to right through the Markov head from the sampled tokens), with ``draft_probs`` those
  distributions: rejection sampling is then lossless.
* a static tree (``binary-7``, a tree file): node (.., r) is the rank-r token of its depth's distribution (DSpark:
  given its parent's token).
* ``tree="ddtree"`` / ``"ddtree-N"`` (DDTree, arXiv 2604.12989): best-first over the per-depth log-probabilities
  within N nodes: pop the best path, push its next sibling and its first child; for DSpark a node's children are
  ranked by the Markov-biased distribution given its own token, which makes a path's score its true draft
  likelihood. Trees are deterministic and verified as one-hot proposals (never with the marginals as q: a top-k
  token was not drawn from them).
"""

from __future__ import annotations

import heapq
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specheads.methods.api_decode import (
    DecodeState,
    Drafter,
    DraftRequest,
    FeatureQueue,
    Proposal,
    SlotCache,
    TreeBuffers,
    advance,
    chain_proposal,
    check_speculative_tokens,
    keep_rows,
    new_cache,
    probabilities,
    requested_tree,
    resolve_tree,
    sample,
    to_device,
    tree_from_parents,
    tree_step_mask,
)
from specheads.methods.dflash.heads import DFlashHead
from specheads.methods.dflash.trees import TREES, BlockTree

DEFAULT_BUDGET = 16  # DDTree nodes when nothing is calibrated


@dataclass
class _BlockState:
    """One generation's draft state.

    Attributes:
        cache: per draft layer, the context keys and values of every row (one slot per token in the base's cache).
        consumed: per row, context slots held.
        queue: fused base features not yet turned into context.
    """

    cache: SlotCache
    consumed: list[int]
    queue: FeatureQueue = field(default_factory=FeatureQueue)


@dataclass
class _Block:
    """One block forward for the rows: per draft depth, logits before any Markov bias, and the roots."""

    logits: torch.Tensor  # [A, D, V] float
    roots: torch.Tensor  # [A] the anchor tokens


class DFlashDrafter(Drafter):
    """Drafts chains and trees with a :class:`~specheads.methods.dflash.heads.DFlashHead` (see the module
    docstring), for every row of a batch in one block forward.

    Args:
        head: a block drafter bound to the base (``attach_base``).
        tree: default tree: ``"ddtree"`` (default: the calibrated budget, else :data:`DEFAULT_BUDGET` nodes),
            ``"ddtree-N"``, ``"chain-K"`` or a static tree.
        budget: the DDTree node budget ``"ddtree"`` means (default: the calibrated one).
    """

    name = "dflash"

    def __init__(self, head: DFlashHead, tree: str | list | None = None, budget: int | None = None) -> None:
        self.head = head.eval()
        self.name = head.config.variant
        self.hidden_state_layers: tuple[int, ...] = tuple(head.hidden_state_layers)
        calibration = getattr(head, "calibration", None)
        calibrated = TREES.calibrated(calibration)
        self.budget = BlockTree(budget or (calibrated.total_tokens if calibrated else DEFAULT_BUDGET)).total_tokens
        self.default_tree = self.resolve("ddtree" if tree is None else tree)

    @property
    def depth(self) -> int:
        """Tokens one block drafts."""
        return self.head.config.num_drafts

    def resolve(self, tree: str | list | BlockTree) -> TreeBuffers | BlockTree:
        """``"ddtree"`` (the default budget), ``"ddtree-N"``, ``"auto"`` (the calibrated budget), a
        :class:`BlockTree`, or a static tree (``chain-K``, a tree name or file, a choice list; another method's grown
        tree is refused there, naming who grows it)."""
        if isinstance(tree, BlockTree):
            return tree
        if tree in ("ddtree", "auto"):
            return BlockTree(self.budget)
        if isinstance(tree, str) and BlockTree.parse(tree) is not None:
            return BlockTree.parse(tree)
        return resolve_tree(tree)

    def _tree(self, request: DraftRequest) -> TreeBuffers | BlockTree:
        return requested_tree(request, self.default_tree)

    def check_request(self, request: DraftRequest) -> None:
        check_speculative_tokens(request)
        tree = self._tree(request)
        if isinstance(tree, TreeBuffers) and tree.max_depth > self.depth:
            raise ValueError(
                f"the tree is {tree.max_depth} deep but one block of these heads drafts {self.depth} tokens "
                f"(block_size {self.head.config.block_size}, {self.head.config.variant})"
            )
        if isinstance(tree, TreeBuffers) and tree.num_nodes and max(tree.ranks[1:]) >= self.head.config.vocab_size:
            raise ValueError("the tree asks for a rank beyond the vocabulary")

    def max_nodes(self, request: DraftRequest) -> int:
        return self._tree(request).num_nodes

    def gives_draft_probs(self, request: DraftRequest) -> bool:
        """Sampled chains (T > 0) carry their distributions; trees and greedy chains are one-hot."""
        tree = self._tree(request)
        return not request.sampling.greedy and isinstance(tree, TreeBuffers) and tree.is_chain

    # ------------------------------------------------------------------ keeping the context in step
    def reset(self, state: DecodeState) -> None:
        capacity = state.tokens.shape[1] + self.head.config.block_size + 2
        state.draft = _BlockState(new_cache(state.batch_size, capacity, state.tokens.device), [0] * state.batch_size)
        self._receive(state)

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        self._receive(state)  # the block was never committed to the draft's cache: nothing to roll back

    def keep_rows(self, state: DecodeState, keep: list[int]) -> None:
        draft: _BlockState = state.draft
        keep_rows(draft.cache, keep)
        draft.consumed = [draft.consumed[i] for i in keep]
        draft.queue.keep_rows(keep)

    def _receive(self, state: DecodeState) -> None:
        """Queue the context of the tokens that just entered the base's cache (ragged: ``state.hidden_counts``)."""
        if state.hidden_states:
            state.draft.queue.push(self.head.fuse(state.hidden_states), list(state.hidden_counts))

    def _feed_context(self, draft: _BlockState) -> None:
        """Append the queued context to every draft layer's cache, at each token's own position."""
        if draft.queue.empty:
            return
        context, counts = draft.queue.take()
        device = context.device
        consumed = to_device(draft.consumed, device)
        positions = consumed[:, None] + torch.arange(context.shape[1], device=device)[None]
        for index, keys_values in enumerate(self.head.context_keys_values(context, positions)):
            draft.cache.update(*keys_values, index)
        advance(draft.cache, counts)
        draft.consumed = [c + n for c, n in zip(draft.consumed, counts, strict=True)]

    def _block(self, state: DecodeState, depths: int | None = None) -> _Block:
        """One block forward for every row: ``[root, mask, ...]`` after each row's context; logits of the first
        ``depths`` draft depths (default all: the lm_head over the whole vocabulary is a large part of a block)."""
        draft: _BlockState = state.draft
        self._feed_context(draft)
        device, size = state.tokens.device, self.head.config.block_size
        roots_host = [state.host_tokens[row][-1] for row in state.rows]
        meta = to_device([roots_host, draft.consumed], device)
        roots, consumed = meta[0], meta[1]
        positions = consumed[:, None] + torch.arange(size, device=device)[None]  # the root sits at L - 1
        mask = None  # rows with contexts of one length see every key: no mask
        if len(set(draft.consumed)) > 1:
            block = torch.ones(1, size, size, dtype=torch.bool, device=device)  # bidirectional inside the block
            mask = tree_step_mask(consumed, max(draft.consumed), block)
        hidden = self.head.blocks(self.head.block_inputs(roots), positions, mask, cache=draft.cache)
        first = self.head.config.first_slot
        hidden = hidden[:, first : first + (self.depth if depths is None else depths)]
        lm_head = self.head.lm_head()
        logits = lm_head(hidden.to(lm_head.weight.dtype)).float()  # [A, D, V] before any Markov bias
        return _Block(logits, roots)

    def _with_bias(self, logits: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """Depth logits plus the Markov bias of each position's previous token (DFlash: unchanged)."""
        bias = self.head.markov_bias(previous)
        return logits if bias is None else logits + bias.float()

    # ------------------------------------------------------------------ drafting
    @torch.inference_mode()
    def propose(self, state: DecodeState, request: DraftRequest) -> Proposal | list[Proposal | None] | None:
        if request.max_depth < 1:
            return None
        tree = self._tree(request)
        limits = list(request.max_depths or (request.max_depth,) * len(state.rows))
        if isinstance(tree, BlockTree):
            block = self._block(state, min(max(limits), self.depth))
            return [self._ddtree(block, i, tree.total_tokens, min(limits[i], self.depth))
                    for i in range(len(state.rows))]  # fmt: skip
        buffers = tree.truncated(min(request.max_depth, self.depth))
        if buffers.num_nodes == 0:
            return None
        block = self._block(state, buffers.max_depth)
        if buffers.is_chain and not request.sampling.greedy:
            return self._sampled_chains(state, block, request, buffers.num_nodes, limits)
        return Proposal(tokens=self._static(block, buffers), tree=buffers, draft_probs=None)

    def _static(self, block: _Block, tree: TreeBuffers) -> torch.Tensor:
        """Tokens ``[A, N]`` of a static tree: node (.., r) is the rank-r token of its depth (given its parent's
        token, for DSpark), level by level."""
        batch = block.logits.shape[0]
        tokens = torch.zeros(batch, tree.num_nodes + 1, dtype=torch.long, device=block.logits.device)
        tokens[:, 0] = block.roots
        width = max(tree.ranks[1:]) + 1
        if self.head.markov_head is None:  # every node of a depth shares its depth's distribution
            top = block.logits.topk(width, dim=-1).indices  # [A, D, width]
            levels = torch.tensor(tree.levels[1:], device=tokens.device) - 1
            ranks = torch.tensor(tree.ranks[1:], device=tokens.device)
            tokens[:, 1:] = top[:, levels, ranks]
            return tokens[:, 1:]
        for depth in range(1, tree.max_depth + 1):
            nodes = [n for n in range(1, len(tree.parents)) if tree.levels[n] == depth]
            index = torch.tensor(nodes, device=tokens.device)
            parents = torch.tensor([tree.parents[n] for n in nodes], device=tokens.device)
            ranks = torch.tensor([tree.ranks[n] for n in nodes], device=tokens.device)
            logits = self._with_bias(block.logits[:, depth - 1, None], tokens[:, parents])  # [A, n, V]
            top = logits.topk(width, dim=-1).indices
            tokens[:, index] = top.gather(2, ranks[None, :, None].expand(batch, -1, 1)).squeeze(-1)
        return tokens[:, 1:]

    def _sampled_chains(
        self, state: DecodeState, block: _Block, request: DraftRequest, length: int, limits: list[int]
    ) -> list[Proposal | None]:
        """Per row, a chain sampled depth by depth from its (Markov-biased) distributions, with those as q.

        A row draws exactly ``min(length, its limit)`` tokens from its own generator, so that its random stream is
        the same alone or in any batch.
        """
        proposals: list[Proposal | None] = []
        for i, row in enumerate(state.rows):
            count = min(length, limits[i])
            if count < 1:
                proposals.append(None)
                continue
            previous = block.roots[i : i + 1]
            drafts, qs = [], []
            for depth in range(count):
                q = probabilities(self._with_bias(block.logits[i : i + 1, depth], previous), request.sampling)
                previous = sample(q, state.generators[row])  # [1]
                drafts.append(previous)
                qs.append(q)
            proposals.append(chain_proposal(torch.stack(drafts, dim=1), torch.stack(qs, dim=1)))
        return proposals

    def _ddtree(self, block: _Block, row: int, budget: int, depth_limit: int) -> Proposal | None:
        """One row's DDTree proposal (see :func:`ddtree`)."""
        if depth_limit < 1:
            return None
        logits = block.logits[row, :depth_limit]  # [D, V]
        k = min(budget, logits.shape[-1])
        if self.head.markov_head is None:
            top = logits.log_softmax(dim=-1).topk(k, dim=-1)
            values, indices = top.values.tolist(), top.indices.tolist()

            def children(depth: int, token: int) -> tuple[list[float], list[int]]:
                return values[depth], indices[depth]

        else:
            cache: dict[tuple[int, int], tuple[list[float], list[int]]] = {}

            def children(depth: int, token: int) -> tuple[list[float], list[int]]:
                key = (depth, token)
                if key not in cache:
                    previous = torch.tensor([token], device=logits.device)
                    top = self._with_bias(logits[depth : depth + 1], previous).log_softmax(dim=-1).topk(k, dim=-1)
                    cache[key] = (top.values[0].tolist(), top.indices[0].tolist())
                return cache[key]

        parents, tokens = ddtree(int(block.roots[row]), depth_limit, budget, children)
        if not tokens:
            return None
        device = block.logits.device
        return Proposal(torch.tensor([tokens], device=device), tree_from_parents([-1, *parents]), None)


def ddtree(
    root: int, depth: int, budget: int, children: Callable[[int, int], tuple[list[float], list[int]]]
) -> tuple[list[int], list[int]]:
    """DDTree's best-first builder over per-depth candidate lists.

    Args:
        root: the root's token (depth 0).
        depth: the deepest depth.
        budget: nodes to keep (the root not counted).
        children: ``children(d, token) -> (log_probs, tokens)``: the ranked candidates at depth ``d + 1`` (0-based
            ``d``) below a node with ``token`` at depth ``d`` (descending log-probabilities).

    Returns:
        ``(parents, tokens)`` in the order the nodes were chosen: entry i is node i + 1 (node 0 is the root) and
        ``parents[i]`` its parent's node index, always <= i (a parent comes before its children).
    """
    parents: list[int] = []
    tokens: list[int] = []
    heap: list[tuple[float, int, int, int, int]] = []  # (-score, tie, parent node, depth - 1, rank)
    counter = 0
    values, _ = children(0, root)
    if values:
        heap.append((-values[0], counter, 0, 0, 0))
    node_tokens = [root]
    node_depths = [0]
    while heap and len(tokens) < budget:
        negative, _, parent, level, rank = heapq.heappop(heap)
        score = -negative
        values, candidates = children(level, node_tokens[parent])
        token = candidates[rank]
        parents.append(parent)
        tokens.append(token)
        node = len(node_tokens)
        node_tokens.append(token)
        node_depths.append(level + 1)
        if rank + 1 < len(values):  # the next sibling: same parent, the next rank
            counter += 1
            heapq.heappush(heap, (-(score - values[rank] + values[rank + 1]), counter, parent, level, rank + 1))
        if level + 1 < depth:  # the first child
            child_values, _ = children(level + 1, token)
            if child_values:
                counter += 1
                heapq.heappush(heap, (-(score + child_values[0]), counter, node, level + 1, 0))
    return parents, tokens


def measure_draft_cost(head: DFlashHead, prefix_len: int = 256, repeats: int = 10) -> float:
    """Median ms of one block forward over a ``prefix_len``-token context, with its logits: what a block drafter
    pays once per step, whatever the depth (calibration's draft cost)."""
    device = head.fc.weight.device
    dtype = head.fc.weight.dtype
    cache = new_cache(1, prefix_len + head.config.block_size + 2, device)
    context = torch.zeros(1, prefix_len, head.config.hidden_size, device=device, dtype=dtype)
    positions = torch.arange(prefix_len, device=device)[None]
    for index, keys_values in enumerate(head.context_keys_values(context, positions)):
        cache.update(*keys_values, index)
    advance(cache, [prefix_len])
    block = head.block_inputs(torch.zeros(1, dtype=torch.long, device=device))
    block_positions = prefix_len + torch.arange(head.config.block_size, device=device)[None]
    samples = []
    for _ in range(repeats + 2):
        start = time.perf_counter()
        hidden = head.blocks(block, block_positions, None, cache=cache)
        head.lm_head()(hidden.to(head.lm_head().weight.dtype)).log_softmax(dim=-1).topk(4)
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append(1000 * (time.perf_counter() - start))
    return statistics.median(samples[2:])
