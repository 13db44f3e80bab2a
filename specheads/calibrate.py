"""Tree calibration: choose the tree that maximises tokens per second on *this* machine, for trained heads whose
held-out evaluation reports per-rank agreement (Medusa, EAGLE, DFlash / DSpark; not draft-LM heads, which draft a
chain of K tokens and whose evaluation gives depth-1 agreement only).

A tree pays when the tokens it is expected to add outweigh what verifying it costs. Both are measured:

* ``agreement_by_rank[d][r]``: how often the base's own token at depth d + 1 is the drafter's rank-r candidate at
  that depth (from held-out data, by the function the method's registry entry names as its ``evaluate``);
* the verify cost curve: the base's forward time for q query tokens over a cached prefix, on this machine.

Under Medusa's independence approximation a node ``(r1, ..., rd)`` is reached with probability
``prod_i agreement_by_rank[i - 1][r_i]``, and tau = 1 + the sum of these over the tree's nodes. Trees are grown
greedily, most probable node first (as Medusa's tree search does), and the size with the best tau / step time wins.

A method that drafts level by level (EAGLE) also pays a draft forward per level (``depth_ms``, measured by the
method's draft-cost model, its registry entry's ``draft_cost``). A block drafter (DFlash, DSpark) pays its draft cost
once per step, whatever the depth (one block forward drafts every depth: its tree family's ``draft_per_step``). A
method whose drafter grows trees while decoding names their family in its registry entry
(:class:`~specheads.inference.trees.TreeFamily`): the family's candidates (EAGLE-2 trees of the static candidates'
shapes, DDTree node budgets) are timed with the static ones, and the family records the fastest, which its drafter
reads back as its default.

With ``prompt_lookup`` (``calibrate --prompt-lookup``) the split of the tree between the heads and a prompt lookup
composed with them (:mod:`specheads.inference.lookup`) is calibrated too: the fastest measured tree decodes the
calibration prompts with a lookup that proposes long branches at every match length, the acceptance of the lookup's
d-th token is counted by match length n, and ``tokens_by_match[n]`` keeps depth d while that acceptance pays for
one more verified node (:func:`lookup_threshold`, :func:`choose_lookup_tokens`). The table is the record's
``"lookup"``, which ``SpecDecoder.from_pretrained(..., prompt_lookup=True)`` reads; a record without one (a
calibration without ``--prompt-lookup``, which a new calibration of the tree replaces) leaves the lookup's
documented defaults (``lookup.DEFAULT_TOKENS_BY_MATCH``). With ``lookup_corpus`` (``--lookup-corpus``) the lookup
measured holds that corpus of earlier outputs too (``PromptLookup.corpus``; the record stores no corpus).
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specheads.heads.calibration import calibration_key, write_calibration  # noqa: F401 - calibrate's writer
from specheads.inference import attention, kv_cache
from specheads.inference.lookup import DEFAULT_TOKENS_BY_MATCH, PromptLookup
from specheads.inference.trees import STATIC, TreeFamily, grow_tree, tree_from_parents
from specheads.loading import vocab_size


@dataclass
class CalibratedTree:
    """The chosen tree with the numbers that chose it."""

    choices: list[list[int]]
    expected_tau: float
    step_ms: float
    expected_tokens_per_s: float
    candidates: list[dict[str, float]]  # per tree size: nodes, expected tau, step ms, expected tokens/s


def choose_tree(
    agreement_by_rank: Sequence[Sequence[float]],
    step_ms: dict[int, float],
    max_nodes: int = 64,
    fixed_ms: float = 0.0,
    depth_ms: float = 0.0,
) -> CalibratedTree:
    """The tree size that maximises expected tokens per second; of sizes that tie, the smallest (the same speed for
    less verify work).

    Args:
        agreement_by_rank: ``[K][R]`` probabilities (see module docstring).
        step_ms: measured verify time by number of query tokens (root included); sizes in between are
            interpolated linearly.
        max_nodes: largest tree considered.
        fixed_ms: per-step cost that does not grow with the tree (heads, acceptance, Python overhead).
        depth_ms: cost of each tree level (an EAGLE draft forward per level; a Medusa head per depth).
    """
    nodes = grow_tree(agreement_by_rank, max_nodes)
    candidates = []
    expected_tau, depth = 1.0, 0
    for size in range(0, len(nodes) + 1):
        if size:
            expected_tau += nodes[size - 1][1]
            depth = max(depth, len(nodes[size - 1][0]))
        cost = _interpolate(step_ms, size + 1) + fixed_ms + depth_ms * depth
        candidates.append(
            {
                "nodes": size,
                "expected_tau": expected_tau,
                "step_ms": cost,
                "expected_tokens_per_s": 1000.0 * expected_tau / cost,
            }
        )
    best = max(candidates, key=lambda row: row["expected_tokens_per_s"])
    size = int(best["nodes"])
    choices = sorted((list(path) for path, _ in nodes[:size]), key=lambda p: (len(p), p))
    return CalibratedTree(choices, best["expected_tau"], best["step_ms"], best["expected_tokens_per_s"], candidates)


@torch.inference_mode()
def _interpolate(points: dict[int, float], size: int) -> float:
    sizes = sorted(points)
    if size <= sizes[0]:
        return points[sizes[0]]
    for low, high in zip(sizes, sizes[1:], strict=False):
        if low <= size <= high:
            return points[low] + (points[high] - points[low]) * (size - low) / (high - low)
    slope = (points[sizes[-1]] - points[sizes[-2]]) / (sizes[-1] - sizes[-2]) if len(sizes) > 1 else 0.0
    return points[sizes[-1]] + slope * (size - sizes[-1])


@torch.inference_mode()
def measure_verify_cost(
    model: torch.nn.Module, prefix_len: int = 256, sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), repeats: int = 10
) -> dict[int, float]:
    """Median forward time (ms) of ``q`` tree tokens over a cached ``prefix_len``-token prefix, for each q."""
    vocab = vocab_size(model)
    device = model.get_output_embeddings().weight.device
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, prefix_len), generator=generator).to(device)
    cache = kv_cache.new_cache()
    model(input_ids=prefix, **kv_cache.forward_kwargs(model, cache))
    timings = {}
    for size in sizes:
        tree = tree_from_parents([-1] + [(node - 1) // 2 for node in range(1, size)])
        mask = torch.cat([torch.ones(size, prefix_len, dtype=torch.bool), tree.attention_mask], dim=1)[None, None]
        ids = torch.randint(0, vocab, (1, size), generator=generator).to(device)
        positions = (prefix_len + tree.depths)[None].to(device)
        samples = []
        for _ in range(repeats + 2):
            start = time.perf_counter()
            model(
                input_ids=ids,
                attention_mask=mask.to(device),
                position_ids=positions,
                **kv_cache.forward_kwargs(model, cache),
            )
            if device.type == "cuda":
                torch.cuda.synchronize()
            samples.append(1000 * (time.perf_counter() - start))
            kv_cache.crop(cache, prefix_len)
        timings[size] = statistics.median(samples[2:])
    return timings


def candidate_trees(agreement_by_rank: Sequence[Sequence[float]], max_nodes: int) -> list[list[list[int]]]:
    """Growth prefixes worth timing: 1, 2, 3, 4, 6, 9, 13, 19, 28, ... nodes (up to ``max_nodes``)."""
    nodes = grow_tree(agreement_by_rank, max_nodes)
    sizes, size = [], 1
    while size <= len(nodes):
        sizes.append(size)
        size = size + 1 if size < 4 else int(size * 1.5)
    return [sorted((list(path) for path, _ in nodes[:size]), key=lambda p: (len(p), p)) for size in sizes]


@torch.inference_mode()
def measure_decoding(
    decoder: object,
    prompts: Sequence[torch.Tensor],
    trees: Sequence[object],
    max_new_tokens: int = 64,
    repeats: int = 3,
    plain: object | None = None,
    progress: bool = False,
) -> list[dict[str, float]]:
    """Decode ``prompts`` with each tree, interleaved (the order rotates), and return tokens/s and tau per tree.

    The model of :func:`choose_tree` leaves out the drafter's own per-step overhead (Python, small kernels), which
    on a CPU is as large as a draft forward; timing the real decode loop is what says which tree pays here. Each
    tree's speed is the median over its decodes, so that a burst of load on a shared machine moves it little.

    Args:
        plain: a decoder without a drafter on the same base; when given, plain decoding is timed among the trees
            (interleaved the same way) and its row comes last: a tree pays only if it beats it.
        progress: show a tqdm bar over the timed decodes.
    """
    from tqdm.auto import tqdm

    runs = [(decoder, tree) for tree in trees] + ([(plain, None)] if plain is not None else [])
    rates: list[list[float]] = [[] for _ in runs]
    tokens = [0] * len(runs)
    steps = [0] * len(runs)
    bar = tqdm(total=repeats * len(prompts) * len(runs), desc="time trees", unit="decode", disable=not progress)
    for repeat in range(repeats):
        for index, prompt in enumerate(prompts):
            shift = (index + repeat) % len(runs)
            for position in [*range(shift, len(runs)), *range(shift)]:
                runner, tree = runs[position]
                start = time.perf_counter()
                out = runner.generate(prompt, max_new_tokens=max_new_tokens, tree=tree)
                rates[position].append(out.stats.new_tokens / (time.perf_counter() - start))
                tokens[position] += out.stats.new_tokens
                steps[position] += out.stats.steps
                bar.update(1)
    bar.close()
    return [
        {"tokens_per_s": statistics.median(rates[i]), "tau": tokens[i] / max(steps[i], 1)} for i in range(len(runs))
    ]


# ------------------------------------------------------------------ the prompt lookup's share of the tree
LOOKUP_PROBE_TOKENS = 10  # what the measuring lookup proposes at every match length: more than any default
LOOKUP_MIN_OFFERS = 4  # a depth offered fewer times is not measured: a calibrated branch stops before it


def lookup_threshold(step_ms: dict[int, float], nodes: int, tau: float, step_time_ms: float, extra_nodes: int) -> float:
    """The acceptance a lookup node needs to pay for its verification: ``tau * m / c``.

    A step of the chosen tree (``nodes`` drafted nodes) yields ``tau`` tokens in ``c = step_time_ms``. One more node,
    accepted with probability p, adds p tokens and ``m`` ms, the verify cost curve's mean slope (``step_ms``, ms by
    query tokens) over the ``extra_nodes`` the lookup may add. Tokens per second grow, (tau + p) / (c + m) >=
    tau / c, exactly when p >= tau * m / c.
    """
    size = nodes + 1  # the root is verified too
    marginal = (_interpolate(step_ms, size + extra_nodes) - _interpolate(step_ms, size)) / max(extra_nodes, 1)
    return max(0.0, tau * marginal / step_time_ms)


def choose_lookup_tokens(
    offered: dict[int, Sequence[int]],
    taken: dict[int, Sequence[int]],
    threshold: float,
    min_ngram: int,
    max_ngram: int,
    min_offers: int = LOOKUP_MIN_OFFERS,
) -> tuple[int, ...]:
    """``PromptLookup.tokens_by_match`` (index n: tokens proposed for a suffix match of n tokens) from measured
    acceptance.

    ``offered[n][d]`` / ``taken[n][d]``: how often a branch of match length n offered its token d + 1, and how often
    that token was accepted (:class:`~specheads.inference.lookup.LookupStats`). Match length n keeps tokens while
    each is accepted at least ``threshold`` of the times it was offered (and at least once), and was offered at
    least ``min_offers`` times: the largest L whose tokens 1..L all pass. A token is accepted only after the ones
    before it, so acceptance falls with depth, and a depth that fails ends the branch even if a deeper one, measured
    on fewer offers, happens to pass. A match length measured fewer than ``min_offers`` times takes the choice of
    the nearest shorter measured one (a longer match is at least as reliable), else the documented default
    (``DEFAULT_TOKENS_BY_MATCH``); lengths below ``min_ngram`` propose nothing.

    Returns:
        ``max_ngram + 1`` counts.
    """
    default = PromptLookup(tokens_by_match=DEFAULT_TOKENS_BY_MATCH)
    tokens = [0] * (max_ngram + 1)
    shorter = None  # the choice of the longest measured match length so far
    for match in range(min_ngram, max_ngram + 1):
        offers, takes = offered.get(match, ()), taken.get(match, ())
        if not offers or offers[0] < min_offers:
            tokens[match] = default.tokens_for(match) if shorter is None else shorter
            continue
        length = 0
        while length < len(offers) and offers[length] >= min_offers:
            acceptance = takes[length] / offers[length]
            if acceptance <= 0 or acceptance < threshold:
                break
            length += 1
        tokens[match] = shorter = length
    return tuple(tokens)


@torch.inference_mode()
def calibrate_lookup(
    base: torch.nn.Module,
    drafter: Any,
    prompts: Sequence[torch.Tensor],
    tree: Any,
    chosen: dict[str, float],
    step_ms: dict[int, float],
    max_new_tokens: int = 64,
    corpus: Sequence[Sequence[int]] | None = None,
) -> dict[str, Any]:
    """The record of a prompt lookup composed with ``drafter`` on ``tree`` (the calibration's fastest, whose measured
    row ``chosen`` gives its ``nodes``, ``tau`` and ``tokens_per_s``): :class:`PromptLookup`'s record with the
    calibrated ``tokens_by_match`` (see the module), plus what chose it (``threshold``, ``offered_by_match``,
    ``acceptance_by_match``; :meth:`PromptLookup.from_record` reads only the settings)."""
    from specheads.inference.decoder import SpecDecoder

    probe = PromptLookup(tokens_by_match=(LOOKUP_PROBE_TOKENS,), corpus=corpus)
    decoder = SpecDecoder(base, drafter, prompt_lookup=probe)
    offered: dict[int, list[int]] = {}
    taken: dict[int, list[int]] = {}
    for prompt in prompts:
        decoder.generate(prompt, max_new_tokens=max_new_tokens, tree=tree)
        stats = decoder.drafter.last_stats
        for counts, totals in ((stats.offered, offered), (stats.taken, taken)):
            for match, by_depth in counts.items():
                total = totals.setdefault(match, [])
                total += [0] * (len(by_depth) - len(total))
                for depth, count in enumerate(by_depth):
                    total[depth] += count
    step_time_ms = 1000.0 * chosen["tau"] / chosen["tokens_per_s"]
    extra = probe.candidates * LOOKUP_PROBE_TOKENS
    threshold = lookup_threshold(step_ms, int(chosen["nodes"]), chosen["tau"], step_time_ms, extra)
    settings = PromptLookup(
        tokens_by_match=choose_lookup_tokens(offered, taken, threshold, probe.min_ngram, probe.max_ngram)
    )
    return {
        **settings.record(),
        "threshold": threshold,
        "offered_by_match": {str(n): offered[n] for n in sorted(offered)},
        "acceptance_by_match": {
            str(n): [t / o for t, o in zip(taken[n], offered[n], strict=True)] for n in sorted(offered)
        },
    }


# ------------------------------------------------------------------ the whole calibration of one set of heads
@dataclass
class CalibrationResult:
    """What :func:`calibrate` measured and chose; ``record`` is what ``tree.json`` holds, ``family`` the tree family
    of the heads' method (which reports what it recorded)."""

    record: dict
    best: CalibratedTree
    step_ms: dict[int, float]
    agreement: dict
    family: TreeFamily = STATIC

    def summary(self, path: Any = "tree.json") -> str:
        """The report ``specheads calibrate`` prints (``path``: where the record was written)."""
        record, best, agreement = self.record, self.best, self.agreement
        lines = [
            "verify cost (ms by query tokens): " + ", ".join(f"{q}: {ms:.1f}" for q, ms in self.step_ms.items()),
            "head agreement with the base's greedy token (rank 0): "
            + ", ".join(f"{row[0]:.3f}" for row in agreement["agreement_by_rank"]),
            f"cost model: {len(best.choices)} nodes, expected tau {best.expected_tau:.2f}, "
            f"{best.step_ms:.1f} ms/step, expected {best.expected_tokens_per_s:.0f} tokens/s",
        ]
        lines += [
            f"  measured {row['tree']}: {row['tokens_per_s']:.0f} tokens/s, tau {row['tau']:.2f}"
            for row in record["measured"]
        ]
        lines.append(f"  measured plain decoding: {record['plain_tokens_per_s']:.0f} tokens/s")
        static_rate = max(row["tokens_per_s"] for row in record["measured"] if isinstance(row["tree"], list))
        lines.append(
            f"best static tree (tree='auto'): {len(record['choices'])} nodes, {static_rate:.0f} tokens/s measured; "
            f"written to {path}"
        )
        lines += self.family.summary(record)
        if "lookup" in record:
            lookup = record["lookup"]
            by_match = ", ".join(
                f"{n}: {t}" for n, t in enumerate(lookup["tokens_by_match"]) if n >= lookup["min_ngram"]
            )
            lines.append(
                f"prompt lookup tokens by match length ({by_match}): a lookup token is kept while accepted at least "
                f"{lookup['threshold']:.3f} of the times (what one more verified node costs here)"
            )
        if record["best_speedup_over_plain"] < 1.0:
            lines.append(
                f"warning: no tree beats plain decoding on this machine (best {record['best_speedup_over_plain']:.2f}x"
                f" of plain's {record['plain_tokens_per_s']:.0f} tokens/s): these heads do not pay here yet; train "
                "them longer or decode without them"
            )
        return "\n".join(lines)


def calibrate(
    base: torch.nn.Module,
    heads: torch.nn.Module,
    dataset: Any,
    batches: int = 8,
    max_nodes: int = 64,
    prompt_tokens: int = 128,
    new_tokens: int = 64,
    log: Callable[[str], None] = lambda line: None,
    prompt_lookup: bool = False,
    lookup_corpus: Sequence[Sequence[int]] | None = None,
) -> CalibrationResult:
    """Measure heads on held-out rows and choose the trees that pay on this machine.

    Held-out agreement per depth and rank (the method's evaluation), the base's verify cost curve and the method's
    draft cost per level give the cost model's tree; every candidate tree (and the grown trees the method's tree family
    adds) is then timed against plain decoding on held-out prompts, and the fastest measured trees are recorded
    (``tree="auto"`` reads the static one, the family's own kind the grown one). With ``prompt_lookup``, the record's
    ``"lookup"`` holds the tokens a prompt lookup composed with the heads proposes by match length (see the module).
    The record's ``"options"`` are the settings it ran with (with the torch threads), which
    :func:`~specheads.heads.calibration.calibrate_arguments` turns back into ``specheads calibrate``'s arguments.

    Args:
        base, heads: the base and heads bound to it.
        dataset: tokenised held-out rows (``input_ids``, ``attention_mask``, ``loss_mask``).
        batches: held-out batches of 8 rows for the agreement.
        max_nodes: the largest tree considered.
        prompt_tokens, new_tokens: the timed prompts' length and the tokens decoded after each.
        log: receives one line per phase (the CLI prints them).
        prompt_lookup: also calibrate the lookup's share of the tree, on the fastest measured tree.
        lookup_corpus: token lists the calibrated lookup's index also holds (implies ``prompt_lookup``).

    Raises:
        ValueError: the heads' method is not ``calibratable`` (its registry entry says so: no agreement by rank to
            grow trees from).
    """
    from specheads.inference.decoder import SpecDecoder
    from specheads.inference.drafters import NoDrafter
    from specheads.registry import head_type_of
    from specheads.training.batches import collate_trimmed

    method = head_type_of(heads)
    if not method.calibratable:
        raise ValueError(
            f"{method.name} heads cannot be calibrated: calibrate grows trees from agreement by rank, which "
            f"{method.name} does not measure; decode them as they are"
        )
    dataset = dataset.with_format("torch")
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, collate_fn=collate_trimmed)
    count = min(batches, len(loader))
    log(f"agreement with the base's greedy token on {count} held-out batches of 8 rows")
    agreement = method.evaluate_fn()(base, heads, _bar(loader, count, "agreement"), max_batches=batches)
    log("timing the verify cost curve and a draft level")
    with torch.inference_mode(), attention.batch_invariant(base, attention.wants_invariance(base)):
        step_ms = measure_verify_cost(base, sizes=(1, 2, 4, 8, 16, 32, 64))
    draft_ms = method.draft_cost_ms(heads)
    family = method.tree_family()
    step_cost = {"fixed_ms": draft_ms} if family.draft_per_step else {"depth_ms": draft_ms}  # a block: once a step
    best = choose_tree(agreement["agreement_by_rank"], step_ms, max_nodes=max_nodes, **step_cost)
    statics = candidate_trees(agreement["agreement_by_rank"], max_nodes)
    trees: list = [*statics, *family.candidates(statics, max_nodes)]
    prompts = [_calibration_prompt(row, prompt_tokens) for row in dataset.select(range(min(4, len(dataset))))]
    log(f"timing {len(trees)} trees and plain decoding on {len(prompts)} held-out prompts")
    decoder, plain = SpecDecoder(base, method.make_drafter(heads)), SpecDecoder(base, NoDrafter())
    timed = measure_decoding(decoder, prompts, trees, max_new_tokens=new_tokens, plain=plain, progress=True)
    measured = [
        {
            "tree": tree if isinstance(tree, list) else vars(tree),
            "nodes": len(tree) if isinstance(tree, list) else tree.num_nodes,
            **result,
        }
        for tree, result in zip(trees, timed, strict=False)
    ]
    grown = [(row, tree) for row, tree in zip(measured, trees, strict=True)][len(statics) :]
    plain_rate = timed[-1]["tokens_per_s"]
    record = {
        "choices": max(measured[: len(statics)], key=lambda row: row["tokens_per_s"])["tree"],
        **(family.record(max(grown, key=lambda pair: pair[0]["tokens_per_s"])[1]) if grown else {}),
        "measured": measured,
        "plain_tokens_per_s": plain_rate,
        "best_speedup_over_plain": max(row["tokens_per_s"] for row in measured) / plain_rate,
        **({"draft_ms_per_step": draft_ms} if family.draft_per_step else {"draft_ms_per_level": draft_ms}),
        "expected_tau": best.expected_tau,
        "step_ms": best.step_ms,
        "expected_tokens_per_s": best.expected_tokens_per_s,
        "model_choice": best.choices,
        "verify_ms_by_query_tokens": step_ms,
        "agreement_by_rank": agreement["agreement_by_rank"],
        "candidates": best.candidates,
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "device": str(base.get_output_embeddings().weight.device),
        },
        "dtype": calibration_key(base),
        "options": {
            "threads": torch.get_num_threads(),
            "batches": batches,
            "max_nodes": max_nodes,
            "prompt_tokens": prompt_tokens,
            "new_tokens": new_tokens,
            "prompt_lookup": bool(prompt_lookup or lookup_corpus is not None),
        },
    }
    if prompt_lookup or lookup_corpus is not None:
        fastest = max(range(len(trees)), key=lambda index: measured[index]["tokens_per_s"])
        chosen = measured[fastest]
        log(f"measuring prompt lookup's acceptance by match length on the fastest tree ({chosen['nodes']} nodes)")
        drafter = method.make_drafter(heads)
        record["lookup"] = calibrate_lookup(
            base, drafter, prompts, trees[fastest], chosen, step_ms, new_tokens, lookup_corpus
        )
    return CalibrationResult(record, best, step_ms, agreement, family)


def _bar(loader: Any, total: int, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(loader, total=total, desc=desc, unit="batch", leave=False)


def _calibration_prompt(row: dict, prompt_tokens: int) -> torch.Tensor:
    """A held-out row cut to ``prompt_tokens`` tokens, or for a chat (targets start later) up to its first assistant
    target when that comes first, so that the timed decode writes an answer as in use (``[1, T]``)."""
    ids, targets = row["input_ids"], row["loss_mask"]
    first_target = int(targets.nonzero()[0]) if targets.any() else 0
    length = min(prompt_tokens, first_target) if first_target > 0 else prompt_tokens
    return ids[None, : max(1, min(length, int(row["attention_mask"].sum())))]


def heldout_rows(
    config_path: str | None,
    base: str | None,
    data: list[str],
    data_format: str | None = None,
    max_length: int | None = None,
    overrides: Sequence[str] = (),
) -> tuple[str, Any]:
    """``(base name, tokenised rows)`` to calibrate on: with a recipe (``config_path``, with the ``key=value``
    ``overrides`` the heads were trained with), its held-out data (``data.eval_paths``, else its ``heldout_fraction``
    split; ``data`` replaces them) with its format and length; without one, ``data`` (default with
    ``base="default"``: the default corpus's held-out files).

    Raises:
        ValueError: no base, or no held-out data to name.
    """
    import dataclasses

    from specheads.loading import load_tokenizer
    from specheads.training.config import DataConfig, load_config
    from specheads.training.data import build_dataset
    from specheads.training.files import eval_data, expand_data_paths

    if config_path is not None:
        recipe = load_config(config_path, list(overrides))
        base = base or recipe.model.base
        section = recipe.data
        if data:
            config = dataclasses.replace(section, paths=expand_data_paths(data), heldout_fraction=0.0)
            split = "train"
        elif section.eval_paths:
            config, split = eval_data(section), "train"
        elif section.heldout_fraction > 0:
            config, split = dataclasses.replace(section, paths=expand_data_paths(section.paths)), "heldout"
        else:
            raise ValueError(f"{config_path} holds out no data (data.eval_paths, data.heldout_fraction); give --data")
        config = dataclasses.replace(
            config, format=data_format or config.format, max_length=max_length or config.max_length
        )
        tokenizer = load_tokenizer(recipe.model.tokenizer or base)
        return base, build_dataset(config, tokenizer, split=split)
    if base is None:
        raise ValueError("calibrate needs --base (or --config, a recipe naming it)")
    data = data or (["default-corpus:heldout"] if base == "default" else [])
    if not data:
        raise ValueError("--data (or --config, the heads' recipe) is required unless --base default")
    config = DataConfig(paths=expand_data_paths(data), format=data_format or "text", max_length=max_length or 512)
    return base, build_dataset(config, load_tokenizer(base))
