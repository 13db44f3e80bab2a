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
    """The draft's output at the root pair: what depth-1 candidates are read from."""

    hidden: torch.Tensor  # [1, H]
    log_probs: torch.Tensor  # [Vd]


class EagleDrafter:
    """Drafts trees with an :class:`~specheads.heads.eagle.EagleHead` (see the module docstring).

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
        self.cache = kv_cache.new_cache()
        self.consumed = 0  # committed pairs in the draft cache
        self._pending: torch.Tensor | None = None  # [1, M, H] fused base features not yet fed

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

    # ------------------------------------------------------------------ keeping the draft cache in step
    def reset(self, state: DecodeState) -> None:
        if state.batch_size != 1:
            raise NotImplementedError("the EAGLE drafter drafts one row at a time")
        self.cache = kv_cache.new_cache()
        self.consumed = 0
        self._pending = None
        self._receive(state)

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        kv_cache.crop(self.cache, self.consumed)  # drop the tree entries; accepted tokens return with true features
        self._receive(state)

    def _receive(self, state: DecodeState) -> None:
        """Queue the base's features of the tokens that just entered its cache."""
        if not state.hidden_states:
            return
        fused = self.head.fuse(state.hidden_states)  # [1, M, H]
        self._pending = fused if self._pending is None else torch.cat([self._pending, fused], dim=1)

    def _feed_pending(self, state: DecodeState) -> _Root | None:
        """Feed the queued pairs (token t + 1, feature t) into the draft cache; the output at the last is the root's."""
        if self._pending is None or self._pending.shape[1] == 0:
            return None
        count, start = self._pending.shape[1], self.consumed
        device = self._pending.device
        input_ids = state.tokens[:, start + 1 : start + 1 + count]  # [1, M]: token t + 1 of pair t
        mask = torch.ones(count, start + count, dtype=torch.bool, device=device).tril(start)[None, None]
        positions = torch.arange(start, start + count, device=device)[None]
        hidden = self.head.step(input_ids, self._pending, positions, mask, self.cache)  # [1, M, H]
        self.consumed += count
        self._pending = None
        root_hidden = hidden[:, -1]
        return _Root(root_hidden, self.head.logits(root_hidden)[0].float().log_softmax(dim=-1))

    # ------------------------------------------------------------------ drafting
    @torch.inference_mode()
    def propose(self, state: DecodeState, request: DraftRequest) -> Proposal | None:
        if state.batch_size != 1:
            raise NotImplementedError("the EAGLE drafter drafts one row at a time")
        root = self._feed_pending(state)
        if root is None or request.max_depth < 1:  # a one-token prompt: no feature before the root yet
            return None
        tree = self._tree(request)
        if isinstance(tree, DynamicTree):
            tokens, buffers = self._dynamic(root, tree, request.max_depth)
        else:
            buffers = tree.truncated(request.max_depth)
            if buffers.num_nodes == 0:
                return None
            tokens = self._static(root, buffers)
        return Proposal(tokens=tokens[None], tree=buffers, draft_probs=None)

    def _expand(
        self,
        nodes: list[int],
        tokens: torch.Tensor,
        parent_hidden: torch.Tensor,
        parents: tuple[int, ...] | list[int],
        entry: dict[int, int],
        depth: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the ``nodes`` of one depth: their tokens ``[n]`` and their parents' draft outputs ``[n, H]``.

        ``entry`` maps every node fed so far to its tree entry in the cache (order of feeding); a node attends to the
        committed pairs, to its fed ancestors (the root is never in ``entry``) and to itself, and its own entry is
        recorded. Returns the nodes' draft outputs ``[n, H]`` and log-probabilities ``[n, Vd]``.
        """
        count, fed = len(nodes), kv_cache.seq_length(self.cache) - self.consumed
        device = parent_hidden.device
        mask = torch.zeros(count, self.consumed + fed + count, dtype=torch.bool, device=device)
        mask[:, : self.consumed] = True
        for row, node in enumerate(nodes):
            ancestor = parents[node]
            while ancestor in entry:
                mask[row, self.consumed + entry[ancestor]] = True
                ancestor = parents[ancestor]
            mask[row, self.consumed + fed + row] = True
            entry[node] = fed + row
        positions = torch.full((1, count), self.consumed - 1 + depth, dtype=torch.long, device=device)
        hidden = self.head.step(tokens[None], parent_hidden[None], positions, mask[None, None], self.cache)[0]
        return hidden, self.head.logits(hidden).float().log_softmax(dim=-1)

    def _static(self, root: _Root, tree: TreeBuffers) -> torch.Tensor:
        """Tokens ``[N]`` of a static tree: node (.., r) is the rank-r candidate of its parent's draft output."""
        size = tree.num_nodes + 1
        tokens = torch.zeros(size, dtype=torch.long, device=root.hidden.device)
        hidden: dict[int, torch.Tensor] = {0: root.hidden[0]}
        log_probs: dict[int, torch.Tensor] = {0: root.log_probs}
        entry: dict[int, int] = {}  # node -> index of its tree entry in the cache
        depths = tree.depths.tolist()
        expanding = [[n for n in range(size) if depths[n] == depth and tree.children[n]] for depth in range(size)]
        for depth in range(1, tree.max_depth + 1):
            for parent in expanding[depth - 1]:
                children = tree.children[parent]
                width = max(tree.ranks[c] for c in children) + 1
                best = self.head.to_target(log_probs[parent].topk(width).indices)
                for child in children:
                    tokens[child] = best[tree.ranks[child]]
            expand = expanding[depth]
            if not expand:
                continue
            parents = torch.stack([hidden[tree.parents[n]] for n in expand])
            out, out_log_probs = self._expand(expand, tokens[expand], parents, tree.parents, entry, depth)
            for row, node in enumerate(expand):
                hidden[node], log_probs[node] = out[row], out_log_probs[row]
        return tokens[1:]

    def _dynamic(self, root: _Root, spec: DynamicTree, max_depth: int) -> tuple[torch.Tensor, TreeBuffers]:
        """EAGLE-2: grow by expanding the ``top_k`` best nodes per depth, keep the ``total_tokens`` best overall."""
        depth_limit = min(spec.depth, max_depth)
        # Candidate nodes: token, parent candidate (-1: the root), depth, cumulative log-probability.
        top = root.log_probs.topk(min(spec.top_k, root.log_probs.shape[0]))
        tokens = self.head.to_target(top.indices).tolist()
        parents, depths, scores = [-1] * len(tokens), [1] * len(tokens), top.values.tolist()
        frontier = list(range(len(tokens)))
        entry: dict[int, int] = {}
        parent_hidden = {-1: root.hidden[0]}
        for depth in range(1, depth_limit):
            inputs = torch.tensor([tokens[n] for n in frontier], device=root.hidden.device)
            hidden_in = torch.stack([parent_hidden[parents[n]] for n in frontier])
            out, out_log_probs = self._expand(frontier, inputs, hidden_in, parents, entry, depth)
            children = []
            for row, node in enumerate(frontier):
                parent_hidden[node] = out[row]
                best = out_log_probs[row].topk(min(spec.top_k, out_log_probs.shape[1]))
                for token, value in zip(self.head.to_target(best.indices).tolist(), best.values.tolist(), strict=True):
                    tokens.append(token)
                    parents.append(node)
                    depths.append(depth + 1)
                    scores.append(scores[node] + value)
                    children.append(len(tokens) - 1)
            frontier = sorted(children, key=lambda n: (-scores[n], n))[: spec.top_k]
        # A parent's score is never below its child's and ties go to the shallower node: the kept set is a tree.
        kept = sorted(range(len(tokens)), key=lambda n: (-scores[n], depths[n], n))[: spec.total_tokens]
        kept.sort(key=lambda n: (depths[n], n))
        index = {node: i + 1 for i, node in enumerate(kept)}
        buffers = tree_from_parents([-1] + [0 if parents[n] < 0 else index[parents[n]] for n in kept])
        drafted = torch.tensor([tokens[n] for n in kept], dtype=torch.long, device=root.hidden.device)
        return drafted, buffers
