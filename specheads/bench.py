"""``specheads bench``: every method side by side with transformers' own generation, in one process.

Methods run interleaved over the prompts (the order rotates from prompt to prompt and from repeat to repeat), so that
a noisy, shared machine slows all of them alike; the per-prompt spread of each speed-up is reported next to the
totals so that noise shows in the report rather than in the conclusion.

Baselines: ``hf-greedy`` (``generate(do_sample=False)``, the denominator of every speed-up), ``hf-assisted``
(``assistant_model=`` the same draft model, when one is given) and ``hf-prompt-lookup``
(``prompt_lookup_num_tokens=``). specheads methods: ``none``, ``draft-k{K}``, ``draft-adaptive``, ``prompt-lookup``
and, for each ``--heads`` checkpoint, ``<head type>-<tree>`` (e.g. ``medusa-chain-3``, ``eagle-dynamic``,
``eagle-auto``). Rows with statistics report the per-step draft and verify time, which says which tree size pays.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specheads.heads.registry import head_type_of
from specheads.inference.decoder import SpecDecoder
from specheads.inference.drafters import DraftModelDrafter, NoDrafter, PromptLookupDrafter
from specheads.metrics import SpecStats
from specheads.prompts import Prompt

RunFn = Callable[[torch.Tensor, int], tuple[list[int], SpecStats | None]]


@dataclass
class BenchMethod:
    """One row of the report: a name and a function ``(input_ids [1, T], max_new_tokens) -> (tokens, stats)``."""

    name: str
    run: RunFn
    new_tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    outputs: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    stats: SpecStats = field(default_factory=SpecStats)
    has_stats: bool = False


def _hf_runner(model: PreTrainedModel, **generate_kwargs: Any) -> RunFn:
    def run(input_ids: torch.Tensor, max_new_tokens: int) -> tuple[list[int], None]:
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            **generate_kwargs,
        )
        return out[0, input_ids.shape[1] :].tolist(), None

    return run


def _spec_runner(decoder: SpecDecoder, **generate_kwargs: Any) -> RunFn:
    def run(input_ids: torch.Tensor, max_new_tokens: int) -> tuple[list[int], SpecStats]:
        out = decoder.generate(input_ids, max_new_tokens=max_new_tokens, **generate_kwargs)
        return out.new_tokens, out.stats

    return run


def build_methods(
    base: PreTrainedModel,
    draft: PreTrainedModel | None,
    draft_ks: Sequence[int] = (1, 3, 5, 8),
    lookup_k: int = 10,
    only: Sequence[str] | None = None,
    draft_confidence: float = 0.4,
    heads: Sequence[tuple[str, torch.nn.Module]] = (),
    trees: dict[str, Sequence[str]] | None = None,
) -> list[BenchMethod]:
    """The methods of a benchmark run; ``hf-greedy`` always comes first (it is the reference).

    ``draft-adaptive`` drafts up to ``max(draft_ks)`` tokens and stops when the draft's confidence in its token falls
    below ``draft_confidence`` (0.4 is transformers' initial ``assistant_confidence_threshold``). ``heads`` rows use
    ``trees[head type]`` (default: the head type's ``bench_trees``); a tree the heads cannot decode is skipped.
    """
    pad = base.generation_config.pad_token_id
    if pad is None:
        pad = base.generation_config.eos_token_id if isinstance(base.generation_config.eos_token_id, int) else 0
    methods = [BenchMethod("hf-greedy", _hf_runner(base, pad_token_id=pad))]
    if draft is not None:
        methods.append(BenchMethod("hf-assisted", _hf_runner(base, pad_token_id=pad, assistant_model=draft)))
    methods.append(
        BenchMethod("hf-prompt-lookup", _hf_runner(base, pad_token_id=pad, prompt_lookup_num_tokens=lookup_k))
    )
    methods.append(BenchMethod("none", _spec_runner(SpecDecoder(base, NoDrafter())), has_stats=True))
    if draft is not None:
        for k in draft_ks:
            decoder = SpecDecoder(base, DraftModelDrafter(draft, k))
            methods.append(BenchMethod(f"draft-k{k}", _spec_runner(decoder), has_stats=True))
        adaptive = DraftModelDrafter(draft, max(draft_ks), confidence_threshold=draft_confidence)
        methods.append(BenchMethod("draft-adaptive", _spec_runner(SpecDecoder(base, adaptive)), has_stats=True))
    methods.append(
        BenchMethod("prompt-lookup", _spec_runner(SpecDecoder(base, PromptLookupDrafter(lookup_k))), has_stats=True)
    )
    if only:
        unknown = sorted(set(only) - {m.name for m in methods})
        if unknown:
            raise ValueError(f"unknown bench methods {unknown}; available: {[m.name for m in methods]}")
        methods = [m for m in methods if m.name == "hf-greedy" or m.name in only]
    for label, head_module in heads:  # --heads rows are always kept
        head_type = head_type_of(head_module)
        for tree in (trees or {}).get(head_type.name, head_type.bench_trees):
            drafter = head_type.make_drafter(head_module)
            decoder = SpecDecoder(base, drafter)
            try:
                decoder._settings(1, {"tree": tree})  # the argument checks of generate, without any compute
            except ValueError:  # a tree these heads cannot decode (deeper than Medusa's heads, ...): no row
                continue
            methods.append(BenchMethod(f"{label}-{tree}", _spec_runner(decoder, tree=tree), has_stats=True))
    return methods


@torch.inference_mode()
def run_bench(
    methods: list[BenchMethod],
    prompts: Sequence[Prompt],
    tokenizer: PreTrainedTokenizerBase,
    max_new_tokens: int,
    repeats: int = 1,
    progress: bool = True,
) -> None:
    """Run every method on every prompt, interleaved; results accumulate in the methods."""
    encoded = [torch.tensor([tokenizer(p.text)["input_ids"]], dtype=torch.long) for p in prompts]
    for method in methods:  # warm-up: first-call allocations and lazy initialisation stay out of the timings
        method.run(encoded[0], min(8, max_new_tokens))
    jobs = [(r, i) for r in range(repeats) for i in range(len(prompts))]
    for repeat, index in tqdm(jobs, desc="bench", unit="prompt", disable=not progress):
        shift = (index + repeat) % len(methods)
        for method in methods[shift:] + methods[:shift]:
            start = time.perf_counter()
            tokens, stats = method.run(encoded[index], max_new_tokens)
            method.seconds.append(time.perf_counter() - start)
            method.new_tokens.append(len(tokens))
            method.outputs[(repeat, index)] = tokens
            if stats is not None:
                method.stats = method.stats.merge(stats)


def summarize(methods: list[BenchMethod]) -> list[dict[str, Any]]:
    """Per-method rows of the report (see API.md section 5)."""
    reference = methods[0]
    reference_rates = [n / s for n, s in zip(reference.new_tokens, reference.seconds, strict=True)]
    reference_tps = sum(reference.new_tokens) / sum(reference.seconds)
    rows = []
    for method in methods:
        rates = [n / s for n, s in zip(method.new_tokens, method.seconds, strict=True)]
        per_prompt = [r / g for r, g in zip(rates, reference_rates, strict=True)]
        quartiles = statistics.quantiles(per_prompt, n=4) if len(per_prompt) >= 2 else [per_prompt[0]] * 3
        tokens_per_s = sum(method.new_tokens) / sum(method.seconds)
        rows.append(
            {
                "name": method.name,
                "tokens_per_s": tokens_per_s,
                "speedup": tokens_per_s / reference_tps,
                "speedup_per_prompt_median": statistics.median(per_prompt),
                "speedup_per_prompt_iqr": [quartiles[0], quartiles[2]],
                "mean_accepted_length": method.stats.mean_accepted_length if method.has_stats else None,
                "acceptance_rate_by_position": method.stats.acceptance_rate_by_position if method.has_stats else None,
                "matches_greedy": all(method.outputs[key] == reference.outputs[key] for key in reference.outputs),
                "wall_time_s": sum(method.seconds),
                "draft_ms_per_step": _per_step_ms(method, "draft_time_s"),
                "verify_ms_per_step": _per_step_ms(method, "verify_time_s"),
                "new_tokens": sum(method.new_tokens),
            }
        )
    return rows


def _per_step_ms(method: BenchMethod, field_name: str) -> float | None:
    if not method.has_stats or not method.stats.steps:
        return None
    return 1000.0 * getattr(method.stats, field_name) / method.stats.steps


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


def write_report(report: dict[str, Any], out_dir: str | Path) -> None:
    """Write ``report.json``, ``report.md`` and ``speedup.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown_table(report))
    plot_speedups(report, out / "speedup.png")


def markdown_table(report: dict[str, Any]) -> str:
    lines = [
        f"base: {report['base']['name_or_path']} ({report['base']['parameters'] / 1e6:.2f}M parameters)"
        + (
            f"; draft: {report['draft']['name_or_path']} ({report['draft']['parameters'] / 1e6:.2f}M)"
            if report.get("draft")
            else ""
        ),
        f"{report['prompts']} prompts x {report['repeats']} repeats, {report['max_new_tokens']} new tokens, "
        f"temperature 0; {report['machine']['processor']}, {report['machine']['torch_threads']} threads, "
        f"{report['machine']['date']}",
        "",
        "| method | tokens/s | speedup | per-prompt speedup median [IQR] | tau | acceptance by depth | "
        "draft / verify ms per step | matches greedy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["methods"]:
        tau = "-" if row["mean_accepted_length"] is None else f"{row['mean_accepted_length']:.2f}"
        rates = row["acceptance_rate_by_position"]
        rates_text = "-" if not rates else " ".join(f"{r:.2f}" for r in rates)
        low, high = row["speedup_per_prompt_iqr"]
        draft_ms, verify_ms = row.get("draft_ms_per_step"), row.get("verify_ms_per_step")
        split = "-" if draft_ms is None else f"{draft_ms:.2f} / {verify_ms:.2f}"
        lines.append(
            f"| {row['name']} | {row['tokens_per_s']:.1f} | {row['speedup']:.2f}x | "
            f"{row['speedup_per_prompt_median']:.2f} [{low:.2f}, {high:.2f}] | {tau} | {rates_text} | {split} | "
            f"{'yes' if row['matches_greedy'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def plot_speedups(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["methods"]
    names = [row["name"] for row in rows]
    speedups = [row["speedup"] for row in rows]
    low = [row["speedup"] - min(row["speedup_per_prompt_iqr"][0], row["speedup"]) for row in rows]
    high = [max(row["speedup_per_prompt_iqr"][1], row["speedup"]) - row["speedup"] for row in rows]
    colors = ["#999999" if name.startswith("hf-") else "#1f77b4" for name in names]
    figure, axis = plt.subplots(figsize=(max(6, 0.8 * len(rows)), 4))
    axis.bar(names, speedups, color=colors, yerr=[low, high], capsize=3)
    axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    axis.set_ylabel("speed-up over hf-greedy (tokens/s ratio)")
    axis.set_title(
        f"{report['base']['name_or_path']}: {report['max_new_tokens']} new tokens, "
        f"{report['prompts']} prompts (bars: total; whiskers: per-prompt IQR)",
        fontsize=9,
    )
    axis.tick_params(axis="x", rotation=30)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
