"""Drafters: whatever proposes tokens for the base to verify, behind one small protocol.

A drafter is told when a generation starts (:meth:`Drafter.reset`), asked for a :class:`Proposal` at each step
(:meth:`Drafter.propose`), and told how many drafted tokens the base accepted (:meth:`Drafter.accepted`). This
mirrors transformers' ``CandidateGenerator`` (``get_candidates`` / ``update_candidate_strategy``), with trees.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel

from specheads.inference import kv_cache
from specheads.inference.sampling import probabilities, sample
from specheads.inference.state import DecodeState, DraftRequest, Proposal
from specheads.inference.trees import chain_choices, resolve_tree, tree_from_choices


@runtime_checkable
class Drafter(Protocol):
    """The drafter protocol.

    Attributes:
        name: the method name (``"draft"``, ``"prompt-lookup"``, ``"none"``, ``"medusa"``, ...).
        hidden_state_layers: indices into the base's ``hidden_states`` output that the drafter needs for the tokens
            entering the cache (empty: the base runs without ``output_hidden_states``).
    """

    name: str
    hidden_state_layers: tuple[int, ...]

    def check_request(self, request: DraftRequest) -> None:
        """Raise ``ValueError`` before any compute when ``request`` cannot be served (e.g. a tree too deep)."""

    def reset(self, state: DecodeState) -> None:
        """Start a new generation after the base's prefill."""

    def propose(self, state: DecodeState, request: DraftRequest) -> Proposal | None:
        """Draft tokens after each row's root; None when there is nothing to propose."""

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        """Learn that the base accepted ``num_accepted[b]`` drafted tokens of row b (state already committed)."""


def chain_proposal(drafts: torch.Tensor, draft_probs: torch.Tensor | None = None) -> Proposal:
    """A proposal of ``drafts [B, K]`` as a chain."""
    return Proposal(tokens=drafts, tree=tree_from_choices(chain_choices(drafts.shape[1])), draft_probs=draft_probs)


def _chain_length(request: DraftRequest, default: int) -> int:
    if request.tree is not None:
        if not request.tree.is_chain:
            raise ValueError("this drafter proposes chains; use tree='chain-K' or num_speculative_tokens=K")
        return request.tree.num_nodes
    return default if request.num_speculative_tokens is None else request.num_speculative_tokens


def _check_chain_request(request: DraftRequest, default: int) -> None:
    length = _chain_length(request, default)
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {length!r}")


class NoDrafter:
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


class PromptLookupDrafter:
    """Copy the continuation of the latest n-gram match in the context (Saxena 2023, "prompt lookup decoding").

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
        _check_chain_request(request, self.num_speculative_tokens)

    def reset(self, state: DecodeState) -> None:
        return None

    def propose(self, state: DecodeState, request: DraftRequest) -> Proposal | None:
        if state.batch_size != 1:
            raise NotImplementedError("prompt lookup drafts one row at a time")
        length = min(_chain_length(request, self.num_speculative_tokens), request.max_depth)
        if length < 1:
            return None
        context = state.sequence(0)  # [L]
        drafts = self._lookup(context, length)
        return None if drafts is None else chain_proposal(drafts[None])

    def _lookup(self, context: torch.Tensor, length: int) -> torch.Tensor | None:
        total = context.shape[0]
        for size in range(min(self.max_ngram_size, total - 1), 0, -1):
            windows = context.unfold(0, size, 1)  # [L - size + 1, size]
            matches = (windows == context[total - size :]).all(dim=1).nonzero().flatten().tolist()
            for start in matches:
                begin = start + size
                if begin < total:
                    return context[begin : min(begin + length, total)]
        return None

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        return None


class DraftModelDrafter:
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
        self._cache = kv_cache.new_cache()
        self._cached_tokens = 0  # committed tokens the draft cache holds
        self._drafted = 0  # drafts of the last proposal (the last one is not in the draft cache)

    def check_request(self, request: DraftRequest) -> None:
        _check_chain_request(request, self.num_speculative_tokens)

    def reset(self, state: DecodeState) -> None:
        if state.batch_size != 1:
            raise NotImplementedError("the draft model drafts one row at a time")
        self._cache = kv_cache.new_cache()
        self._cached_tokens = 0
        self._drafted = 0

    @torch.inference_mode()
    def propose(self, state: DecodeState, request: DraftRequest) -> Proposal | None:
        length = min(_chain_length(request, self.num_speculative_tokens), request.max_depth)
        if length < 1:
            return None
        committed = state.lengths[0]
        feed = state.tokens[:, self._cached_tokens : committed]  # [1, F]: unseen committed tokens, root included
        drafts, draft_probs = [], []
        for _ in range(length):
            logits = self._forward(feed)  # [1, V]
            if request.sampling.greedy:
                token = logits.argmax(dim=-1)  # [1]
                confidence = logits.float().softmax(dim=-1)[0, token] if self.confidence_threshold else None
            else:
                q = probabilities(logits, request.sampling)  # [1, V]
                token = sample(q, request.generator)
                draft_probs.append(q)
                confidence = q[0, token]
            drafts.append(token)
            if self.confidence_threshold and float(confidence) < self.confidence_threshold:
                break
            feed = token[:, None]
        # The last draft was never fed, so the draft cache holds committed + (drafted - 1) drafted tokens.
        self._cached_tokens = committed
        self._drafted = len(drafts)
        probs = torch.stack(draft_probs, dim=1) if draft_probs else None  # [1, K, V]
        return chain_proposal(torch.stack(drafts, dim=1), probs)

    def _forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, logits_to_keep=1, **kv_cache.forward_kwargs(self.model, self._cache))
        return out.logits[:, -1, :]

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        valid = self._cached_tokens + min(num_accepted[0], max(self._drafted - 1, 0))
        kv_cache.crop(self._cache, valid)
        self._cached_tokens = valid


def check_same_vocabulary(base: PreTrainedModel, draft: PreTrainedModel) -> None:
    """Raise ``ValueError`` unless the draft's vocabulary matches the base's."""
    base_vocab = base.get_output_embeddings().weight.shape[0]
    draft_vocab = draft.get_output_embeddings().weight.shape[0]
    if base_vocab != draft_vocab:
        raise ValueError(
            f"the draft model's vocabulary ({draft_vocab} tokens) differs from the base's ({base_vocab}); "
            "a draft model must share the base's tokenizer"
        )


class MedusaDrafter:
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
        calibrated = getattr(heads, "calibrated_tree", None)
        self.auto_tree = resolve_tree(calibrated) if calibrated is not None else None  # [] is a valid tree
        if tree is None:
            self.default_tree = self.auto_tree or resolve_tree(f"chain-{self.num_heads}")
        else:
            self.default_tree = self.resolve(tree)
        self._check_depth(self.default_tree.max_depth)

    def resolve(self, tree: str | list):  # noqa: ANN201 - TreeBuffers
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

    def _tree(self, request: DraftRequest):  # noqa: ANN202 - TreeBuffers
        if request.tree is not None:
            return request.tree
        if request.num_speculative_tokens is not None:
            return tree_from_choices(chain_choices(request.num_speculative_tokens))
        return self.default_tree

    def check_request(self, request: DraftRequest) -> None:
        if request.tree is None and request.num_speculative_tokens is not None:
            _check_chain_request(request, self.num_heads)
        self._check_depth(self._tree(request).max_depth)

    def reset(self, state: DecodeState) -> None:
        return None

    @torch.inference_mode()
    def propose(self, state: DecodeState, request: DraftRequest) -> Proposal | None:
        if not state.hidden_states:  # a one-token prompt: no hidden state before the root yet
            return None
        tree = self._tree(request).truncated(request.max_depth)
        if tree.num_nodes == 0:
            return None
        hidden = state.hidden_states[0][:, -1]  # [B, H] of the last cached token
        logits = self.heads(hidden, num_heads=tree.max_depth)  # [D, B, V]
        depths = tree.depths[1:]  # [N]
        ranks = torch.tensor(tree.ranks[1:], dtype=torch.long)  # [N]
        candidates = logits.topk(int(ranks.max()) + 1, dim=-1).indices  # [D, B, R]
        tokens = candidates[depths - 1, :, ranks].transpose(0, 1)  # [B, N]
        return Proposal(tokens=tokens, tree=tree, draft_probs=None)

    def accepted(self, state: DecodeState, num_accepted: list[int]) -> None:
        return None
