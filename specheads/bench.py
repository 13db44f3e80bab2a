"""``specheads bench``: every method side by side with transformers' own generation, in one process.

Methods run interleaved over the prompts (the order rotates from prompt to prompt and from repeat to repeat), so that
a noisy, shared machine slows all of them alike; the per-prompt spread of each speed-up is reported next to the
totals so that noise shows in the report rather than in the conclusion.

At a batch size B > 1 the prompts are split into consecutive groups of B (the last one may be smaller; with
categories, the groups of each category) and the group
takes the place of the prompt: each method decodes the whole group in one call, the methods interleaved from group to
group. ``hf-greedy`` then runs transformers' batched ``generate`` on the left-padded group, its rows cut after their
first EOS as specheads cuts them; tokens/s is the group's new tokens over the call's wall time, and a speed-up always
compares with ``hf-greedy`` at the same batch size. transformers' assisted generation takes one sequence at a time, so
``hf-assisted`` and ``hf-prompt-lookup`` run at batch size 1 only. Batch sizes run one after another.

Prompt files with conversations are rendered by the chat template and tokenised once, the way the decoder does
(:func:`specheads.prompts.prompt_token_ids`). Multi-turn prompts (MT-Bench's ``"turns"``) run both turns, as EAGLE's
and Spec-Bench's scripts do: turn 2 is asked after the model's own turn-1 answer, which at temperature 0 is the
base's greedy answer, so it is computed once by the reference (``hf-greedy``) and every method is given the same
turn-2 prompt; both turns are timed, counted and compared with greedy. Prompts with a ``"category"`` are grouped by
category and the report adds a per-category table (speed-up and tau per category, Spec-Bench's shape).

Baselines: ``hf-greedy`` (``generate(do_sample=False)``, the denominator of every speed-up), ``hf-assisted``
(``assistant_model=`` the same draft model, when one is given) and ``hf-prompt-lookup``
(``prompt_lookup_num_tokens=``). specheads methods: ``none``, ``draft-k{K}``, ``draft-adaptive``, ``prompt-lookup``
and, for each ``--heads`` checkpoint, ``<head type>-<tree>`` (e.g. ``medusa-chain-3``, ``eagle-dynamic``,
``eagle-auto``); with ``--prompt-lookup``, each of them but ``prompt-lookup`` also with prompt lookup composed
(``none+lookup``, ``draft-k3+lookup``, ``eagle-dynamic+lookup``, ...), and with ``--lookup-corpus`` a corpus of
earlier outputs in their index. Rows with statistics report the per-step draft and verify time, which says which
tree size pays. The report's text and figure are :mod:`specheads.bench_report`'s.
"""

from __future__ import annotations

import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specheads.inference.construction import calibrated_lookup
from specheads.inference.decoder import SpecDecoder
from specheads.inference.drafters import Drafter, DraftModelDrafter, NoDrafter, PromptLookupDrafter
from specheads.inference.lookup import lookup_settings
from specheads.loading import eos_token_ids, pad_token_id
from specheads.machine import MachineLoad
from specheads.metrics import SpecStats
from specheads.options import BenchOptions
from specheads.prompts import Prompt, prompt_token_ids
from specheads.registry import head_type_of


@dataclass
class GroupRun:
    """What one call on a group of prompts returned.

    Attributes:
        tokens: each row's new tokens, up to and including its first EOS.
        stats: the group's statistics (specheads methods): tokens and steps summed over the rows, times of the call.
        batch_steps: batched verification forwards of the call (the longest row's steps).
    """

    tokens: list[list[int]]
    stats: SpecStats | None = None
    batch_steps: int = 0


RunFn = Callable[[list[torch.Tensor], int], GroupRun]


@dataclass
class BenchRuns:
    """Everything one method measured at one batch size: per call, its new tokens, wall time, the category of its
    prompts, its statistics and output keys; per request (a prompt's turn), its output, keyed by ``(repeat,
    request index)`` (see :func:`run_bench`)."""

    new_tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    outputs: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    stats: SpecStats = field(default_factory=SpecStats)
    batch_steps: int = 0
    call_categories: list[str | None] = field(default_factory=list)
    call_stats: list[SpecStats | None] = field(default_factory=list)
    call_keys: list[list[tuple[int, int]]] = field(default_factory=list)


@dataclass(frozen=True)
class BenchGroup:
    """Requests decoded together in one call: their indices (output keys), ``[1, T]`` inputs and category."""

    requests: list[int]
    inputs: list[torch.Tensor]
    category: str | None = None


@dataclass
class BenchMethod:
    """One row of the report: a name and a function ``(group of input_ids [1, T], max_new_tokens) -> GroupRun``.

    ``runs`` holds the measurements by batch size; ``batched`` is False for methods that decode one prompt at a time.
    ``exact_reference``: this row's outputs are what every lossless row must equal (the engine's own one-token
    decoding on a batch-invariant bf16/fp16 base, see :func:`exactness_reference`).
    """

    name: str
    run: RunFn
    has_stats: bool = False
    batched: bool = True
    runs: dict[int, BenchRuns] = field(default_factory=dict)
    exact_reference: bool = False

    @property
    def outputs(self) -> dict[tuple[int, int], list[int]]:
        """Outputs at the first batch size measured, by ``(repeat, prompt index)``."""
        return self.runs[next(iter(self.runs))].outputs


def _hf_runner(model: PreTrainedModel, pad_token_id: int, **generate_kwargs: Any) -> RunFn:
    eos = eos_token_ids(model)

    def run(group: list[torch.Tensor], max_new_tokens: int) -> GroupRun:
        input_ids, attention_mask = _left_padded([ids.to(model.device) for ids in group], pad_token_id)
        out = model.generate(
            input_ids,
            attention_mask=attention_mask,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_token_id,
            **generate_kwargs,
        )  # [B, T + n]: finished rows are padded after their EOS
        return GroupRun([_cut_at_eos(row, eos) for row in out[:, input_ids.shape[1] :].tolist()])

    return run


def _own_assisted_call_warning(record: logging.LogRecord) -> bool:
    """Drop the deprecation warning transformers' assisted generation raises about its own call (its candidate
    generator passes the assistant both ``generation_config`` and generation keywords); it says nothing about ours."""
    return "together with generation-related arguments" not in record.getMessage()


def _left_padded(group: list[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [B, T], attention_mask [B, T])`` of prompts ``[1, T_i]``, padded on the left to the longest."""
    longest = max(ids.shape[1] for ids in group)
    input_ids = torch.full((len(group), longest), pad_token_id, dtype=torch.long, device=group[0].device)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(group):
        input_ids[row, longest - ids.shape[1] :] = ids[0]
        attention_mask[row, longest - ids.shape[1] :] = 1
    return input_ids, attention_mask


def _cut_at_eos(tokens: list[int], eos_ids: frozenset[int]) -> list[int]:
    """``tokens`` up to and including the first EOS (all of them when there is none)."""
    for position, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: position + 1]
    return tokens


def _spec_runner(decoder: SpecDecoder, **generate_kwargs: Any) -> RunFn:
    def run(group: list[torch.Tensor], max_new_tokens: int) -> GroupRun:
        if len(group) == 1:  # a single prompt, as before batching existed
            out = decoder.generate(group[0], max_new_tokens=max_new_tokens, **generate_kwargs)
            return GroupRun([out.new_tokens], out.stats, out.stats.steps)
        batch = decoder.generate(group, max_new_tokens=max_new_tokens, **generate_kwargs)
        return GroupRun([out.new_tokens for out in batch], batch.stats, max(out.stats.steps for out in batch))

    return run


def _lookup_row(
    base: PreTrainedModel,
    name: str,
    drafter: Drafter,
    corpus: Sequence[Sequence[int]] | None = None,
    skip_drafter_at: int | None = None,
    **generate_kwargs: Any,
) -> BenchMethod:
    """The ``<name>+lookup`` row: ``drafter`` with prompt lookup composed, in the settings calibrated with its heads
    (``calibrate --prompt-lookup``), else the defaults (what ``from_pretrained(..., prompt_lookup=True)`` takes),
    with ``corpus`` (token lists) in its index when given. With ``skip_drafter_at``, the ``<name>+lookup-skip`` row:
    those settings, where a suffix match of at least that length makes the drafter skip the step
    (``PromptLookup.skip_drafter_at``)."""
    settings = lookup_settings(calibrated_lookup(drafter) or True)
    if corpus is not None:
        settings = replace(settings, corpus=corpus)
    suffix = "+lookup"
    if skip_drafter_at is not None:
        settings = replace(settings, skip_drafter_at=max(skip_drafter_at, settings.min_ngram))
        suffix = "+lookup-skip"
    decoder = SpecDecoder(base, drafter, prompt_lookup=settings)
    return BenchMethod(f"{name}{suffix}", _spec_runner(decoder, **generate_kwargs), has_stats=True)


def build_methods(
    base: PreTrainedModel,
    draft: PreTrainedModel | None,
    draft_ks: Sequence[int] = (1, 3, 5, 8),
    lookup_k: int = 10,
    only: Sequence[str] | None = None,
    draft_confidence: float = 0.4,
    heads: Sequence[tuple[str, torch.nn.Module]] = (),
    trees: dict[str, Sequence[str]] | None = None,
    prompt_lookup: bool = False,
    lookup_corpus: Sequence[Sequence[int]] | None = None,
    skip_drafter_at: int | None = None,
) -> list[BenchMethod]:
    """The methods of a benchmark run; ``hf-greedy`` always comes first (it is the reference).

    ``draft-adaptive`` drafts up to ``max(draft_ks)`` tokens and stops when the draft's confidence in its token falls
    below ``draft_confidence`` (0.4 is transformers' initial ``assistant_confidence_threshold``). ``heads`` rows use
    ``trees[head type]`` (default: its registry entry's ``default_bench_trees()``); a tree the heads cannot decode is
    skipped.
    ``only`` keeps the rows it names, of every family: row names (``none``, ``draft-k3``, ``eagle-chain-3``, ...) or
    a ``heads`` label for all of its rows (``eagle``); ``hf-greedy`` and the exactness reference always run.

    ``prompt_lookup``: each specheads row but ``prompt-lookup`` gets a ``<row>+lookup`` row next to it, its drafter
    with prompt lookup composed (:func:`_lookup_row`): ``none+lookup``, ``draft-k3+lookup``, ``eagle-dynamic+lookup``,
    ...; ``only`` names them, or ``<label>+lookup`` (``eagle+lookup``) for all of a heads label's lookup rows.
    ``lookup_corpus``: token lists every lookup row's index also holds (``PromptLookup.corpus``).
    ``skip_drafter_at``: each drafter's lookup row gets a ``<row>+lookup-skip`` sibling (``only`` names them, or
    ``<label>+lookup-skip``), whose drafter skips the steps where the lookup matched at least that many tokens (does
    saving its drafting pay?).

    Raises:
        ValueError: ``only`` names no row and no label.
    """
    pad = pad_token_id(base)
    pad = 0 if pad is None else pad  # padded positions are masked: any id will do
    methods = [BenchMethod("hf-greedy", _hf_runner(base, pad))]
    if draft is not None:
        logging.getLogger("transformers.generation.utils").addFilter(_own_assisted_call_warning)
        methods.append(BenchMethod("hf-assisted", _hf_runner(base, pad, assistant_model=draft), batched=False))
    methods.append(
        BenchMethod("hf-prompt-lookup", _hf_runner(base, pad, prompt_lookup_num_tokens=lookup_k), batched=False)
    )
    plain = SpecDecoder(base, NoDrafter())
    methods.append(BenchMethod("none", _spec_runner(plain), has_stats=True, exact_reference=plain.batch_invariant))
    if prompt_lookup:
        methods.append(_lookup_row(base, "none", plain.drafter, lookup_corpus))
    if draft is not None:
        for k in draft_ks:
            decoder = SpecDecoder(base, DraftModelDrafter(draft, k))
            methods.append(BenchMethod(f"draft-k{k}", _spec_runner(decoder), has_stats=True))
            if prompt_lookup:
                methods.append(_lookup_row(base, f"draft-k{k}", decoder.drafter, lookup_corpus))
                if skip_drafter_at is not None:
                    methods.append(_lookup_row(base, f"draft-k{k}", decoder.drafter, lookup_corpus, skip_drafter_at))
        adaptive = DraftModelDrafter(draft, max(draft_ks), confidence_threshold=draft_confidence)
        methods.append(BenchMethod("draft-adaptive", _spec_runner(SpecDecoder(base, adaptive)), has_stats=True))
        if prompt_lookup:
            methods.append(_lookup_row(base, "draft-adaptive", adaptive, lookup_corpus))
            if skip_drafter_at is not None:
                methods.append(_lookup_row(base, "draft-adaptive", adaptive, lookup_corpus, skip_drafter_at))
    methods.append(
        BenchMethod("prompt-lookup", _spec_runner(SpecDecoder(base, PromptLookupDrafter(lookup_k))), has_stats=True)
    )
    labels = {}  # a heads row's name -> its heads' label
    for label, head_module in heads:
        head_type = head_type_of(head_module)
        for tree in (trees or {}).get(head_type.name, head_type.default_bench_trees()):
            drafter = head_type.make_drafter(head_module)
            decoder = SpecDecoder(base, drafter)
            try:
                decoder.check(tree=tree)  # the argument checks of generate, without any compute
            except ValueError:  # a tree these heads cannot decode (deeper than Medusa's heads, ...): no row
                continue
            methods.append(BenchMethod(f"{label}-{tree}", _spec_runner(decoder, tree=tree), has_stats=True))
            labels[methods[-1].name] = label
            if prompt_lookup:
                methods.append(_lookup_row(base, f"{label}-{tree}", drafter, lookup_corpus, tree=tree))
                labels[methods[-1].name] = f"{label}+lookup"
                if skip_drafter_at is not None:
                    methods.append(
                        _lookup_row(base, f"{label}-{tree}", drafter, lookup_corpus, skip_drafter_at, tree=tree)
                    )
                    labels[methods[-1].name] = f"{label}+lookup-skip"
    if only:
        available = [m.name for m in methods] + [label for label, _ in heads]
        available += [f"{label}+lookup" for label, _ in heads] if prompt_lookup else []
        available += [f"{label}+lookup-skip" for label, _ in heads] if prompt_lookup and skip_drafter_at else []
        unknown = sorted(set(only) - set(available))
        if unknown:
            raise ValueError(f"unknown bench methods {unknown}; available: {available}")
        wanted = set(only)
        methods = [
            m for m in methods if m.name == "hf-greedy" or m.exact_reference or {m.name, labels.get(m.name)} & wanted
        ]
    return methods


@torch.inference_mode()
def run_bench(
    methods: list[BenchMethod],
    prompts: Sequence[Prompt],
    tokenizer: PreTrainedTokenizerBase,
    max_new_tokens: int,
    repeats: int = 1,
    progress: bool = True,
    batch_sizes: Sequence[int] = (1,),
) -> None:
    """Run every method on every group of up to ``batch_size`` prompts, interleaved, for each batch size in turn;
    results accumulate in ``method.runs[batch_size]``. Methods that are not ``batched`` run at batch size 1 only.

    Prompts are tokenised by :func:`specheads.prompts.prompt_token_ids` (conversations through the chat template,
    without a second BOS). Groups are consecutive prompts of one category (all of them, for a file without
    categories), so every call belongs to one row of the per-category table.

    Multi-turn prompts (``Prompt.followups``, MT-Bench's second turns) run turn by turn, as EAGLE's and Spec-Bench's
    MT-Bench scripts do: turn 1 of every prompt at every batch size, then turn 2 of those that have one, ... Turn
    k + 1 is asked after the reference's answers (:func:`exactness_reference`: hf-greedy, or ``none`` on a bf16
    base; at the first batch size and first repeat; decoded without special tokens, stripped) to turns 1..k: at
    temperature 0 that is every lossless method's own answer, and every method is given the same prompts, so outputs
    compare like with like. Outputs are keyed by
    ``(repeat, request)``, requests numbered turn after turn (turn 1's request i is prompt i).
    """
    answers: list[list[str]] = [[] for _ in prompts]
    first_request = 0
    turns = max(prompt.num_turns for prompt in prompts)
    for turn in range(turns):
        asked = [i for i, prompt in enumerate(prompts) if prompt.num_turns > turn]
        inputs = [torch.tensor([prompt_token_ids(tokenizer, prompts[i], answers[i])]) for i in asked]
        categories = [prompts[i].category for i in asked]
        for batch_size in batch_sizes:
            groups = _groups(inputs, categories, batch_size, first_request)
            labels = [f"turn {turn + 1}"] if turns > 1 else []
            labels += [f"batch size {batch_size}"] if len(batch_sizes) > 1 else []
            description = ", ".join(["bench", *labels])
            _run_groups(methods, groups, batch_size, max_new_tokens, repeats, turn == 0, description, progress)
        if turn + 1 < turns:
            reference = exactness_reference(methods).runs[batch_sizes[0]].outputs
            for offset, i in enumerate(asked):
                tokens = reference[(0, first_request + offset)]
                answers[i].append(tokenizer.decode(tokens, skip_special_tokens=True).strip())
        first_request += len(asked)


def exactness_reference(methods: list[BenchMethod]) -> BenchMethod:
    """The row every lossless row's output must equal: ``hf-greedy`` (transformers' greedy, ``methods[0]``) for a
    float32 base; the engine's own one-token decoding (``none``) for a bf16/fp16 base run batch-invariantly, where
    transformers' greedy, through another attention kernel, is not the same function of the weights. Later turns of
    multi-turn prompts are asked after this row's answers."""
    return next((method for method in methods if method.exact_reference), methods[0])


def _groups(
    inputs: list[torch.Tensor], categories: list[str | None], batch_size: int, first_request: int
) -> list[BenchGroup]:
    """Consecutive requests of one category in groups of ``batch_size`` (a category's last group may be smaller)."""
    by_category: dict[str | None, list[int]] = {}
    for position, category in enumerate(categories):
        by_category.setdefault(category, []).append(position)
    groups = []
    for category, positions in by_category.items():
        for start in range(0, len(positions), batch_size):
            chunk = positions[start : start + batch_size]
            groups.append(BenchGroup([first_request + p for p in chunk], [inputs[p] for p in chunk], category))
    return groups


def _run_groups(
    methods: list[BenchMethod],
    groups: list[BenchGroup],
    batch_size: int,
    max_new_tokens: int,
    repeats: int,
    warm_up: bool,
    description: str,
    progress: bool,
) -> None:
    """Every active method on every group, ``repeats`` times, the method order rotating from call to call."""
    active = [m for m in methods if m.batched or batch_size == 1]
    if warm_up:  # first-call allocations and lazy initialisation stay out of the timings
        for method in active:
            method.runs[batch_size] = BenchRuns()
            method.run(groups[0].inputs, min(8, max_new_tokens))
    jobs = [(r, g) for r in range(repeats) for g in range(len(groups))]
    # One tick per timed call, the running method named: a slow method shows as such, not as a frozen bar.
    with tqdm(total=len(jobs) * len(active), desc=description, unit="run", disable=not progress) as bar:
        for repeat, index in jobs:
            shift = (index + repeat) % len(active)
            group = groups[index]
            keys = [(repeat, request) for request in group.requests]
            for method in active[shift:] + active[:shift]:
                bar.set_postfix_str(method.name, refresh=True)
                _record(method.runs[batch_size], method.run, group, max_new_tokens, keys)
                bar.update()


def _record(runs: BenchRuns, run: RunFn, group: BenchGroup, max_new_tokens: int, keys: list[tuple[int, int]]) -> None:
    """Time one call on ``group`` and add what it returned to ``runs``."""
    start = time.perf_counter()
    result = run(group.inputs, max_new_tokens)
    runs.seconds.append(time.perf_counter() - start)
    runs.new_tokens.append(sum(len(tokens) for tokens in result.tokens))
    runs.outputs.update(zip(keys, result.tokens, strict=True))
    runs.call_categories.append(group.category)
    runs.call_stats.append(result.stats)
    runs.call_keys.append(keys)
    if result.stats is not None:
        runs.stats = runs.stats.merge(result.stats)
        runs.batch_steps += result.batch_steps


def summarize(methods: list[BenchMethod], batch_size: int | None = None) -> list[dict[str, Any]]:
    """Per-method rows of the report at ``batch_size`` (default: the first measured).

    Each row: ``tokens_per_s`` (new tokens over wall time, every call summed), ``speedup`` (over ``hf-greedy``'s
    tokens/s), ``speedup_per_prompt_median`` and ``_iqr`` (the same ratio per call, so noise shows), ``tau``
    (``mean_accepted_length``, new tokens per verification step; README "Numbers"), ``acceptance_rate_by_position``,
    ``matches_greedy``, ``draft_ms_per_step`` / ``verify_ms_per_step`` and ``new_tokens``.

    At a batch size above 1 the per-prompt spread is per group, step times are per batched step, and each row also
    says whether its outputs equal ``hf-greedy``'s at that batch size (``matches_batched_greedy``) and at batch size
    1 (``matches_unbatched_greedy``, None when batch size 1 was not measured); ``matches_greedy`` holds when every
    output equals one of the two (left padding may move fp32 logits in their last bits).
    """
    if batch_size is None:
        batch_size = next(iter(methods[0].runs))
    reference = methods[0].runs[batch_size]
    exact = exactness_reference(methods)
    exact_runs, exact_unbatched = exact.runs[batch_size], exact.runs.get(1) if batch_size > 1 else None
    unbatched = methods[0].runs.get(1) if batch_size > 1 else None
    reference_rates = [n / s for n, s in zip(reference.new_tokens, reference.seconds, strict=True)]
    reference_tps = sum(reference.new_tokens) / sum(reference.seconds)
    rows = []
    for method in methods:
        runs = method.runs.get(batch_size)
        if runs is None:  # a method that decodes one prompt at a time
            continue
        rates = [n / s for n, s in zip(runs.new_tokens, runs.seconds, strict=True)]
        per_call = [r / g for r, g in zip(rates, reference_rates, strict=True)]
        quartiles = statistics.quantiles(per_call, n=4) if len(per_call) >= 2 else [per_call[0]] * 3
        tokens_per_s = sum(runs.new_tokens) / sum(runs.seconds)
        row = {
            "name": method.name,
            "tokens_per_s": tokens_per_s,
            "speedup": tokens_per_s / reference_tps,
            "speedup_per_prompt_median": statistics.median(per_call),
            "speedup_per_prompt_iqr": [quartiles[0], quartiles[2]],
            "mean_accepted_length": runs.stats.mean_accepted_length if method.has_stats else None,
            "acceptance_rate_by_position": runs.stats.acceptance_rate_by_position if method.has_stats else None,
            "matches_greedy": _matches(runs, exact_runs, exact_unbatched),
            "wall_time_s": sum(runs.seconds),
            "draft_ms_per_step": _per_step_ms(method, runs, "draft_time_s"),
            "verify_ms_per_step": _per_step_ms(method, runs, "verify_time_s"),
            "new_tokens": sum(runs.new_tokens),
        }
        if exact is not methods[0]:
            row["matches_hf_greedy"] = _matches(runs, reference, unbatched)
            same = sum(runs.outputs[key] == reference.outputs[key] for key in reference.outputs)
            row["outputs_equal_to_hf_greedy"] = [same, len(reference.outputs)]
        if batch_size > 1:
            row["batch_size"] = batch_size
            row["matches_batched_greedy"] = _matches(runs, exact_runs)
            row["matches_unbatched_greedy"] = None if exact_unbatched is None else _matches(runs, exact_unbatched)
        rows.append(row)
    return rows


def _matches(
    runs: BenchRuns,
    reference: BenchRuns,
    other: BenchRuns | None = None,
    keys: Sequence[tuple[int, int]] | None = None,
) -> bool:
    """Every output (of ``keys``, default all) equals the reference's output of the same request (or ``other``'s,
    when given): every turn of every prompt."""
    return all(
        runs.outputs[key] == reference.outputs[key] or (other is not None and runs.outputs[key] == other.outputs[key])
        for key in (reference.outputs if keys is None else keys)
    )


def summarize_categories(methods: list[BenchMethod], batch_size: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per category (in the order the prompts give them), the rows of the methods at ``batch_size`` (default: the
    first measured) on that category's calls alone, every turn included, as Spec-Bench tabulates MT-Bench.

    Each row: ``name``, ``tokens_per_s``, ``speedup`` (over ``hf-greedy``'s tokens/s on the same category),
    ``mean_accepted_length`` (tau; None for transformers' rows), ``matches_greedy`` (as in :func:`summarize`) and
    ``new_tokens``. Calls of prompts without a category are under ``"uncategorised"``. Empty when no prompt has a
    category.
    """
    if batch_size is None:
        batch_size = next(iter(methods[0].runs))
    reference = methods[0].runs[batch_size]
    exact = exactness_reference(methods)
    exact_runs, exact_unbatched = exact.runs[batch_size], exact.runs.get(1) if batch_size > 1 else None
    categories = list(dict.fromkeys(reference.call_categories))
    if categories == [None]:
        return {}
    table: dict[str, list[dict[str, Any]]] = {}
    for category in categories:
        calls = [i for i, c in enumerate(reference.call_categories) if c == category]
        reference_tps = sum(reference.new_tokens[i] for i in calls) / sum(reference.seconds[i] for i in calls)
        rows = []
        for method in methods:
            runs = method.runs.get(batch_size)
            if runs is None:
                continue
            mine = [i for i, c in enumerate(runs.call_categories) if c == category]
            tokens_per_s = sum(runs.new_tokens[i] for i in mine) / sum(runs.seconds[i] for i in mine)
            stats = SpecStats()
            for i in mine:
                stats = stats.merge(runs.call_stats[i] or SpecStats())
            keys = [key for i in mine for key in runs.call_keys[i]]
            rows.append(
                {
                    "name": method.name,
                    "tokens_per_s": tokens_per_s,
                    "speedup": tokens_per_s / reference_tps,
                    "mean_accepted_length": stats.mean_accepted_length if method.has_stats else None,
                    "matches_greedy": _matches(runs, exact_runs, exact_unbatched, keys),
                    "new_tokens": sum(runs.new_tokens[i] for i in mine),
                }
            )
        table["uncategorised" if category is None else category] = rows
    return table


def _per_step_ms(method: BenchMethod, runs: BenchRuns, field_name: str) -> float | None:
    if not method.has_stats or not runs.batch_steps:
        return None
    return 1000.0 * getattr(runs.stats, field_name) / runs.batch_steps


def skipped_note(methods: list[BenchMethod], batch_sizes: Sequence[int]) -> str | None:
    """The report's note on methods that ran at batch size 1 only (None when none was skipped)."""
    skipped = [m.name for m in methods if not m.batched]
    above_one = [str(size) for size in batch_sizes if size > 1]
    if not skipped or not above_one:
        return None
    return (
        f"{', '.join(skipped)}: skipped at batch size {', '.join(above_one)} (transformers' assisted generation "
        "decodes one sequence at a time)"
    )


def model_info(model: PreTrainedModel, name: str) -> dict[str, Any]:
    config = model.config
    return {
        "name_or_path": name,
        "architectures": getattr(config, "architectures", None),
        "parameters": sum(p.numel() for p in model.parameters()),
        "num_hidden_layers": getattr(config, "num_hidden_layers", None),
        "hidden_size": getattr(config, "hidden_size", None),
        "vocab_size": getattr(config, "vocab_size", None),
        "dtype": str(next(model.parameters()).dtype),
        "device": str(next(model.parameters()).device),
    }


def machine_info() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def benchmark(options: BenchOptions, load: MachineLoad, command: str = "") -> tuple[dict[str, Any], MachineLoad]:
    """Run ``specheads bench`` as ``options`` say: load the prompts and the models, build the rows, run them
    interleaved and return the report (:func:`bench_report`; ``load``: the machine's load before the run, measured
    where the threads were chosen) and the load while it ran.

    Raises:
        ValueError: no prompts file without ``--base default``, a batch size larger than the prompts, an unknown
            ``--methods`` row.
    """
    from specheads import assets
    from specheads.heads.loading import heads_for_comparison
    from specheads.inference.lookup import read_corpus
    from specheads.loading import check_same_tokenizer, load_causal_lm, load_tokenizer
    from specheads.machine import LoadMeter
    from specheads.prompts import load_prompts, prompts_file

    prompts_path = options.prompts
    if prompts_path is None:
        if options.base != "default":
            raise ValueError("--prompts is required unless --base default")
        prompts_path = assets.prompts_path()
    tokenizer = load_tokenizer(options.tokenizer or options.base)
    prompts = load_prompts(prompts_path, tokenizer, options.limit, options.per_category, options.category_names())
    batch_sizes = sorted(set(options.batch_size))
    if batch_sizes[0] < 1 or batch_sizes[-1] > len(prompts):
        raise ValueError(f"--batch-size values must lie in [1, {len(prompts)}] (the number of prompts)")
    base = load_causal_lm(options.base, dtype=options.machine.dtype, device=options.machine.device)
    draft = None
    if options.draft_model:
        check_same_tokenizer(tokenizer, options.draft_model)
        draft = load_causal_lm(options.draft_model, dtype=base.dtype, device=base.device, role="draft")
    only = options.only()
    heads, base, merged = heads_for_comparison(options.heads, base, options.base)
    with_lookup = options.lookup.prompt_lookup or any("+lookup" in name for name in only or ())
    corpus = read_corpus(options.lookup.lookup_corpus, tokenizer) if options.lookup.lookup_corpus else None
    methods = build_methods(
        base,
        draft,
        draft_ks=options.draft_k,
        lookup_k=options.lookup_k,
        only=only,
        heads=heads,
        trees=options.tree_lists(),
        prompt_lookup=with_lookup or corpus is not None,
        lookup_corpus=corpus,
        skip_drafter_at=options.skip_drafter_at,
    )
    meter = LoadMeter().start()
    run_bench(methods, prompts, tokenizer, options.max_new_tokens, repeats=options.repeats, batch_sizes=batch_sizes)
    during = meter.stop()
    settings = {"repeats": options.repeats, "max_new_tokens": options.max_new_tokens, "lookup_k": options.lookup_k}
    report = bench_report(
        methods,
        prompts,
        batch_sizes,
        base=model_info(base, options.base + (" + Medusa-2 LoRA (merged)" if merged else "")),
        draft=model_info(draft, options.draft_model) if draft is not None else None,
        prompts_file=prompts_file(prompts_path),
        settings=settings,
        loads=(load, during),
        command=command,
    )
    return report, during


def bench_report(
    methods: list[BenchMethod],
    prompts: Sequence[Any],
    batch_sizes: Sequence[int],
    base: dict[str, Any],
    draft: dict[str, Any] | None,
    prompts_file: str | Path,
    settings: dict[str, Any],
    loads: tuple[Any, Any],
    command: str,
) -> dict[str, Any]:
    """The report of a finished run: the machine (and its load before and during the run, ``loads``), the models,
    the prompts, ``settings`` (repeats, max_new_tokens, lookup_k), the command, and every method's rows."""
    before, during = loads
    return {
        "machine": {**machine_info(), "load_before": asdict(before), "load_during": asdict(during)},
        "base": base,
        "draft": draft,
        "prompts": len(prompts),
        "prompts_file": str(prompts_file),
        **settings,
        "temperature": 0.0,
        "command": command,
        **report_rows(methods, batch_sizes, prompts),
    }


def report_rows(
    methods: list[BenchMethod], batch_sizes: Sequence[int] = (1,), prompts: Sequence[Prompt] = ()
) -> dict[str, Any]:
    """The report's method rows: ``{"methods": [...]}`` for batch size 1 alone (the original schema); otherwise
    also ``"batch_sizes"``, ``"by_batch_size"`` (``{"B": rows}``) and ``"notes"``, with ``"methods"`` the rows of
    the first batch size.

    When prompts have categories (MT-Bench), also ``"by_category"`` (``{category: rows}`` at the first batch size,
    see :func:`summarize_categories`) and ``"categories"`` (``{category: number of prompts}``, from ``prompts``);
    when some have several turns, ``"turns"``: the requests decoded per repeat (every turn of every prompt).
    """
    by_size = {str(size): summarize(methods, size) for size in batch_sizes}
    rows: dict[str, Any] = {
        "methods": by_size[str(batch_sizes[0])],
        "exact_reference": exactness_reference(methods).name,
    }
    if list(batch_sizes) != [1]:
        note = skipped_note(methods, batch_sizes)
        rows.update(batch_sizes=list(batch_sizes), by_batch_size=by_size, notes=[note] if note else [])
    if any(prompt.num_turns > 1 for prompt in prompts):
        rows["turns"] = sum(prompt.num_turns for prompt in prompts)
    by_category = summarize_categories(methods, batch_sizes[0])
    if by_category:
        counts: dict[str, int] = {}
        for prompt in prompts:
            name = "uncategorised" if prompt.category is None else prompt.category
            counts[name] = counts.get(name, 0) + 1
        rows.update(by_category=by_category, categories=counts)
    return rows
