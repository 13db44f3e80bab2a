"""EagleDrafter: an EAGLE head drafts a tree by autoregression over features, with its own key/value cache.

The draft's cache holds one entry per committed *pair* (token t + 1, base feature of position t), at position t,
for t = 0 .. L - 2 where L is the number of committed tokens (the last pair holds the root, the last committed
token, with the base's feature of the token before it). Its output at the last pair stands for the feature of the
root and gives the depth-1 candidates. A depth-d node is fed as (its token, its parent's draft output) at position
L - 2 + d and attends to every committed pair and to its own ancestors, exactly as the head was trained
(:meth:`specheads.heads.eagle.EagleHead.forward`).

After the base verified a tree, the draft's tree entries are dropped (:func:`kv_cache.crop` back to the committed
pairs): the accepted tokens are fed again next time, paired with the base's *true* features, which the base has
only now computed. The cache therefore always equals one rebuilt from the committed tokens and the base's features.

Trees: static (a Medusa-style choice list, ``chain-K``, a tree file: node ``(r1, ..., rd)`` is the rank-rd
candidate of its parent's draft distribution) or ``"dynamic"`` (EAGLE-2, Li et al. 2024, arXiv 2406.16858): at every
depth the ``top_k`` most confident nodes (confidence = product of draft probabilities along the path) are expanded by
their ``top_k`` best children; after ``depth`` levels the ``total_tokens`` best nodes are verified. Proposals are
deterministic top-k candidates, so every acceptance rule treats them as one-hot: ``rejection`` stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specheads.inference import kv_cache
from specheads.inference.state import DecodeState, DraftRequest, Proposal
from specheads.inference.trees import DynamicTree, TreeBuffers, resolve_tree, tree_from_parents

DEFAULT_DYNAMIC = DynamicTree(top_k=4, depth=4, total_tokens=8)  # small: what pays on a CPU (see calibrate)


@dataclass
class _Root:
    """The draft's output at each row's root pair: what depth-1 candidates are read from."""

    hidden: torch.Tensor  # [A, H]
    log_probs: torch.Tensor  # [A, Vd]


@dataclass
class _EagleState:
    """One generation's draft state: the draft's cache and, per row of the batch, what it holds.

    Attributes:
        cache: the draft's own key/value cache (committed pairs, then the tree entries of the current proposal).
        consumed: per row, committed pairs in the cache.
        pending: ``[A, M, H]`` fused base features not yet fed (row i holds ``pending_counts[i]``), or None.
        pending_counts: per row, how many of ``pending`` are real.
    """

    cache: kv_cache.SlotCache
    consumed: list[int]
    pending: torch.Tensor | None = None
    pending_counts: list[int] | None = None


class EagleDrafter:
    """Drafts trees with an :class:`~specheads.heads.eagle.EagleHead` (see the module docstring), for every row of a
    batch at once: each row has its own committed pairs, root, and (for dynamic trees) its own tree shape; a static
    tree is the same for every row.

    Args:
        head: an EAGLE head bound to the base (``attach_base``).
        tree: default tree: ``"dynamic"`` (default), ``"auto"`` (the calibrated one), a choice list or tree name.
        dynamic: default parameters of dynamic trees (default: the calibrated ones, else :data:`DEFAULT_DYNAMIC`).
    """

    name = "eagle"

    def __init__(
        self, head: torch.nn.Module, tree: str | list | None = None, dynamic: DynamicTree | None = None
    ) -> None:
        self.head = head.eval()
        self.hidden_state_layers: tuple[int, ...] = tuple(head.hidden_state_layers)
        calibrated = getattr(head, "calibrated_dynamic", None)
        self.dynamic = dynamic or (DynamicTree(**calibrated) if calibrated else DEFAULT_DYNAMIC)
        calibrated_tree = getattr(head, "calibrated_tree", None)
        self.auto_tree = resolve_tree(calibrated_tree) if calibrated_tree is not None else None
        self.default_tree = self.resolve("dynamic" if tree is None else tree)

    def resolve(self, tree: str | list | DynamicTree) -> TreeBuffers | DynamicTree:
        """A tree spec for this head: ``"dynamic"`` (the calibrated parameters), ``"dynamic-K-D-N"`` (top_k K, depth
        D, total_tokens N), a :class:`DynamicTree`, ``"auto"`` (the calibrated static tree), or a static tree."""
        if isinstance(tree, DynamicTree):
            return tree
        if isinstance(tree, str) and DynamicTree.parse(tree) is not None:
            return DynamicTree.parse(tree)
        if tree == "dynamic":
            return self.dynamic
        if tree == "auto":
            if self.auto_tree is None:
                return self.dynamic  # calibrate writes both; without it the dynamic default is the safe choice
            return self.auto_tree
        return resolve_tree(tree)

    def _tree(self, request: DraftRequest) -> TreeBuffers | DynamicTree:
        if request.tree is not None:
            return request.tree
        if request.num_speculative_tokens is not None:
            return resolve_tree(f"chain-{request.num_speculative_tokens}")
        return self.default_tree

    def check_request(self, request: DraftRequest) -> None:
        if request.tree is None and request.num_speculative_tokens is not None:
            tokens = request.num_speculative_tokens
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
                raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {tokens!r}")
        tree = self._tree(request)
        if isinstance(tree, TreeBuffers) and tree.num_nodes:
            widest = max(tree.ranks[1:]) + 1
            if widest > self.head.config.draft_vocab_size:
                raise ValueError(
                    f"the tree asks for rank {widest - 1} but the draft vocabulary has "
                    f"{self.head.config.draft_vocab_size} tokens"
                )

    def max_nodes(self, request: DraftRequest) -> int:
        tree = self._tree(request)
        return tree.total_tokens if isinstance(tree, DynamicTree) else tree.num_nodes

    def _max_entries(self, request: DraftRequest | None) -> int:
        tree = self.default_tree if request is None else self._tree(request)
        return tree.top_k * tree.depth if isinstance(tree, DynamicTree) else tree.num_nodes

    # ------------------------------------------------------------------ keeping the draft cache in step
    def reset(self, state: DecodeState) -> None:
        capacity = state.tokens.shape[1] + max(self._max_entries(None), 64) + 2
        state.draft = _EagleState(
            kv_cache.new_cache(state.batch_size, capacity, state.tokens.device), [0] * state.batch_size
        )
        self._receive(state)

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        draft: _EagleState = state.draft
        kv_cache.crop(draft.cache, draft.consumed)  # drop the tree entries; accepted tokens return with true features
        self._receive(state)

    def keep_rows(self, state: DecodeState, keep: list[int]) -> None:
        draft: _EagleState = state.draft
        kv_cache.keep_rows(draft.cache, keep)
        draft.consumed = [draft.consumed[i] for i in keep]
        if draft.pending is not None:
            draft.pending = draft.pending[torch.tensor(keep, device=draft.pending.device)]
            draft.pending_counts = [draft.pending_counts[i] for i in keep]

    def _receive(self, state: DecodeState) -> None:
        """Queue the base's features of the tokens that just entered its cache (ragged: ``state.hidden_counts``)."""
        if not state.hidden_states:
            return
        draft: _EagleState = state.draft
        fused = self.head.fuse(state.hidden_states)  # [A, M, H]
        counts = list(state.hidden_counts)
        if draft.pending is None:
            draft.pending, draft.pending_counts = fused, counts
            return
        old, old_counts = draft.pending, draft.pending_counts
        total = [a + b for a, b in zip(old_counts, counts, strict=True)]
        merged = fused.new_zeros(fused.shape[0], max(total), fused.shape[2])
        for i, (a, b) in enumerate(zip(old_counts, counts, strict=True)):
            merged[i, :a] = old[i, :a]
            merged[i, a : a + b] = fused[i, :b]
        draft.pending, draft.pending_counts = merged, total

    def _feed_pending(self, state: DecodeState) -> tuple[_Root, list[bool]] | None:
        """Feed the queued pairs (token t + 1, feature t) of every row; the output at each row's last is its root's.

        Returns the roots and, per row, whether it has one (a one-token prompt has no feature before its root yet).
        """
        draft: _EagleState = state.draft
        if draft.pending is None or max(draft.pending_counts) == 0:
            return None
        counts, width = draft.pending_counts, max(draft.pending_counts)
        device = draft.pending.device
        input_ids = torch.zeros(len(counts), width, dtype=torch.long, device=device)
        for i, (row, count) in enumerate(zip(state.rows, counts, strict=True)):
            start = draft.consumed[i]
            input_ids[i, :count] = state.tokens[row, start + 1 : start + 1 + count]  # token t + 1 of pair t
        lengths = kv_cache.row_lengths(draft.cache)
        inner = [kv_cache.causal(c) for c in counts]
        mask = kv_cache.step_mask(lengths, inner, width, device)
        positions = torch.tensor(draft.consumed, device=device)[:, None] + torch.arange(width, device=device)[None]
        hidden = self.head.step(input_ids, draft.pending[:, :width], positions, mask, draft.cache)  # [A, W, H]
        kv_cache.advance(draft.cache, counts)
        draft.consumed = [c + n for c, n in zip(draft.consumed, counts, strict=True)]
        draft.pending, draft.pending_counts = None, None
        last = torch.tensor([max(c - 1, 0) for c in counts], device=device)
        root_hidden = hidden[torch.arange(len(counts), device=device), last]  # [A, H]
        log_probs = self.head.logits(root_hidden).float().log_softmax(dim=-1)
        return _Root(root_hidden, log_probs), [c > 0 for c in counts]

    # ------------------------------------------------------------------ drafting
    @torch.inference_mode()
    def propose(self, state: DecodeState, request: DraftRequest) -> Proposal | list[Proposal | None] | None:
        fed = self._feed_pending(state)
        if fed is None or request.max_depth < 1:  # no feature before any root yet
            return None
        root, has_root = fed
        tree = self._tree(request)
        if isinstance(tree, DynamicTree):
            drafted = self._dynamic(state.draft, root, tree, request.max_depth)
            proposals = [Proposal(tokens[None], buffers, None) for tokens, buffers in drafted]
        else:
            buffers = tree.truncated(request.max_depth)
            if buffers.num_nodes == 0:
                return None
            tokens = self._static(state.draft, root, buffers)  # [A, N]
            if all(has_root):
                return Proposal(tokens=tokens, tree=buffers, draft_probs=None)
            proposals = [Proposal(tokens[i : i + 1], buffers, None) for i in range(tokens.shape[0])]
        return [p if ok else None for p, ok in zip(proposals, has_root, strict=True)]

    def _expand(
        self,
        draft: _EagleState,
        nodes: list[list[int]],
        tokens: torch.Tensor,
        parent_hidden: torch.Tensor,
        parents: list[list[int]] | list[tuple[int, ...]],
        entries: list[dict[int, int]],
        depth: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the ``nodes`` of one depth, the same number for every row: tokens ``[A, n]`` and the parents' draft
        outputs ``[A, n, H]``.

        ``entries[i]`` maps every node of row i fed so far to its tree entry (order of feeding, after the row's
        committed pairs); a node attends to its row's committed pairs, its fed ancestors (the root is never in
        ``entries``) and itself, and its own entry is recorded. Returns draft outputs ``[A, n, H]`` and
        log-probabilities ``[A, n, Vd]``.
        """
        batch, count = tokens.shape
        device = parent_hidden.device
        lengths = kv_cache.row_lengths(draft.cache)  # consumed + tree entries fed so far, per row
        width = max(lengths) + count
        mask = torch.zeros(batch, count, width, dtype=torch.bool, device=device)
        for i in range(batch):
            consumed, fed, entry = draft.consumed[i], lengths[i] - draft.consumed[i], entries[i]
            mask[i, :, :consumed] = True
            for row, node in enumerate(nodes[i]):
                ancestor = parents[i][node]
                while ancestor in entry:
                    mask[i, row, consumed + entry[ancestor]] = True
                    ancestor = parents[i][ancestor]
                mask[i, row, lengths[i] + row] = True
                entry[node] = fed + row
        positions = (torch.tensor(draft.consumed, device=device) - 1 + depth)[:, None].expand(batch, count)
        hidden = self.head.step(tokens, parent_hidden, positions, mask[:, None], draft.cache)
        kv_cache.advance(draft.cache, [count] * batch)
        return hidden, self.head.logits(hidden).float().log_softmax(dim=-1)

    def _static(self, draft: _EagleState, root: _Root, tree: TreeBuffers) -> torch.Tensor:
        """Tokens ``[A, N]`` of a static tree: node (.., r) is the rank-r candidate of its parent's draft output."""
        batch, size = root.hidden.shape[0], tree.num_nodes + 1
        tokens = torch.zeros(batch, size, dtype=torch.long, device=root.hidden.device)
        hidden: dict[int, torch.Tensor] = {0: root.hidden}  # node -> [A, H]
        log_probs: dict[int, torch.Tensor] = {0: root.log_probs}  # node -> [A, Vd]
        entries: list[dict[int, int]] = [{} for _ in range(batch)]
        depths = tree.depths.tolist()
        expanding = [[n for n in range(size) if depths[n] == depth and tree.children[n]] for depth in range(size)]
        for depth in range(1, tree.max_depth + 1):
            for parent in expanding[depth - 1]:
                children = tree.children[parent]
                width = max(tree.ranks[c] for c in children) + 1
                best = self.head.to_target(log_probs[parent].topk(width, dim=-1).indices)  # [A, width]
                for child in children:
                    tokens[:, child] = best[:, tree.ranks[child]]
            expand = expanding[depth]
            if not expand:
                continue
            parents = torch.stack([hidden[tree.parents[n]] for n in expand], dim=1)  # [A, n, H]
            out, out_log_probs = self._expand(
                draft, [expand] * batch, tokens[:, expand], parents, [tree.parents] * batch, entries, depth
            )
            for column, node in enumerate(expand):
                hidden[node], log_probs[node] = out[:, column], out_log_probs[:, column]
        return tokens[:, 1:]

    def _dynamic(
        self, draft: _EagleState, root: _Root, spec: DynamicTree, max_depth: int
    ) -> list[tuple[torch.Tensor, TreeBuffers]]:
        """EAGLE-2 per row: expand the ``top_k`` best nodes per depth, keep the ``total_tokens`` best overall.

        Every row expands the same number of nodes per depth, so one draft forward per depth serves the batch.
        """
        batch, device = root.hidden.shape[0], root.hidden.device
        depth_limit = min(spec.depth, max_depth)
        width = min(spec.top_k, root.log_probs.shape[1])
        top = root.log_probs.topk(width, dim=-1)
        first = self.head.to_target(top.indices).tolist()
        # Candidate nodes per row: token, parent candidate (-1: the root), depth, cumulative log-probability.
        tokens = [list(row) for row in first]
        parents = [[-1] * width for _ in range(batch)]
        depths = [[1] * width for _ in range(batch)]
        scores = [list(row) for row in top.values.tolist()]
        frontier = [list(range(width)) for _ in range(batch)]
        entries: list[dict[int, int]] = [{} for _ in range(batch)]
        outputs: list[dict[int, torch.Tensor]] = [{-1: root.hidden[i]} for i in range(batch)]
        for depth in range(1, depth_limit):
            inputs = torch.tensor([[tokens[i][n] for n in frontier[i]] for i in range(batch)], device=device)
            hidden_in = torch.stack(
                [torch.stack([outputs[i][parents[i][n]] for n in frontier[i]]) for i in range(batch)]
            )
            out, out_log_probs = self._expand(draft, frontier, inputs, hidden_in, parents, entries, depth)
            best = out_log_probs.topk(min(spec.top_k, out_log_probs.shape[-1]), dim=-1)
            best_tokens = self.head.to_target(best.indices).tolist()  # [A][n][k]
            best_values = best.values.tolist()
            for i in range(batch):
                children = []
                for column, node in enumerate(frontier[i]):
                    outputs[i][node] = out[i, column]
                    for token, value in zip(best_tokens[i][column], best_values[i][column], strict=True):
                        tokens[i].append(token)
                        parents[i].append(node)
                        depths[i].append(depth + 1)
                        scores[i].append(scores[i][node] + value)
                        children.append(len(tokens[i]) - 1)
                frontier[i] = sorted(children, key=lambda n, i=i: (-scores[i][n], n))[: spec.top_k]
        drafted = []
        for i in range(batch):
            # A parent's score is never below its child's and ties go to the shallower node: the kept set is a tree.
            kept = sorted(range(len(tokens[i])), key=lambda n, i=i: (-scores[i][n], depths[i][n], n))
            kept = sorted(kept[: spec.total_tokens], key=lambda n, i=i: (depths[i][n], n))
            index = {node: k + 1 for k, node in enumerate(kept)}
            buffers = tree_from_parents([-1] + [0 if parents[i][n] < 0 else index[parents[i][n]] for n in kept])
            drafted.append((torch.tensor([tokens[i][n] for n in kept], dtype=torch.long, device=device), buffers))
        return drafted
