"""SpecDecoder: speculative decoding for any transformers causal LM, driven through its public forward.

The loop reads top to bottom::

    prefill -> loop { propose -> verify (one base forward over the tree) -> accept -> commit }

Tree attention is a 4D boolean mask ``[B, 1, q_len, kv_len]`` with explicit ``position_ids`` (prefix length +
depth); the base's own cache is extended by the verify forward and then compacted by :mod:`kv_cache`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specheads.inference import attention, construction, inputs, kv_cache
from specheads.inference.acceptance import (
    ACCEPTANCE_RULES,
    AcceptanceOptions,
    AcceptResult,
    greedy_batch,
    rejection_chain,
)
from specheads.inference.drafters import (
    Drafter,
    DraftModelDrafter,
    NoDrafter,
)
from specheads.inference.generation import GenerationConfig
from specheads.inference.lookup import PromptLookup, WithLookup, lookup_settings
from specheads.inference.packing import StepInputs, for_rows, pack_step, stacked_rows
from specheads.inference.sampling import SamplingParams, probabilities, sample
from specheads.inference.state import DecodeState, DraftRequest, Proposal
from specheads.inference.trees import family_of_kind
from specheads.loading import check_same_vocabulary, eos_token_ids
from specheads.metrics import SpecStats

PromptInput = inputs.PromptInput
ATTENTION_MODES = ("auto", "invariant", "model")


@dataclass
class GenerationOutput:
    """Result of :meth:`SpecDecoder.generate`.

    Attributes:
        sequences: ``[1, T + n]`` prompt followed by the new tokens.
        new_tokens: the n new tokens, ``n <= max_new_tokens``.
        text: the decoded new tokens when a tokenizer is known, else None.
        stats: statistics of the generation.
        finish_reason: ``"eos"``, ``"max_new_tokens"`` or ``"max_length"``: the model's position limit
            (``max_position_embeddings``) came before ``max_new_tokens``.
        tokens_cut: with ``"max_length"``, how many of the ``max_new_tokens`` asked for did not fit; else 0.
    """

    sequences: torch.Tensor
    new_tokens: list[int]
    text: str | None
    stats: SpecStats
    finish_reason: str = "max_new_tokens"
    tokens_cut: int = 0

    @classmethod
    def of_row(cls, state: DecodeState, row: int, max_new_tokens: int, tokenizer: Any) -> GenerationOutput:
        """The output of one finished row of ``state``."""
        new_tokens = state.new_tokens(row)
        text = tokenizer.decode(new_tokens, skip_special_tokens=True) if tokenizer is not None else None
        reason = state.finish_reasons[row] or "max_new_tokens"
        cut = max_new_tokens - len(new_tokens) if reason == "max_length" else 0
        return cls(state.sequence(row)[None].clone(), new_tokens, text, state.stats[row], reason, cut)


class BatchOutput(list):
    """What :meth:`SpecDecoder.generate` returns for a list of prompts: one :class:`GenerationOutput` per prompt, in
    order, and ``stats``, the batch's totals (tokens and steps summed over rows; times of the whole run)."""

    def __init__(self, outputs: list[GenerationOutput], stats: SpecStats) -> None:
        super().__init__(outputs)
        self.stats = stats


@dataclass(frozen=True)
class _Settings:
    """Validated arguments of one generate call."""

    max_new_tokens: int
    sampling: SamplingParams
    rule: str
    options: AcceptanceOptions
    eos_token_ids: frozenset[int]
    request: DraftRequest
    seed: int | list[int] | None = None

    @property
    def random(self) -> bool:
        """Whether rows draw random numbers (sampling, or a rule that draws at temperature 0)."""
        return not self.sampling.greedy or self.rule != "greedy"


class SpecDecoder:
    """Generate with a base model and a drafter; at temperature 0 the output equals the base's greedy output.

    Args:
        base_model: any ``AutoModelForCausalLM`` whose forward accepts a 4D attention mask and position ids.
        drafter: a :class:`~specheads.inference.drafters.Drafter`; None decodes plainly through the engine.
        tokenizer: used to encode string prompts and decode outputs.
        profile: on a GPU, synchronise around each step's drafting (proposing, and the drafter's update after the
            commit) so that the statistics' draft / verify split is exact. Off by default: a synchronisation per step
            stops the host running ahead of the device, and without it the split counts the host's time (on a CPU
            both are the same).
        attention: how the base computes while this decoder drives it. ``"invariant"``: batch-invariant (see
            :mod:`specheads.inference.attention`): a position's logits have the same bits whatever the number of
            tokens verified with it, the rows beside it and the cache's width, so that in bf16/fp16 every drafter's
            greedy output equals this engine's own one-token decoding (``method="none"``) token for token (a
            prompt is computed the model's own way, each alone: no step computes its positions again).
            ``"model"``: the model's own attention implementation. ``"auto"`` (default): invariant for a bf16/fp16
            base on a CPU, the model's own otherwise (in float32 that output equals transformers' greedy).
        prompt_lookup: compose prompt lookup with the drafter (:mod:`specheads.inference.lookup`): True for the
            default settings, or a :class:`~specheads.inference.lookup.PromptLookup`; each step's tree then holds the
            drafter's nodes and the lookup's continuations of each row's context, verified in one forward. Output
            is unchanged (lossless in every mode). False/None (default): the drafter alone. A settings' corpus
            (``PromptLookup.corpus``) is read and indexed here, once, with ``tokenizer``.
    """

    def __init__(
        self,
        base_model: PreTrainedModel,
        drafter: Drafter | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        profile: bool = False,
        attention: str = "auto",
        prompt_lookup: bool | PromptLookup | None = None,
    ) -> None:
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {list(ATTENTION_MODES)}, got {attention!r}")
        self.model = base_model.eval()
        self.profile = profile
        self.attention = attention
        if drafter is not None and not isinstance(drafter, Drafter):
            raise TypeError(f"drafter must be a specheads.inference.Drafter, got {type(drafter).__name__}")
        self.drafter = drafter if drafter is not None else NoDrafter()
        self.tokenizer = tokenizer
        if isinstance(self.drafter, DraftModelDrafter):
            check_same_vocabulary(self.model, self.drafter.model)
        settings = lookup_settings(prompt_lookup)
        if settings is not None:
            self.drafter = WithLookup(self.drafter, settings, tokenizer)

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
        attention: str = "auto",
        prompt_lookup: bool | PromptLookup | None = None,
        lookup_corpus: str | Path | Sequence[Sequence[int]] | None = None,
    ) -> SpecDecoder:
        """Load a base (and a drafter) by name or path, or wrap models already in memory.

        ``method`` is inferred when None: ``"draft"`` with a draft model, else the head type of ``heads`` (any
        registry entry's name, ``"medusa"``, ``"eagle"``, ``"dflash"``, ...: read from a native checkpoint's config,
        or the method whose registry entry lists a foreign folder's layout), ``"none"`` otherwise.
        ``heads="default"`` with ``base="default"`` are the EAGLE-3 heads shipped for the embedded default model (see
        :mod:`specheads.inference.construction`). ``dtype="auto"`` is :func:`specheads.loading.resolve_dtype`'s
        choice (bf16 on a CPU with native bf16 products for a bf16 or GGUF checkpoint, else the checkpoint's dtype);
        heads and draft models follow the base's dtype. ``attention``: see the class. ``prompt_lookup``: see the
        class; True takes the lookup settings calibrated with the heads (``calibrate --prompt-lookup``) when their
        calibration holds some, else the defaults. ``lookup_corpus``: those settings with a corpus of earlier outputs
        (``PromptLookup.corpus``: a JSONL file or token lists); implies ``prompt_lookup=True`` when it is off.
        """
        base_model, drafter, loaded_tokenizer = construction.build(
            base, heads, draft_model, method, tokenizer, dtype, device, num_speculative_tokens
        )
        if prompt_lookup is True or (lookup_corpus is not None and not prompt_lookup):
            prompt_lookup = construction.calibrated_lookup(drafter) or True
        if lookup_corpus is not None:
            prompt_lookup = dataclasses.replace(lookup_settings(prompt_lookup), corpus=lookup_corpus)
        return cls(base_model, drafter, loaded_tokenizer, attention=attention, prompt_lookup=prompt_lookup)

    # ------------------------------------------------------------------ public API
    def generate(
        self,
        prompt: PromptInput | Sequence[PromptInput],
        max_new_tokens: int | None = None,
        batch_size: int | None = None,
        generation_config: GenerationConfig | None = None,
        **kwargs: Any,
    ) -> GenerationOutput | BatchOutput:
        """Generate up to ``max_new_tokens`` tokens (default 128) after ``prompt``, or after each prompt of a list.

        One prompt is a string (tokenised raw, with the tokenizer's special tokens), token ids (a list, or a ``[T]``
        / ``[1, T]`` tensor) or a conversation: a list of ``{"role", "content"}`` messages, roles ``system``,
        ``user``, ``assistant``, rendered by the tokenizer's chat template with the generation prompt and tokenised
        without added special tokens (the template writes its own BOS; see
        :func:`specheads.prompts.render_conversation`). A conversation needs a tokenizer with a chat template.

        A list of prompts (strings, token-id lists, tensors or conversations, one kind; or a ``[B, T]`` tensor) is
        decoded in batches of ``batch_size`` rows (None: all at once): every row drafts its own tree, accepts its own
        tokens and finishes on its own, and with ``seed`` (one int for every row, or a list: one per prompt) every
        row draws exactly what it would draw alone with that seed. It returns a :class:`BatchOutput`: one
        :class:`GenerationOutput` per prompt, in order, plus the batch's totals.

        How to generate is a :class:`~specheads.inference.generation.GenerationConfig`: ``generation_config``, with
        any of its fields given as keyword arguments on top (``temperature``, ``top_p``, ``top_k``, ``acceptance``,
        ``tree``, ``num_speculative_tokens``, ``eos_token_id``, ``seed``, the rule parameters, a grown tree's
        ``tree_top_k`` / ``depth`` / ``total_tokens``; see its attributes).

        Raises:
            TypeError: a keyword argument that is not a GenerationConfig field.
            ValueError: a bad prompt (empty, ids outside the vocabulary, a string or conversation without a
                tokenizer, a conversation on a tokenizer without a chat template, a message whose role is not
                ``system`` / ``user`` / ``assistant`` or whose content is not a string: the error names the message
                and, in a list, the prompt) or a bad generation argument.
        """
        prompts, batched = inputs.encode_prompts(prompt, self.tokenizer, self.model)
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if not batched and batch_size is not None:
            raise ValueError("batch_size applies to a list of prompts")
        if batched:  # every prompt before any compute, not chunk by chunk
            inputs.check_lengths(prompts, self._max_length())
        size = batch_size or len(prompts)
        outputs: list[GenerationOutput] = []
        start = time.perf_counter()
        totals = SpecStats()
        config = _config(generation_config, max_new_tokens, kwargs)
        seeds = config.seed
        if isinstance(seeds, (list, tuple)) and (not batched or len(seeds) != len(prompts)):
            raise ValueError(f"seed as a list needs one seed per prompt ({len(prompts)}), got {len(seeds)}")
        for first in range(0, len(prompts), size):
            state = None
            chunk_seed = list(seeds[first : first + size]) if isinstance(seeds, (list, tuple)) else seeds
            chunk = prompts[first : first + size]
            for step_state, _ in self._run(chunk, dataclasses.replace(config, seed=chunk_seed), first_index=first):
                state = step_state
            assert state is not None
            outputs += [
                GenerationOutput.of_row(state, row, config.max_new_tokens, self.tokenizer)
                for row in range(len(state.lengths))
            ]
            totals.draft_time_s += state.batch_draft_time_s
            totals.verify_time_s += state.batch_verify_time_s
        if not batched:
            return outputs[0]
        for output in outputs:
            merged = totals.merge(
                dataclasses.replace(output.stats, draft_time_s=0.0, verify_time_s=0.0, wall_time_s=0.0)
            )
            totals = merged
        totals.wall_time_s = time.perf_counter() - start
        return BatchOutput(outputs, totals)

    def check(self, generation_config: GenerationConfig | None = None, **kwargs: Any) -> GenerationConfig:
        """The generation settings :meth:`generate` would use with this decoder, checked without any compute: what
        ``generate`` refuses (an unknown keyword, a bad value, a tree the drafter cannot draft) is refused here."""
        config = GenerationConfig.from_kwargs(generation_config, **kwargs)
        self._settings(config)
        return config

    def stream(
        self,
        prompt: PromptInput,
        max_new_tokens: int | None = None,
        generation_config: GenerationConfig | None = None,
        **kwargs: Any,
    ) -> Generator[str, None, GenerationOutput]:
        """Yield decoded text pieces as tokens are accepted (same arguments as :meth:`generate`, one prompt: a
        string, token ids or one conversation).

        The generator's return value (``out = yield from decoder.stream(...)``, or ``StopIteration.value``) is the
        :class:`GenerationOutput`, with its statistics and ``finish_reason``."""
        if self.tokenizer is None:
            raise ValueError("stream() needs a tokenizer to decode text; pass tokenizer= or use generate()")
        prompts, batched = inputs.encode_prompts(prompt, self.tokenizer, self.model)
        if batched:
            raise ValueError("stream() takes one prompt; decode a list of prompts with generate()")
        return self._stream(prompts, _config(generation_config, max_new_tokens, kwargs))

    def _stream(self, prompts: list[torch.Tensor], config: GenerationConfig) -> Generator[str, None, GenerationOutput]:
        emitted_text = ""
        tokens: list[int] = []
        state = None
        for state, new in self._run(prompts, config):  # noqa: B007 - the last state is the result
            tokens.extend(new.get(0, []))
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for its remaining bytes
                continue
            if len(text) > len(emitted_text):
                yield text[len(emitted_text) :]
                emitted_text = text
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if len(text) > len(emitted_text):
            yield text[len(emitted_text) :]
        assert state is not None
        return GenerationOutput.of_row(state, 0, config.max_new_tokens, self.tokenizer)

    @property
    def batch_invariant(self) -> bool:
        """Whether the base runs batch-invariantly under this decoder (the ``attention`` argument, resolved)."""
        if self.attention == "auto":
            return attention.wants_invariance(self.model)
        return self.attention == "invariant"

    # ------------------------------------------------------------------ the loop
    def _run(
        self, prompts: list[torch.Tensor], config: GenerationConfig, first_index: int = 0
    ) -> Iterator[tuple[DecodeState, dict[int, list[int]]]]:
        """The prefill (the base's own computation, see :meth:`_prefill`), then the decode loop (see :meth:`_loop`)
        with the base switched to batch-invariant computation for its duration when :attr:`batch_invariant`
        (restored when the loop ends or its generator is closed)."""
        start = time.perf_counter()
        settings = self._settings(config)
        inputs.check_lengths(prompts, self._max_length(), first_index)
        state = self._prefill(prompts, settings)
        with attention.batch_invariant(self.model, self.batch_invariant):
            yield from self._loop(state, settings, start)

    @torch.inference_mode()
    def _loop(
        self, state: DecodeState, settings: _Settings, start: float
    ) -> Iterator[tuple[DecodeState, dict[int, list[int]]]]:
        max_length = self._max_length()
        self.drafter.reset(state)
        while state.rows:
            limits = [self._max_depth(state, row, settings.max_new_tokens, max_length) for row in state.rows]
            request = dataclasses.replace(
                settings.request,
                max_depth=max(limits),
                max_depths=tuple(limits),
            )
            tick = time.perf_counter()
            proposals = for_rows(self.drafter.propose(state, request), limits, state.batch_size)
            tock = self._clock(state)  # queued draft kernels count as draft time
            active = list(state.rows)
            emitted, catch_up = self._step(state, proposals, settings, max_length)
            tack = time.perf_counter()
            draft_s, verify_s = tock - tick + catch_up, tack - tock - catch_up  # the drafter's update is drafting
            state.batch_draft_time_s += draft_s
            state.batch_verify_time_s += verify_s
            for row in active:
                stats = state.stats[row]
                stats.draft_time_s += draft_s
                stats.verify_time_s += verify_s
                stats.wall_time_s = tack - start
            done = [i for i, row in enumerate(state.rows) if state.finished[row]]
            yield state, emitted
            if done:
                self._drop_rows(state, [i for i in range(len(state.rows)) if i not in done])

    def _max_length(self) -> int | None:
        return inputs.max_positions(self.model)

    def _clock(self, state: DecodeState) -> float:
        """``time.perf_counter()``, after the device's queued work when profiling on a GPU (see ``profile``)."""
        if self.profile and state.tokens.device.type == "cuda":
            torch.cuda.synchronize(state.tokens.device)
        return time.perf_counter()

    def _drop_rows(self, state: DecodeState, keep: list[int]) -> None:
        """Finished rows leave the batch: the cache, hidden states and drafter state keep only ``keep``."""
        if not keep:
            state.rows = []
            return
        kv_cache.keep_rows(state.cache, keep)
        if state.hidden_states:
            index = torch.tensor(keep, device=state.hidden_states[0].device)
            state.hidden_states = tuple(h[index] for h in state.hidden_states)
        state.hidden_counts = [state.hidden_counts[i] for i in keep] if state.hidden_counts else []
        state.rows = [state.rows[i] for i in keep]
        if state.rows:
            self.drafter.keep_rows(state, keep)

    @torch.inference_mode()
    def _prefill(self, prompts: list[torch.Tensor], settings: _Settings) -> DecodeState:
        """Run every prompt except its last token (each row's first root) through the base, one prompt at a time.

        The base computes a prompt its own way, not batch-invariantly (:meth:`_run`): no step computes a prompt
        position again, so every decoder reads the same cache of a prompt, and each prompt is computed alone, as in
        a batch of its own (a batch's cache is then stacked from its rows'). The token buffer and the cache hold what
        can be used: prompt + ``max_new_tokens``, but never more than the model's positions (generation stops there
        with ``"max_length"``), plus the cache's room for one verify step.
        """
        lengths = [int(ids.shape[1]) for ids in prompts]
        batch, longest = len(prompts), max(lengths)
        device = prompts[0].device
        slots = longest + settings.max_new_tokens
        max_length = self._max_length()
        if max_length is not None:
            slots = min(slots, max_length)
        capacity = slots + self._largest_step(settings) + 2
        tokens = torch.zeros(batch, slots, dtype=torch.long, device=device)
        for row, ids in enumerate(prompts):
            tokens[row, : lengths[row]] = ids[0]
        counts = [length - 1 for length in lengths]
        caches = [kv_cache.new_cache(1, capacity, device) for _ in prompts]
        hidden = [self._prefill_row(tokens[row : row + 1, : counts[row]], caches[row]) for row in range(batch)]
        cache = caches[0] if batch == 1 else kv_cache.stack_rows(caches)
        state = DecodeState(tokens, list(lengths), list(lengths), cache)
        state.host_tokens = [ids[0].tolist() for ids in prompts]
        seeds = settings.seed if isinstance(settings.seed, list) else [settings.seed] * batch
        state.generators = [self._generator(settings, seed) for seed in seeds]
        if self.drafter.hidden_state_layers and max(counts) > 0:
            state.hidden_states = tuple(stacked_rows(layer, max(counts)) for layer in zip(*hidden, strict=True))
        state.hidden_counts = counts if state.hidden_states else []
        return state

    def _prefill_row(self, ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor | None, ...]:
        """One prompt's tokens ``[1, n]`` into its own cache; the hidden states the drafter asked for (None each
        when n = 0)."""
        if ids.shape[1] == 0:
            return (None,) * len(self.drafter.hidden_state_layers)
        positions = torch.arange(ids.shape[1], device=ids.device)[None]
        # Only the cache and the kept hidden states are read: no [1, n, V] logits over the whole prompt.
        out = self._forward(ids, cache, None, positions, logits_to_keep=1)
        kv_cache.advance(cache, [ids.shape[1]])
        return self._kept_hidden(out, None)

    def _largest_step(self, settings: _Settings) -> int:
        """Tree nodes of the largest verify step (what the cache reserves beyond the generated tokens)."""
        tree = settings.request.tree
        if tree is None:
            return int(self.drafter.max_nodes(settings.request))
        return tree.num_nodes + self.drafter.extra_nodes(settings.request)

    def _step(
        self,
        state: DecodeState,
        proposals: list[Proposal | None] | Proposal,
        settings: _Settings,
        max_length: int | None,
    ) -> tuple[dict[int, list[int]], float]:
        """One step for every active row: pack, verify with one base forward, accept, commit.

        Returns the tokens each row emitted (by row), and the seconds the drafter spent taking the commit in (its
        ``accepted`` hook: draft work, such as an EAGLE head's fc over the base's new features, timed as drafting).
        """
        step = pack_step(state, proposals)
        out = self._forward(step.tokens, state.cache, step.mask, step.positions)
        results = self._accept(state, step, out.logits, settings)
        return self._commit(state, step, out, results, settings, max_length)

    def _accept(
        self, state: DecodeState, step: StepInputs, logits: torch.Tensor, settings: _Settings
    ) -> list[AcceptResult]:
        """Each row's accepted path and next token. Greedy rows read one ``[2, B, W]`` transfer for the batch."""
        if settings.rule == "greedy" or (settings.sampling.greedy and settings.rule == "typical"):
            return greedy_batch(logits, step.tokens, step.trees)
        results = []
        for i, (row, tree) in enumerate(zip(state.rows, step.trees, strict=True)):
            size = 1 if tree is None else tree.num_nodes + 1
            generator = state.generators[row]
            if tree is None:
                results.append(AcceptResult([], self._first_token(logits[i, 0], settings, generator)))
                continue
            rule = ACCEPTANCE_RULES[settings.rule]
            if settings.rule == "rejection" and tree.is_chain:
                rule = rejection_chain  # the same rule with one transfer for the whole chain
            results.append(
                rule(
                    logits[i, :size],
                    step.tokens[i, :size],
                    tree,
                    step.draft_probs[i],
                    settings.sampling,
                    generator,
                    settings.options,
                )
            )
        return results

    def _commit(
        self,
        state: DecodeState,
        step: StepInputs,
        out: Any,
        results: list[AcceptResult],
        settings: _Settings,
        max_length: int | None,
    ) -> tuple[dict[int, list[int]], float]:
        """Write each row's emitted tokens, keep its accepted slots and hidden states, tell the drafter.

        Returns the tokens each row emitted and the seconds the drafter's ``accepted`` took (see :meth:`_step`).
        """
        keeps, emitted_by_row = [], {}
        for i, (row, tree, result) in enumerate(zip(state.rows, step.trees, results, strict=True)):
            keeps.append([0, *result.path])
            accepted = result.accepted
            if accepted is None:
                accepted = step.tokens[i, result.path].tolist() if result.path else []
            emitted = self._cut(state, row, [*accepted, result.next_token], settings, max_length)
            state.stats[row].record_step(len(emitted), len(result.path), 0 if tree is None else tree.max_depth)
            emitted_by_row[row] = emitted
        state.append_rows(emitted_by_row)
        kv_cache.commit(state.cache, keeps)
        state.hidden_states = self._kept_hidden(out, keeps)
        state.hidden_counts = [len(keep) for keep in keeps] if state.hidden_states else []
        start = self._clock(state)  # the commit's queued kernels are verification
        self.drafter.accepted(state, [len(keep) - 1 for keep in keeps])
        return emitted_by_row, self._clock(state) - start

    def _first_token(self, logits: torch.Tensor, settings: _Settings, generator: torch.Generator | None) -> int:
        """The base's own next token when nothing was drafted (plain decoding)."""
        if settings.sampling.greedy:
            return int(logits.argmax())
        return int(sample(probabilities(logits, settings.sampling), generator))

    def _cut(
        self, state: DecodeState, row: int, candidates: list[int], settings: _Settings, max_length: int | None
    ) -> list[int]:
        """Stop at EOS (kept), at ``max_new_tokens`` and at the model's length limit."""
        generated = state.lengths[row] - state.prompt_lengths[row]
        budget = settings.max_new_tokens - generated
        reason = "max_new_tokens"
        if max_length is not None and max_length - state.lengths[row] < budget:
            budget, reason = max_length - state.lengths[row], "max_length"
        emitted = []
        for token in candidates[:budget]:
            emitted.append(token)
            if token in settings.eos_token_ids:
                break
        if emitted and emitted[-1] in settings.eos_token_ids:
            state.finished[row], state.finish_reasons[row] = True, "eos"
        elif len(emitted) == budget:
            state.finished[row], state.finish_reasons[row] = True, reason
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

    def _kept_hidden(self, out: Any, keeps: list[list[int]] | None) -> tuple[torch.Tensor, ...]:
        """The hidden states of the tokens that entered the cache: all fed (prefill) or each row's kept nodes."""
        if not self.drafter.hidden_state_layers:
            return ()
        if keeps is None:
            return tuple(out.hidden_states[layer] for layer in self.drafter.hidden_state_layers)
        if len(keeps) == 1 and keeps[0] == list(range(len(keeps[0]))):  # one row, a chain prefix: a slice
            return tuple(out.hidden_states[layer][:, : len(keeps[0])] for layer in self.drafter.hidden_state_layers)
        longest = max(len(keep) for keep in keeps)
        index = [keep + [keep[-1]] * (longest - len(keep)) for keep in keeps]
        kept, on_device = [], {}
        for layer in self.drafter.hidden_state_layers:  # layers may sit on different devices (device_map)
            hidden = out.hidden_states[layer]
            if hidden.device not in on_device:
                rows = torch.arange(len(keeps), device=hidden.device)[:, None]
                on_device[hidden.device] = (rows, kv_cache.to_device(index, hidden.device))
            kept.append(hidden[on_device[hidden.device]])
        return tuple(kept)

    def _generator(self, settings: _Settings, seed: int | None) -> torch.Generator | None:
        """A row's random source: seeded with ``seed``, so a row draws the same alone or in any batch."""
        if not settings.random:
            return None
        generator = torch.Generator(device=self.model.device)
        if seed is not None:
            generator.manual_seed(seed)
        else:
            generator.seed()
        return generator

    # ------------------------------------------------------------------ argument checking
    def _settings(self, config: GenerationConfig) -> _Settings:
        """What the engine reads of ``config`` for this decoder's drafter (checked by the drafter before compute)."""
        sampling, rule = config.sampling, config.rule
        tree = self._sized_tree(config)
        request = DraftRequest(
            sampling=sampling,
            max_depth=0,
            num_speculative_tokens=config.num_speculative_tokens,
            tree=self._resolve_tree(tree) if tree is not None else None,
        )
        self.drafter.check_request(request)
        if rule == "alpha" and not self.drafter.gives_draft_probs(request):
            raise ValueError(
                f"acceptance='alpha' needs draft probabilities, which method {self.drafter.name!r} does not give at "
                f"temperature {sampling.temperature} (its proposals are deterministic and would all pass unverified); "
                "use a draft model at temperature > 0, or 'typical' or 'threshold'"
            )
        eos = self._eos_ids(config.eos_token_id)
        return _Settings(config.max_new_tokens, sampling, rule, config.options, eos, request, config.seed)

    def _sized_tree(self, config: GenerationConfig) -> Any:
        """A grown tree's bare kind with size keywords set (``tree_top_k`` / ``depth`` / ``total_tokens``): the
        drafter's own tree of that kind, resized by the kind's family (:meth:`TreeFamily.override`); else
        ``config.tree`` as it is. A drafter that does not grow the kind refuses it when asked for its own."""
        given = config.tree_overrides
        if not given:
            return config.tree
        family = family_of_kind(config.tree)  # GenerationConfig checked that the kind's family takes every keyword
        fields = {family.overrides[keyword]: value for keyword, value in given.items()}
        return family.override(self.drafter.resolve(config.tree), fields)

    def _resolve_tree(self, tree: Any) -> Any:
        """Trees are data; ``"auto"`` asks the drafter for the tree calibrated for it."""
        if isinstance(tree, (list, tuple)) and not tree:
            raise ValueError("tree=[] drafts nothing; use method 'none' for plain decoding")
        return self.drafter.resolve(tree)

    def _eos_ids(self, eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
        return eos_token_ids(self.model, self.tokenizer, eos_token_id)

    def _max_depth(self, state: DecodeState, row: int, max_new_tokens: int, max_length: int | None) -> int:
        """Deepest draft worth verifying for ``row``: one token of the budget is the base's own."""
        remaining = max_new_tokens - (state.lengths[row] - state.prompt_lengths[row])
        if max_length is not None:
            remaining = min(remaining, max_length - state.lengths[row])
        return max(remaining - 1, 0)


def _config(base: GenerationConfig | None, max_new_tokens: int | None, kwargs: dict[str, Any]) -> GenerationConfig:
    """``base`` (or the defaults) with ``max_new_tokens`` and the keyword arguments on top."""
    if max_new_tokens is not None:
        kwargs = {"max_new_tokens": max_new_tokens, **kwargs}
    return GenerationConfig.from_kwargs(base, **kwargs)
