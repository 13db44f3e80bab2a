"""SpecDecoder: speculative decoding for any transformers causal LM, driven through its public forward.

The loop reads top to bottom::

    prefill -> loop { propose -> verify (one base forward over the tree) -> accept -> commit }

Tree attention is a 4D boolean mask ``[B, 1, q_len, kv_len]`` with explicit ``position_ids`` (prefix length +
depth); the base's own cache is extended by the verify forward and then compacted by :mod:`kv_cache`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specheads.heads.registry import HEAD_TYPES, head_type_of
from specheads.inference import kv_cache
from specheads.inference.acceptance import ACCEPTANCE_RULES, AcceptanceOptions, resolve_rule
from specheads.inference.drafters import (
    Drafter,
    DraftModelDrafter,
    NoDrafter,
    PromptLookupDrafter,
    check_same_vocabulary,
)
from specheads.inference.sampling import SamplingParams, probabilities, sample
from specheads.inference.state import DecodeState, DraftRequest, Proposal
from specheads.inference.trees import DynamicTree, resolve_tree
from specheads.metrics import SpecStats

METHODS = (*HEAD_TYPES, "draft", "prompt-lookup", "none")
DYNAMIC_TREE_KWARGS = {"tree_top_k": "top_k", "depth": "depth", "total_tokens": "total_tokens"}


@dataclass
class GenerationOutput:
    """Result of :meth:`SpecDecoder.generate`.

    Attributes:
        sequences: ``[1, T + n]`` prompt followed by the new tokens.
        new_tokens: the n new tokens, ``n <= max_new_tokens``.
        text: the decoded new tokens when a tokenizer is known, else None.
        stats: statistics of the generation.
    """

    sequences: torch.Tensor
    new_tokens: list[int]
    text: str | None
    stats: SpecStats


@dataclass(frozen=True)
class _Settings:
    """Validated arguments of one generate call."""

    max_new_tokens: int
    sampling: SamplingParams
    rule: str
    options: AcceptanceOptions
    eos_token_ids: frozenset[int]
    request: DraftRequest


class SpecDecoder:
    """Generate with a base model and a drafter; at temperature 0 the output equals the base's greedy output.

    Args:
        base_model: any ``AutoModelForCausalLM`` whose forward accepts a 4D attention mask and position ids.
        drafter: a :class:`~specheads.inference.drafters.Drafter`; None decodes plainly through the engine.
        tokenizer: used to encode string prompts and decode outputs.
    """

    def __init__(
        self,
        base_model: PreTrainedModel,
        drafter: Drafter | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        self.model = base_model.eval()
        self.drafter = drafter if drafter is not None else NoDrafter()
        self.tokenizer = tokenizer
        if isinstance(self.drafter, DraftModelDrafter):
            check_same_vocabulary(self.model, self.drafter.model)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(
        cls,
        base: str | Path | PreTrainedModel,
        heads: str | Path | torch.nn.Module | None = None,
        draft_model: str | Path | PreTrainedModel | None = None,
        method: str | None = None,
        tokenizer: str | PreTrainedTokenizerBase | None = None,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device | None = None,
        num_speculative_tokens: int | None = None,
    ) -> SpecDecoder:
        """Load a base (and a drafter) by name or path, or wrap models already in memory.

        ``method`` is inferred when None: the head type of ``heads`` (``"medusa"`` or ``"eagle"``, read from the
        checkpoint's config), ``"draft"`` with a draft model, ``"none"`` otherwise. ``heads="default"`` with
        ``base="default"`` are the EAGLE-3 heads shipped for the embedded default model.
        """
        from specheads.loading import check_same_tokenizer, load_causal_lm, load_tokenizer

        if method is None:
            method = "draft" if draft_model is not None else (_heads_method(heads) if heads is not None else "none")
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {list(METHODS)}")
        if method in HEAD_TYPES and heads is None:
            raise ValueError(f"method {method!r} needs heads= (a head checkpoint directory or a heads module)")
        if method == "draft" and draft_model is None:
            raise ValueError("method 'draft' needs draft_model=")
        base_model = load_causal_lm(base, dtype=dtype, device=device)
        if tokenizer is None and isinstance(base, (str, Path)):
            tokenizer = base
        tokenizer = load_tokenizer(tokenizer) if tokenizer is not None else None
        drafter: Drafter
        if method == "draft":
            check_same_tokenizer(tokenizer, draft_model)
            draft = load_causal_lm(draft_model, dtype=dtype, device=base_model.device, role="draft")
            drafter = DraftModelDrafter(draft, num_speculative_tokens or 5)
        elif method in HEAD_TYPES:
            from specheads.heads.loading import heads_for_decoding

            loaded_heads, base_model = heads_for_decoding(_heads_path(heads), base_model)
            if head_type_of(loaded_heads).name != method:
                raise ValueError(f"method {method!r} was asked for but the heads are {head_type_of(loaded_heads).name}")
            drafter = HEAD_TYPES[method].make_drafter(loaded_heads)
        elif method == "prompt-lookup":
            drafter = PromptLookupDrafter(num_speculative_tokens or 10)
        else:
            drafter = NoDrafter()
        return cls(base_model, drafter, tokenizer)

    # ------------------------------------------------------------------ public API
    def generate(
        self, prompt: str | Sequence[int] | torch.Tensor, max_new_tokens: int = 128, **kwargs: Any
    ) -> GenerationOutput:
        """Generate up to ``max_new_tokens`` tokens after ``prompt``.

        Keyword arguments: ``temperature`` (0 = greedy), ``top_p``, ``top_k``, ``acceptance`` ("auto", "greedy",
        "rejection", "typical", "threshold", "alpha"), ``tree``, ``num_speculative_tokens``, ``eos_token_id``,
        ``seed``, and the rule parameters ``posterior_threshold``, ``posterior_alpha``, ``acceptance_threshold``,
        ``alpha``.
        """
        state = None
        for step_state, _ in self._run(prompt, max_new_tokens, **kwargs):
            state = step_state
        assert state is not None
        new_tokens = state.new_tokens(0)
        text = self.tokenizer.decode(new_tokens, skip_special_tokens=True) if self.tokenizer is not None else None
        return GenerationOutput(state.sequence(0)[None].clone(), new_tokens, text, state.stats)

    def stream(
        self, prompt: str | Sequence[int] | torch.Tensor, max_new_tokens: int = 128, **kwargs: Any
    ) -> Iterator[str]:
        """Yield decoded text pieces as tokens are accepted (same arguments as :meth:`generate`)."""
        if self.tokenizer is None:
            raise ValueError("stream() needs a tokenizer to decode text; pass tokenizer= or use generate()")
        emitted_text = ""
        tokens: list[int] = []
        for _, new in self._run(prompt, max_new_tokens, **kwargs):
            tokens.extend(new)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for its remaining bytes
                continue
            if len(text) > len(emitted_text):
                yield text[len(emitted_text) :]
                emitted_text = text
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if len(text) > len(emitted_text):
            yield text[len(emitted_text) :]

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def _run(
        self, prompt: str | Sequence[int] | torch.Tensor, max_new_tokens: int, **kwargs: Any
    ) -> Iterator[tuple[DecodeState, list[int]]]:
        start = time.perf_counter()
        input_ids = self._encode(prompt)
        settings = self._settings(max_new_tokens, kwargs)
        max_length = self._max_length()
        if max_length is not None and input_ids.shape[1] >= max_length:
            raise ValueError(
                f"the prompt has {input_ids.shape[1]} tokens; the model allows at most {max_length} positions, "
                "so nothing can be generated"
            )
        generator = settings.request.generator
        state = self._prefill(input_ids, settings.max_new_tokens)
        self.drafter.reset(state)
        while not state.finished[0]:
            max_depth = self._max_depth(state, settings.max_new_tokens, max_length)
            request = dataclasses.replace(settings.request, max_depth=max_depth)
            tick = time.perf_counter()
            proposal = self.drafter.propose(state, request)
            tock = time.perf_counter()
            emitted = self._verify_accept_commit(state, proposal, settings, generator, max_length)
            state.stats.draft_time_s += tock - tick
            state.stats.verify_time_s += time.perf_counter() - tock
            state.stats.wall_time_s = time.perf_counter() - start
            yield state, emitted
        state.stats.wall_time_s = time.perf_counter() - start

    def _prefill(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeState:
        """Run the prompt except its last token (the first root) through the base."""
        batch, length = input_ids.shape
        tokens = torch.zeros(batch, length + max_new_tokens, dtype=torch.long, device=input_ids.device)
        tokens[:, :length] = input_ids
        state = DecodeState(tokens, [length] * batch, [length] * batch, kv_cache.new_cache(), finished=[False] * batch)
        if length > 1:
            out = self._forward(input_ids[:, :-1], state.cache, None, None, logits_to_keep=1)
            state.hidden_states = self._kept_hidden(out, None)
        return state

    def _verify_accept_commit(
        self,
        state: DecodeState,
        proposal: Proposal | None,
        settings: _Settings,
        generator: torch.Generator | None,
        max_length: int | None,
    ) -> list[int]:
        """One step: verify the proposal with one base forward, accept a path, commit it. Returns emitted tokens."""
        prefix_len = state.lengths[0] - 1  # positions in the base cache; the root is fed now
        root = state.tokens[:, prefix_len : prefix_len + 1]  # [1, 1]
        if proposal is None or proposal.tokens.shape[1] == 0:
            node_tokens, tree, mask, q = root, None, None, None
            position_ids = torch.full_like(root, prefix_len)
        else:
            tree = proposal.tree
            node_tokens = torch.cat([root, proposal.tokens], dim=1)  # [1, N + 1]
            position_ids = (prefix_len + tree.depths)[None].to(root.device)  # [1, N + 1]
            mask = None if tree.is_chain else _tree_mask(tree.attention_mask, prefix_len, root.device)
            q = None if proposal.draft_probs is None else proposal.draft_probs[0]
        out = self._forward(node_tokens, state.cache, mask, position_ids)
        logits = out.logits[0]  # [N + 1, V]
        if tree is None:
            result_path, next_token = [], self._first_token(logits[0], settings, generator)
        else:
            result = ACCEPTANCE_RULES[settings.rule](
                logits, node_tokens[0], tree, q, settings.sampling, generator, settings.options
            )
            result_path, next_token = result.path, result.next_token
        keep = [0, *result_path]
        kv_cache.commit(state.cache, keep, prefix_len)
        state.hidden_states = self._kept_hidden(out, keep)
        accepted_tokens = node_tokens[0, result_path].tolist() if result_path else []
        emitted = self._cut(state, [*accepted_tokens, next_token], settings, max_length)
        state.append(0, emitted)
        depth = 0 if tree is None else tree.max_depth
        state.stats.record_step(len(emitted), len(result_path), depth)
        self.drafter.accepted(state, [len(result_path)])
        return emitted

    def _first_token(self, logits: torch.Tensor, settings: _Settings, generator: torch.Generator | None) -> int:
        """The base's own next token when nothing was drafted (plain decoding)."""
        if settings.sampling.greedy:
            return int(logits.argmax())
        return int(sample(probabilities(logits, settings.sampling), generator))

    def _cut(self, state: DecodeState, candidates: list[int], settings: _Settings, max_length: int | None) -> list[int]:
        """Stop at EOS (kept), at ``max_new_tokens`` and at the model's length limit."""
        generated = state.lengths[0] - state.prompt_lengths[0]
        budget = settings.max_new_tokens - generated
        if max_length is not None:
            budget = min(budget, max_length - state.lengths[0])
        emitted = []
        for token in candidates[:budget]:
            emitted.append(token)
            if token in settings.eos_token_ids:
                break
        if len(emitted) == budget or (emitted and emitted[-1] in settings.eos_token_ids):
            state.finished[0] = True
        return emitted

    def _forward(
        self,
        input_ids: torch.Tensor,
        cache: Any,
        mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        logits_to_keep: int = 0,
    ) -> Any:
        return self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            output_hidden_states=bool(self.drafter.hidden_state_layers),
            logits_to_keep=logits_to_keep,
            **kv_cache.forward_kwargs(self.model, cache),
        )

    def _kept_hidden(self, out: Any, keep: list[int] | None) -> tuple[torch.Tensor, ...]:
        if not self.drafter.hidden_state_layers:
            return ()
        index = slice(None) if keep is None else torch.tensor(keep)
        return tuple(out.hidden_states[layer][:, index] for layer in self.drafter.hidden_state_layers)

    # ------------------------------------------------------------------ argument checking
    def _encode(self, prompt: str | Sequence[int] | torch.Tensor) -> torch.Tensor:
        device = self.model.device
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a string prompt needs a tokenizer; pass tokenizer= or give token ids")
            if not prompt:
                raise ValueError("the prompt is empty")
            ids = torch.tensor([self.tokenizer(prompt)["input_ids"]], dtype=torch.long)
        elif isinstance(prompt, torch.Tensor):
            ids = prompt.long()
            if ids.dim() == 1:
                ids = ids[None]
            if ids.dim() != 2:
                raise ValueError(f"a tensor prompt must be [T] or [B, T], got shape {tuple(prompt.shape)}")
        else:
            ids = torch.tensor([list(prompt)], dtype=torch.long)
        if ids.shape[0] != 1:
            raise ValueError(f"batch size {ids.shape[0]} is not supported yet: generate takes one prompt [1, T]")
        if ids.shape[1] == 0:
            raise ValueError("the prompt is empty")
        vocab = self.model.get_output_embeddings().weight.shape[0]
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"prompt token ids must lie in [0, {vocab}); got {int(ids.min())}..{int(ids.max())}")
        return ids.to(device)

    def _settings(self, max_new_tokens: int, kwargs: dict[str, Any]) -> _Settings:
        known = {
            "temperature",
            "top_p",
            "top_k",
            "acceptance",
            "tree",
            "num_speculative_tokens",
            "eos_token_id",
            "seed",
            "posterior_threshold",
            "posterior_alpha",
            "acceptance_threshold",
            "alpha",
            *DYNAMIC_TREE_KWARGS,
        }
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"generate() got unknown arguments {unknown}; known: {sorted(known)}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        sampling = SamplingParams(kwargs.get("temperature", 0.0), kwargs.get("top_k", 0), kwargs.get("top_p", 1.0))
        rule = resolve_rule(kwargs.get("acceptance", "auto"), sampling)
        options = AcceptanceOptions(**{k: float(kwargs[k]) for k in vars(AcceptanceOptions()) if k in kwargs})
        generator = None
        if not sampling.greedy or rule != "greedy":
            generator = torch.Generator(device=self.model.device)
            seed = kwargs.get("seed")
            generator.manual_seed(seed) if seed is not None else generator.seed()
        tree = self._dynamic_tree(kwargs)
        request = DraftRequest(
            sampling=sampling,
            generator=generator,
            max_depth=0,
            num_speculative_tokens=kwargs.get("num_speculative_tokens"),
            tree=self._resolve_tree(tree) if tree is not None else None,
        )
        self.drafter.check_request(request)
        return _Settings(max_new_tokens, sampling, rule, options, self._eos_ids(kwargs.get("eos_token_id")), request)

    def _dynamic_tree(self, kwargs: dict[str, Any]) -> Any:
        """``tree="dynamic"`` with any of ``tree_top_k`` / ``depth`` / ``total_tokens`` set becomes a DynamicTree."""
        tree = kwargs.get("tree")
        given = {DYNAMIC_TREE_KWARGS[k]: kwargs[k] for k in DYNAMIC_TREE_KWARGS if kwargs.get(k) is not None}
        if not given:
            return tree
        if tree != "dynamic":
            raise ValueError(
                f"{sorted(k for k in DYNAMIC_TREE_KWARGS if k in kwargs)} set a dynamic tree: pass tree='dynamic'"
            )
        defaults = getattr(self.drafter, "dynamic", None)
        if not isinstance(defaults, DynamicTree):
            raise ValueError(f"tree='dynamic' (EAGLE-2) needs EAGLE heads; method {self.drafter.name!r} has none")
        return DynamicTree(**{**vars(defaults), **given})

    def _resolve_tree(self, tree: Any) -> Any:
        """Trees are data; ``"auto"`` asks the drafter for the tree calibrated for it."""
        resolve = getattr(self.drafter, "resolve", None)
        if resolve is not None:
            return resolve(tree)
        if tree == "auto":
            raise ValueError(f"tree='auto' is calibrated for draft heads; method {self.drafter.name!r} has none")
        return resolve_tree(tree)

    def _eos_ids(self, eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
        if eos_token_id is None:
            eos_token_id = getattr(self.model.generation_config, "eos_token_id", None)
        if eos_token_id is None and self.tokenizer is not None:
            eos_token_id = self.tokenizer.eos_token_id
        if eos_token_id is None:
            return frozenset()
        return frozenset([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)

    def _max_length(self) -> int | None:
        config = self.model.config
        for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    def _max_depth(self, state: DecodeState, max_new_tokens: int, max_length: int | None) -> int:
        """Deepest draft worth verifying: one token of the budget is the base's own."""
        remaining = max_new_tokens - (state.lengths[0] - state.prompt_lengths[0])
        if max_length is not None:
            remaining = min(remaining, max_length - state.lengths[0])
        return max(remaining - 1, 0)


def _tree_mask(tree_mask: torch.Tensor, prefix_len: int, device: torch.device) -> torch.Tensor:
    """``[1, 1, N + 1, prefix_len + N + 1]`` bool: every node sees the whole prefix and its own ancestors."""
    size = tree_mask.shape[0]
    prefix = torch.ones(size, prefix_len, dtype=torch.bool)
    return torch.cat([prefix, tree_mask], dim=1)[None, None].to(device)


def _heads_path(heads: str | Path | torch.nn.Module) -> str | Path | torch.nn.Module:
    """``"default"`` names the EAGLE-3 heads shipped with the embedded default model."""
    if isinstance(heads, str) and heads == "default":
        from specheads import assets

        path = Path(assets.resolve("default", role="eagle3"))
        if not (path / "config.json").is_file():
            raise assets.MissingAssetsError(
                f"the default EAGLE-3 heads are not in this install ({path}); train them with "
                "`specheads train --config configs/default/eagle3.yaml` and pass heads=<output dir>/heads"
            )
        return path
    return heads


def _heads_method(heads: str | Path | torch.nn.Module) -> str:
    """The head type of a heads module or checkpoint directory (its ``head_type``, or its engine layout's)."""
    if isinstance(heads, torch.nn.Module):
        return head_type_of(heads).name
    import json

    from specheads.export.formats import foreign_format

    directory = Path(_heads_path(heads))
    layout = foreign_format(directory) if directory.is_dir() else None
    if layout in ("eagle3", "speculators", "eagle", "medusa"):
        return "medusa" if layout == "medusa" else "eagle"
    try:
        return str(json.loads((directory / "config.json").read_text()).get("head_type", "medusa"))
    except (OSError, ValueError):
        return "medusa"  # the loader names what is wrong with the directory
