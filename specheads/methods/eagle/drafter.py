"""EagleDrafter: an EAGLE head drafts a tree by autoregression over features, with its own key/value cache.

The draft's cache holds one entry per committed *pair* (token t + 1, base feature of position t), at position t,
for t = 0 .. L - 2 where L is the number of committed tokens (the last pair holds the root, the last committed
token, with the base's feature of the token before it). Its output at the last pair stands for the feature of the
root and gives the depth-1 candidates. A depth-d node is fed as (its token, its parent's draft output) at position
L - 2 + d and attends to every committed pair and to its own ancestors, exactly as the head was trained
(:meth:`specheads.methods.eagle.heads.EagleHead.forward`).

After the base verified a tree, the draft's tree entries are dropped (:func:`~specheads.inference.kv_cache.crop`
back to the committed pairs): the accepted tokens are fed again next time, paired with the base's *true* features,
which the base has only now computed. The cache therefore always equals one rebuilt from the committed tokens and
the base's features.

Trees: static (a Medusa-style choice list, ``chain-K``, a tree file: node ``(r1, ..., rd)`` is the rank-rd
candidate of its parent's draft distribution) or ``"dynamic"`` (EAGLE-2, Li et al. 2024, arXiv 2406.16858): at every
depth the ``top_k`` most confident nodes (confidence = product of draft probabilities along the path) are expanded by
their ``top_k`` best children; after ``depth`` levels the ``total_tokens`` best nodes are verified. Proposals are
deterministic top-k candidates, so every acceptance rule treats them as one-hot: ``rejection`` stays lossless.
"""

from __future__ import annotations

import statistics
import time
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
    check_speculative_tokens,
    crop,
    keep_rows,
    new_cache,
    requested_tree,
    resolve_tree,
    to_device,
    tree_from_parents,
    tree_step_mask,
)
from specheads.methods.eagle.trees import TREES, DynamicTree

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
        queue: the fused base features not yet fed (the pairs after ``consumed``).
        consumed_on_device: ``consumed`` on the device (set when the queued pairs are fed).
    """

    cache: SlotCache
    consumed: list[int]
    queue: FeatureQueue = field(default_factory=FeatureQueue)
    consumed_on_device: torch.Tensor | None = None


class EagleDrafter(Drafter):
    """Drafts trees with an :class:`~specheads.methods.eagle.heads.EagleHead` (see the module docstring), for every
    row of a batch at once: each row has its own committed pairs, root, and (for dynamic trees) its own tree shape; a
    static tree is the same for every row.

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
        calibration = getattr(head, "calibration", None)
        self.dynamic = dynamic or TREES.calibrated(calibration) or DEFAULT_DYNAMIC
        self.auto_tree = resolve_tree(calibration.tree) if calibration is not None else None
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
        return requested_tree(request, self.default_tree)

    def check_request(self, request: DraftRequest) -> None:
        check_speculative_tokens(request)
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
        state.draft = _EagleState(new_cache(state.batch_size, capacity, state.tokens.device), [0] * state.batch_size)
        self._receive(state)

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        draft: _EagleState = state.draft
        crop(draft.cache, draft.consumed)  # drop the tree entries; accepted tokens return with true features
        draft.consumed_on_device = None
        self._receive(state)

    def keep_rows(self, state: DecodeState, keep: list[int]) -> None:
        draft: _EagleState = state.draft
        keep_rows(draft.cache, keep)
        draft.consumed = [draft.consumed[i] for i in keep]
        draft.consumed_on_device = None
        draft.queue.keep_rows(keep)

    def _receive(self, state: DecodeState) -> None:
        """Queue the base's features of the tokens that just entered its cache (ragged: ``state.hidden_counts``)."""
        if not state.hidden_states:
            return
        draft: _EagleState = state.draft
        draft.queue.push(self.head.fuse(state.hidden_states), list(state.hidden_counts))  # [A, M, H]

    def _feed_pending(self, state: DecodeState) -> tuple[_Root, list[bool]] | None:
        """Feed the queued pairs (token t + 1, feature t) of every row; the output at each row's last is its root's.

        Returns the roots and, per row, whether it has one (a one-token prompt has no feature before its root yet).
        """
        draft: _EagleState = state.draft
        if draft.queue.empty:
            return None
        features, counts = draft.queue.take()
        width, device = features.shape[1], features.device
        meta = to_device([list(state.rows), draft.consumed, counts], device)
        rows, consumed, lengths = meta[0], meta[1], meta[2]
        columns = consumed[:, None] + 1 + torch.arange(width, device=device)[None]  # token t + 1 of pair t
        input_ids = state.tokens[rows[:, None], columns.clamp_max(state.tokens.shape[1] - 1)]
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()[None]
        mask = tree_step_mask(consumed, max(draft.consumed), causal)  # the cache holds `consumed` pairs
        positions = columns - 1
        hidden = self.head.step(input_ids, features, positions, mask, draft.cache)  # [A, W, H]
        advance(draft.cache, counts)
        draft.consumed = [c + n for c, n in zip(draft.consumed, counts, strict=True)]
        draft.consumed_on_device = consumed + lengths
        last = (lengths - 1).clamp_min(0)
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
            proposals = self._dynamic(state.draft, root, tree, request.max_depth)
        else:
            buffers = tree.truncated(request.max_depth)
            if buffers.num_nodes == 0:
                return None
            tokens = self._static(state.draft, root, buffers)  # [A, N]
            if all(has_root):
                return Proposal(tokens=tokens, tree=buffers, draft_probs=None)
            proposals = [Proposal(tokens[i : i + 1], buffers, None) for i in range(tokens.shape[0])]
        return [p if ok else None for p, ok in zip(proposals, has_root, strict=True)]

    def _feed_nodes(
        self,
        draft: _EagleState,
        tokens: torch.Tensor,
        parent_hidden: torch.Tensor,
        block: torch.Tensor,
        depth: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed n tree nodes of one depth for every row: tokens ``[A, n]``, their parents' draft outputs
        ``[A, n, H]``.

        ``block`` (``[A or 1, n, E]``) says which of the E tree entries fed so far (these n last) each node sees:
        its fed ancestors and itself; every node also sees its row's committed pairs. None: one row whose one node
        sees everything in the cache (a chain), which needs no mask. Returns draft outputs ``[A, n, H]`` and
        log-probabilities ``[A, n, Vd]``.
        """
        batch, count = tokens.shape
        if draft.consumed_on_device is None:
            draft.consumed_on_device = to_device(draft.consumed, tokens.device)
        consumed = draft.consumed_on_device
        mask = None if block is None else tree_step_mask(consumed, max(draft.consumed), block)
        positions = (consumed - 1 + depth)[:, None].expand(batch, count)
        hidden = self.head.step(tokens, parent_hidden, positions, mask, draft.cache)
        advance(draft.cache, [count] * batch)
        return hidden, self.head.logits(hidden).float().log_softmax(dim=-1)

    def _static(self, draft: _EagleState, root: _Root, tree: TreeBuffers) -> torch.Tensor:
        """Tokens ``[A, N]`` of a static tree: node (.., r) is the rank-r candidate of its parent's draft output.

        One gather per depth picks the nodes' tokens from their parents' candidates and one draft forward feeds
        the depth's nodes that have children; the plan of indices and masks is built once per tree.
        """
        plan = _static_plan(tree, root.hidden.device)
        batch, size = root.hidden.shape[0], tree.num_nodes + 1
        device = root.hidden.device
        tokens = torch.zeros(batch, size, dtype=torch.long, device=device)
        hidden = root.hidden.new_zeros(batch, size, root.hidden.shape[-1])  # [A, N + 1, H] draft output per node
        hidden[:, 0] = root.hidden
        candidates = torch.zeros(batch, size, plan.width, dtype=torch.long, device=device)  # top ids per node
        candidates[:, 0] = self.head.to_target(root.log_probs.topk(plan.width, dim=-1).indices)
        for depth, level in enumerate(plan.levels, start=1):
            tokens[:, level.nodes] = candidates[:, level.parents, level.ranks]
            if level.fed is None:
                continue
            block = None if batch == 1 and level.sees_all else level.block
            out, log_probs = self._feed_nodes(draft, tokens[:, level.fed], hidden[:, level.fed_parents], block, depth)
            hidden[:, level.fed] = out
            candidates[:, level.fed] = self.head.to_target(log_probs.topk(plan.width, dim=-1).indices)
        return tokens[:, 1:]

    def _dynamic(self, draft: _EagleState, root: _Root, spec: DynamicTree, max_depth: int) -> list[Proposal]:
        """EAGLE-2 per row: expand the ``top_k`` best nodes per depth, keep the ``total_tokens`` best overall.

        Tensor code throughout: every row expands the same number of nodes per depth (one draft forward per depth
        for the batch), the frontier is one flattened top-k per level, each fed node's ancestors are a bit row
        updated by index, and the chosen trees reach the host in one transfer (their parents, which acceptance walks).
        Each row's proposal carries its tree's attention mask and depths, built on the device from the same parents
        (:func:`_ancestry`): the host tree is never turned into a mask and uploaded (chains aside: their few shapes
        are uploaded once and cached).
        """
        batch, device = root.hidden.shape[0], root.hidden.device
        depth_limit = min(spec.depth, max_depth)
        k = min(spec.top_k, root.log_probs.shape[1])
        top = root.log_probs.topk(k, dim=-1)
        # Candidates in order of creation (depth by depth): token, parent candidate (-1: the root), score.
        tokens, scores = [self.head.to_target(top.indices)], [top.values]
        parents = [torch.full((batch, k), -1, dtype=torch.long, device=device)]
        frontier = torch.arange(k, device=device)[None].expand(batch, k)  # candidate ids to feed next
        frontier_hidden = root.hidden[:, None].expand(batch, k, -1)  # their parents' draft outputs
        frontier_scores = top.values
        fed_ancestors = torch.zeros(
            batch, k * max(depth_limit - 1, 0), k * max(depth_limit - 1, 0), dtype=torch.bool, device=device
        )  # entry -> the entries it sees
        parent_entries: torch.Tensor | None = None  # per frontier node, its parent's entry (None: the root)
        created = k
        for depth in range(1, depth_limit):
            first = (depth - 1) * k
            own = torch.arange(first, first + k, device=device)
            if parent_entries is not None:
                fed_ancestors[:, first : first + k] = fed_ancestors.gather(
                    1, parent_entries[:, :, None].expand(-1, -1, fed_ancestors.shape[2])
                )
            fed_ancestors[:, own, own] = True
            node_tokens = torch.cat(tokens, dim=1).gather(1, frontier)
            out, log_probs = self._feed_nodes(
                draft, node_tokens, frontier_hidden, fed_ancestors[:, first : first + k, : first + k], depth
            )
            best = log_probs.topk(min(k, log_probs.shape[-1]), dim=-1)  # [A, k, k]
            child_scores = (frontier_scores[:, :, None] + best.values).flatten(1)  # [A, k * k]
            tokens.append(self.head.to_target(best.indices).flatten(1))
            parents.append(frontier[:, :, None].expand(-1, -1, best.indices.shape[-1]).flatten(1))
            scores.append(child_scores)
            chosen = child_scores.topk(k, dim=-1).indices  # [A, k]: the next frontier, among the new candidates
            column = chosen // best.indices.shape[-1]  # which fed node each is a child of
            frontier = created + chosen
            frontier_hidden = out.gather(1, column[:, :, None].expand(-1, -1, out.shape[-1]))
            frontier_scores = child_scores.gather(1, chosen)
            parent_entries = first + column
            created += child_scores.shape[1]
        all_tokens, all_scores, all_parents = (torch.cat(x, dim=1) for x in (tokens, scores, parents))
        count = min(spec.total_tokens, created)
        # A parent's score is never below its child's, and a stable sort keeps the earlier (shallower) node first
        # on ties: the kept set is a tree.
        kept = torch.sort(-all_scores, dim=1, stable=True).indices[:, :count].sort(dim=1).values  # [A, count]
        position = torch.zeros(batch, created + 1, dtype=torch.long, device=device)  # candidate + 1 -> kept node
        position.scatter_(1, kept + 1, torch.arange(1, count + 1, device=device)[None].expand(batch, -1))
        kept_parents = position.gather(1, all_parents.gather(1, kept) + 1)  # the root (-1) maps to node 0
        kept_tokens = all_tokens.gather(1, kept)
        trees = [tree_from_parents([-1, *row]) for row in kept_parents.tolist()]  # the one transfer, for acceptance
        if all(tree.is_chain for tree in trees):  # a chain's buffers: few shapes, uploaded once and cached
            return [Proposal(kept_tokens[i : i + 1], tree) for i, tree in enumerate(trees)]
        mask, depths = _ancestry(kept_parents, depth_limit)
        return [
            Proposal(kept_tokens[i : i + 1], tree, None, mask[i : i + 1], depths[i : i + 1])
            for i, tree in enumerate(trees)
        ]


def _ancestry(parents: torch.Tensor, max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention masks ``[A, N + 1, N + 1]`` and depths ``[A, N + 1]`` of A trees given by their nodes' parents
    ``[A, N]`` (node i + 1's parent; 0 is the root; no node deeper than ``max_depth``), on the parents' device.

    One gather per depth walks every node one level up (the root, once reached, stays): node i sees node j when j is
    i or one of the nodes it passes.
    """
    batch, size = parents.shape[0], parents.shape[1] + 1
    up = torch.nn.functional.pad(parents, (1, 0))  # the root's parent: the root itself
    hops = [torch.arange(size, device=parents.device).expand(batch, size), up]
    for _ in range(max_depth - 1):
        hops.append(up.gather(1, hops[-1]))
    ancestors = torch.stack(hops, dim=2)  # [A, N + 1, D + 1]: node i's ancestor h levels up
    mask = torch.zeros(batch, size, size, dtype=torch.bool, device=parents.device).scatter_(2, ancestors, True)
    return mask, mask.sum(dim=2) - 1  # a node sees itself, its ancestors and the root: depth + 1 nodes


def measure_draft_cost(head: torch.nn.Module, prefix_len: int = 256, width: int = 4, repeats: int = 10) -> float:
    """Median ms of one EAGLE draft level: ``width`` nodes over a ``prefix_len``-pair draft cache, plus logits (the
    draft-cost model calibration adds per tree depth)."""
    device = head.fc.weight.device
    hidden = torch.zeros(1, prefix_len, head.config.hidden_size, device=device, dtype=head.fc.weight.dtype)
    ids = torch.zeros(1, prefix_len, dtype=torch.long, device=device)
    cache = new_cache()
    mask = torch.ones(prefix_len, prefix_len, dtype=torch.bool, device=device).tril()[None, None]
    head.step(ids, hidden, torch.arange(prefix_len, device=device)[None], mask, cache)
    level_mask = torch.ones(1, 1, width, prefix_len + width, dtype=torch.bool, device=device)
    positions = torch.full((1, width), prefix_len, device=device)
    samples = []
    for _ in range(repeats + 2):
        start = time.perf_counter()
        out = head.step(ids[:, :width], hidden[:, :width], positions, level_mask, cache)
        head.logits(out).log_softmax(dim=-1).topk(width)
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append(1000 * (time.perf_counter() - start))
        crop(cache, prefix_len)
    return statistics.median(samples[2:])


@dataclass(frozen=True)
class _Level:
    """One depth of a static tree for the drafter: which nodes take which candidates, which are fed."""

    # Index lists are slices where they are contiguous (a chain's always are): basic indexing costs less.
    nodes: slice | torch.Tensor  # [n] the nodes of this depth
    parents: slice | torch.Tensor  # [n] their parents
    ranks: int | torch.Tensor  # [n] their ranks among the parent's candidates (an int: the same for all)
    fed: slice | torch.Tensor | None  # [m] the nodes of this depth with children (fed to the draft), or None
    fed_parents: slice | torch.Tensor | None  # [m] their parents
    block: torch.Tensor | None  # [1, m, E] which of the E tree entries fed so far each fed node sees
    sees_all: bool  # one fed node that sees every entry fed so far (no mask needed for one row)


@dataclass(frozen=True)
class _StaticPlan:
    width: int  # candidates read per node (the largest rank + 1)
    levels: tuple[_Level, ...]


def _static_plan(tree: TreeBuffers, device: torch.device) -> _StaticPlan:
    """The index tensors and masks of :meth:`EagleDrafter._static` for ``tree``, built once per device."""
    key = ("eagle-static", str(device))
    plan = tree._on_device.get(key)
    if plan is not None:
        return plan
    entry: dict[int, int] = {}  # fed node -> its tree entry (order of feeding)
    levels = []
    for depth in range(1, tree.max_depth + 1):
        nodes = [n for n in range(1, len(tree.parents)) if tree.levels[n] == depth]
        fed = [n for n in nodes if tree.children[n]]
        for n in fed:
            entry[n] = len(entry)
        seen = [[False] * len(entry) for _ in fed]
        for row, node in enumerate(fed):
            ancestor = node
            while ancestor in entry:
                seen[row][entry[ancestor]] = True
                ancestor = tree.parents[ancestor]
        block = torch.tensor(seen, dtype=torch.bool).reshape(1, len(fed), len(entry))

        def index(values: list[int]) -> slice | torch.Tensor:
            if values == list(range(values[0], values[0] + len(values))):
                return slice(values[0], values[0] + len(values))
            return torch.tensor(values, dtype=torch.long, device=device)

        node_parents, node_ranks = [tree.parents[n] for n in nodes], [tree.ranks[n] for n in nodes]
        parents, ranks = index(node_parents), node_ranks[0]  # a contiguous run of parents, one rank: basic indexing
        if not isinstance(parents, slice) or len(set(node_ranks)) > 1:
            parents, ranks = (torch.tensor(v, dtype=torch.long, device=device) for v in (node_parents, node_ranks))
        levels.append(
            _Level(
                nodes=index(nodes),
                parents=parents,
                ranks=ranks,
                fed=index(fed) if fed else None,
                fed_parents=index([tree.parents[n] for n in fed]) if fed else None,
                block=block.to(device) if fed else None,
                sees_all=len(fed) == 1 and all(seen[0]),
            )
        )
    plan = _StaticPlan(width=max(tree.ranks[1:], default=0) + 1, levels=tuple(levels))
    tree._on_device[key] = plan
    return plan
