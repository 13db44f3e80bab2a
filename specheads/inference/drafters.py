"""Drafters: whatever proposes tokens for the base to verify, behind one small protocol.

A drafter is told when a generation starts (:meth:`Drafter.reset`), asked for a :class:`Proposal` at each step
(:meth:`Drafter.propose`), and told how many drafted tokens the base accepted (:meth:`Drafter.accepted`). This
mirrors transformers' ``CandidateGenerator`` (``get_candidates`` / ``update_candidate_strategy``), with trees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from specheads.inference import kv_cache
from specheads.inference.sampling import probabilities, sample
from specheads.inference.state import DecodeState, DraftRequest, Proposal
from specheads.inference.trees import TreeSpec, chain_choices, resolve_tree, tree_from_choices


class Drafter:
    """The base class of drafters: every hook the engine calls, with what it does when a drafter does not override it.

    Attributes:
        name: the method name (``"draft"``, ``"prompt-lookup"``, ``"none"``, ``"medusa"``, ...).
        hidden_state_layers: indices into the base's ``hidden_states`` output that the drafter needs for the tokens
            entering the cache (empty: the base runs without ``output_hidden_states``).
    """

    name: str = "drafter"
    hidden_state_layers: tuple[int, ...] = ()

    def check_request(self, request: DraftRequest) -> None:
        """Raise ``ValueError`` before any compute when ``request`` cannot be served (e.g. a tree too deep)."""

    def resolve(self, tree: Any) -> TreeSpec:
        """The tree a ``tree=`` value names for this drafter; ``"auto"`` is a calibrated tree, which only draft heads
        have. A drafter that grows trees of its own (a method's tree family) returns them for their names, and its
        own default for a bare kind (which the size keywords then resize)."""
        if tree == "auto":
            raise ValueError(f"tree='auto' is calibrated for draft heads; method {self.name!r} has none")
        return resolve_tree(tree)

    def max_nodes(self, request: DraftRequest) -> int:
        """The largest tree a request can verify (what the cache reserves beyond the generated tokens)."""
        return 64

    def extra_nodes(self, request: DraftRequest) -> int:
        """Nodes the drafter may add to the tree a request names (a composed lookup's branches)."""
        return 0

    def gives_draft_probs(self, request: DraftRequest) -> bool:
        """Whether proposals carry draft probabilities (``acceptance="alpha"`` needs them)."""
        return False

    def reset(self, state: DecodeState) -> None:
        """Start a new generation after the base's prefill (per-generation state goes in ``state.draft``)."""

    def propose(self, state: DecodeState, request: DraftRequest) -> Proposal | list[Proposal | None] | None:
        """Draft tokens after the root of every row in ``state.rows``: one Proposal for all rows (same tree), a list
        with one Proposal or None per row, or None when there is nothing to propose."""
        raise NotImplementedError

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        """Learn that the base accepted ``num_accepted[i]`` drafted tokens of row ``state.rows[i]`` (committed)."""

    def keep_rows(self, state: DecodeState, keep: list[int]) -> None:
        """Rows left the batch: keep the per-row state of ``keep`` (indices into the previous ``state.rows``)."""


def chain_proposal(drafts: torch.Tensor, draft_probs: torch.Tensor | None = None) -> Proposal:
    """A proposal of ``drafts [B, K]`` as a chain."""
    return Proposal(tokens=drafts, tree=tree_from_choices(chain_choices(drafts.shape[1])), draft_probs=draft_probs)


def requested_tree(request: DraftRequest, default: Any) -> Any:
    """The tree a tree drafter serves for ``request``: its tree, else ``chain-K`` for ``num_speculative_tokens=K``,
    else the drafter's ``default``."""
    if request.tree is not None:
        return request.tree
    if request.num_speculative_tokens is not None:
        return resolve_tree(f"chain-{request.num_speculative_tokens}")
    return default


def check_speculative_tokens(request: DraftRequest) -> None:
    """``num_speculative_tokens``, when it decides the tree, must be an integer >= 1."""
    if request.tree is None and request.num_speculative_tokens is not None:
        tokens = request.num_speculative_tokens
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {tokens!r}")


def _chain_length(request: DraftRequest, default: int) -> int:
    if request.tree is not None:
        if not request.tree.is_chain:
            raise ValueError("this drafter proposes chains; use tree='chain-K' or num_speculative_tokens=K")
        return request.tree.num_nodes
    return default if request.num_speculative_tokens is None else request.num_speculative_tokens


def check_chain_request(request: DraftRequest, default: int) -> None:
    """Refuse a request a chain drafter cannot serve: a branching tree, or a draft length that is not an integer
    >= 1 (``default``: the drafter's own length when the request names none)."""
    length = _chain_length(request, default)
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {length!r}")


class NoDrafter(Drafter):
    """Plain autoregressive decoding through the speculative engine: the baseline that shows the engine's cost."""

    name = "none"
    hidden_state_layers: tuple[int, ...] = ()

    def check_request(self, request: DraftRequest) -> None:
        if request.tree is not None and request.tree.num_nodes:
            raise ValueError("method 'none' drafts nothing; it takes no tree")

    def reset(self, state: DecodeState) -> None:
        return None

    def propose(self, state: DecodeState, request: DraftRequest) -> Proposal | None:
        return None

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        return None


class PromptLookupDrafter(Drafter):
    """Copy the continuation of the earliest n-gram match in the context (Saxena 2023, "prompt lookup decoding").

    Like transformers' ``PromptLookupCandidateGenerator``: try n-gram sizes from ``max_ngram_size`` down to 1, take
    the first earlier occurrence of the context's last n tokens that has a continuation, and propose up to K tokens
    of that continuation. No model is involved; proposals are deterministic.
    """

    name = "prompt-lookup"
    hidden_state_layers: tuple[int, ...] = ()

    def __init__(self, num_speculative_tokens: int = 10, max_ngram_size: int = 2) -> None:
        if max_ngram_size < 1:
            raise ValueError("max_ngram_size must be >= 1")
        self.num_speculative_tokens = num_speculative_tokens
        self.max_ngram_size = max_ngram_size

    def check_request(self, request: DraftRequest) -> None:
        check_chain_request(request, self.num_speculative_tokens)

    def reset(self, state: DecodeState) -> None:
        state.draft = [_NgramIndex(self.max_ngram_size) for _ in state.rows]

    def max_nodes(self, request: DraftRequest) -> int:
        return _chain_length(request, self.num_speculative_tokens)

    def propose(self, state: DecodeState, request: DraftRequest) -> list[Proposal | None] | None:
        length = min(_chain_length(request, self.num_speculative_tokens), request.max_depth)
        if length < 1:
            return None
        proposals: list[Proposal | None] = []
        device = state.tokens.device
        if not isinstance(state.draft, list) or len(state.draft) != len(state.rows):
            self.reset(state)  # a state built by hand, without reset
        for index, row in zip(state.draft, state.rows, strict=True):  # each row looks up its own context
            context = state.host_tokens[row] if state.host_tokens else state.sequence(row).tolist()
            drafts = index.lookup(context, length)
            proposals.append(None if not drafts else chain_proposal(kv_cache.to_device([drafts], device)))
        return proposals

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        return None

    def keep_rows(self, state: DecodeState, keep: list[int]) -> None:
        state.draft = [state.draft[i] for i in keep]


class _NgramIndex:
    """One row's n-grams on the host, indexed as tokens are committed: n-gram -> its earliest start.

    ``lookup`` then finds, for n from the largest size down, the earliest earlier occurrence of the context's last n
    tokens and copies what follows it, as a scan of the whole context would, in time independent of its length.
    """

    def __init__(self, max_ngram_size: int) -> None:
        self.sizes = range(max_ngram_size, 0, -1)
        self.first: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # tokens whose n-grams (ending there) are in the index

    def lookup(self, context: list[int], length: int) -> list[int]:
        total = len(context)
        for end in range(self.indexed, total):
            for size in self.sizes:
                if end + 1 >= size:
                    self.first.setdefault(tuple(context[end + 1 - size : end + 1]), end + 1 - size)
        self.indexed = total
        for size in self.sizes:
            if size >= total:
                continue
            start = self.first.get(tuple(context[total - size :]))
            if start is not None and start + size < total:
                begin = start + size
                return context[begin : min(begin + length, total)]
        return []


class DraftModelDrafter(Drafter):
    """A separate small causal LM with the base's tokenizer drafts K tokens autoregressively.

    The classic speculative decoding draft phase (Leviathan et al. 2023; Chen et al. 2023). The draft keeps its own
    cache in step with the committed tokens: after each verification it is rolled back to the last token both
    agree on, and the next proposal first feeds the committed tokens it has not seen. At temperature 0 the draft
    takes its argmax (a deterministic proposal); otherwise it samples from its own distribution, warped with the
    base's temperature/top-k/top-p, and reports that distribution for rejection sampling.

    With ``confidence_threshold`` the draft stops early when its own probability of the token it just drafted falls
    below the threshold (transformers' ``assistant_confidence_threshold`` idea): a weak draft then wastes fewer
    draft forwards and verifies fewer doomed tokens. This changes only what is proposed, never what is accepted.
    """

    name = "draft"
    hidden_state_layers: tuple[int, ...] = ()

    def __init__(
        self, model: PreTrainedModel, num_speculative_tokens: int = 5, confidence_threshold: float | None = None
    ) -> None:
        if confidence_threshold is not None and not 0.0 <= confidence_threshold < 1.0:
            raise ValueError(f"confidence_threshold must be in [0, 1), got {confidence_threshold!r}")
        self.model = model.eval()
        self.num_speculative_tokens = num_speculative_tokens
        self.confidence_threshold = confidence_threshold

    def check_request(self, request: DraftRequest) -> None:
        check_chain_request(request, self.num_speculative_tokens)

    def max_nodes(self, request: DraftRequest) -> int:
        return _chain_length(request, self.num_speculative_tokens)

    def gives_draft_probs(self, request: DraftRequest) -> bool:
        """The draft samples (and reports q) at temperature > 0; at temperature 0 it proposes its argmax."""
        return not request.sampling.greedy

    def reset(self, state: DecodeState) -> None:
        capacity = state.tokens.shape[1] + 2 * self.num_speculative_tokens + 2
        state.draft = _DraftState(
            kv_cache.new_cache(state.batch_size, capacity, state.tokens.device),
            cached=[0] * state.batch_size,
            drafted=[0] * state.batch_size,
        )

    @torch.inference_mode()
    def propose(self, state: DecodeState, request: DraftRequest) -> list[Proposal] | None:
        length = min(_chain_length(request, self.num_speculative_tokens), request.max_depth)
        if length < 1:
            return None
        draft: _DraftState = state.draft
        rows = state.rows
        # Every row first feeds the committed tokens its draft cache has not seen (at least its root), ragged.
        feeds = [state.tokens[row, draft.cached[i] : state.lengths[row]] for i, row in enumerate(rows)]
        counts = [feed.shape[0] for feed in feeds]
        logits = self._feed(draft.cache, feeds, counts)  # [A, V]: the last fed token of each row
        limits = request.max_depths or (request.max_depth,) * len(rows)
        if request.sampling.greedy:
            return self._propose_greedy(state, logits, min(length, max(limits)), limits)
        drafts: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        stopped = [limit < 1 for limit in limits]
        for step in range(length):
            if request.sampling.greedy:
                tokens = logits.argmax(dim=-1)  # [A]
                confidence = logits.float().softmax(dim=-1).gather(1, tokens[:, None])[:, 0]
            else:
                q = probabilities(logits, request.sampling)  # [A, V]
                # Rows that stopped draw nothing: a row's random stream is the same alone or in any batch.
                tokens = torch.cat(
                    [
                        q[i : i + 1].argmax(dim=-1) if stopped[i] else sample(q[i : i + 1], state.generators[row])
                        for i, row in enumerate(rows)
                    ]
                )
                confidence = q.gather(1, tokens[:, None])[:, 0]
            for i in range(len(rows)):
                if stopped[i]:
                    continue
                drafts[i].append(int(tokens[i]))
                if not request.sampling.greedy:
                    probs[i].append(q[i])
                low = self.confidence_threshold and float(confidence[i]) < self.confidence_threshold
                stopped[i] = bool(low) or len(drafts[i]) >= min(length, limits[i])
            if all(stopped) or step == length - 1:
                break
            logits = self._feed(draft.cache, [t[None] for t in tokens], [1] * len(rows))
        # The last draft of each row was never fed: the draft cache holds committed + (drafted - 1) of its drafts.
        draft.cached = [state.lengths[row] for row in rows]
        draft.drafted = [len(d) for d in drafts]
        device = state.tokens.device
        return [
            chain_proposal(torch.tensor([d], dtype=torch.long, device=device), torch.stack(p)[None] if p else None)
            for d, p in zip(drafts, probs, strict=True)
        ]

    def _propose_greedy(
        self, state: DecodeState, logits: torch.Tensor, steps: int, limits: tuple[int, ...] | list[int]
    ) -> list[Proposal]:
        """Argmax drafts of every row in a ``[A, K]`` device buffer with a ``stopped`` mask; the rows' draft counts
        reach the host once, at the end. With a confidence threshold the loop also asks the device whether every
        row has stopped after each draft token (one transfer per draft token), so that it can stop early."""
        draft: _DraftState = state.draft
        rows, device = state.rows, logits.device
        limit = kv_cache.to_device(list(limits), device)
        drafts = torch.zeros(len(rows), steps, dtype=torch.long, device=device)
        count = torch.zeros(len(rows), dtype=torch.long, device=device)
        stopped = limit < 1
        for step in range(steps):
            tokens = logits.argmax(dim=-1)  # [A]
            drafts[:, step] = tokens
            count += (~stopped).long()
            stopped = stopped | (count >= limit)
            if self.confidence_threshold:
                confidence = logits.float().softmax(dim=-1).gather(1, tokens[:, None])[:, 0]
                stopped = stopped | (confidence < self.confidence_threshold)
            if step == steps - 1 or (self.confidence_threshold and bool(stopped.all())):
                break
            logits = self._feed(draft.cache, tokens[:, None], [1] * len(rows))
        counts = count.tolist()  # the one transfer
        # The last draft of each row was never fed: the draft cache holds committed + (drafted - 1) of its drafts.
        draft.cached = [state.lengths[row] for row in rows]
        draft.drafted = counts
        return [chain_proposal(drafts[i : i + 1, :n]) for i, n in enumerate(counts)]

    def _feed(
        self, cache: kv_cache.SlotCache, feeds: list[torch.Tensor] | torch.Tensor, counts: list[int]
    ) -> torch.Tensor:
        """Feed each row its tokens (ragged; or a ``[A, W]`` tensor, W each) through the draft; ``[A, V]`` logits
        after each row's last token."""
        width, device = max(counts), feeds[0].device
        lengths = kv_cache.row_lengths(cache)
        if isinstance(feeds, torch.Tensor):
            input_ids = feeds
        else:
            input_ids = torch.zeros(len(feeds), width, dtype=torch.long, device=device)
            for i, feed in enumerate(feeds):
                input_ids[i, : counts[i]] = feed
        positions = kv_cache.to_device(lengths, device)[:, None] + torch.arange(width, device=device)[None]
        if len(feeds) == 1:
            mask = None  # one row: the model's own causal mask over the cache is the same
        else:
            inner = [kv_cache.causal(c) for c in counts]
            mask = kv_cache.step_mask(lengths, inner, width, device)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            **kv_cache.forward_kwargs(self.model, cache),
        )
        kv_cache.advance(cache, counts)
        if min(counts) == width:
            return out.logits[:, -1]
        last = kv_cache.to_device(counts, device) - 1
        return out.logits[torch.arange(len(feeds), device=device), last]

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        draft: _DraftState = state.draft
        valid = [
            cached + min(accepted, max(drafted - 1, 0))
            for cached, drafted, accepted in zip(draft.cached, draft.drafted, num_accepted, strict=True)
        ]
        kv_cache.crop(draft.cache, valid)
        draft.cached = valid

    def keep_rows(self, state: DecodeState, keep: list[int]) -> None:
        draft: _DraftState = state.draft
        kv_cache.keep_rows(draft.cache, keep)
        draft.cached = [draft.cached[i] for i in keep]
        draft.drafted = [draft.drafted[i] for i in keep]


@dataclass
class _DraftState:
    """A draft model's per-generation state: its cache and, per row, what the cache holds."""

    cache: kv_cache.SlotCache
    cached: list[int]  # committed tokens in the draft cache
    drafted: list[int]  # drafts of the last proposal (the last one is not in the draft cache)
