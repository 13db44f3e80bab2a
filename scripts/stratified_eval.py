"""Where EAGLE heads lose held-out agreement, and whether one set of heads beats another on the same rows.

    python scripts/stratified_eval.py --config configs/smollm2-135m/eagle3-large.yaml \\
        --heads specheads/assets/smollm2-135m/eagle3 --heads runs/v2/heads --threads 2 --out runs/v2/strata.json
    python scripts/stratified_eval.py --config ... --heads ... --data data/smollm2-135m/train-probe160.jsonl

For every ``--heads`` (EAGLE heads of the recipe's base), on the recipe's held-out data (``data.eval_paths``, or the
``data.heldout_fraction`` split; ``--data`` a file of the recipe's format instead), by draft depth: agreement with
the base's greedy token split by copy / novel positions (the base's token continues an n-gram already in the
answer), in / off the draft vocabulary and the base's own top-1 probability; the share of positions the base
predicts with top-1 probability above one half; the mean L2 norm of each fused feature layer (fc's input scale, what
EAGLE 3.1's ``fc_norm`` evens out). With several ``--heads``, a paired bootstrap interval (rows resampled) of each
later head's agreement minus the first's, per depth. The computations are :mod:`specheads.training.diagnostics`.

The base runs once per batch for all heads: about the cost of one held-out evaluation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def drafted_tokens(head: Any, batch: dict[str, torch.Tensor], hidden_states: tuple, depth: int) -> list[torch.Tensor]:
    """Per depth, ``[B, T - 1]`` the head's top-1 target id at each position (the draft unrolled along the data)."""
    from specheads.training.losses import projected_top_k

    features = [hidden_states[index].float() for index in head.hidden_state_layers]

    def top1(step: int, inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return projected_top_k(inputs, weight, bias, 1)

    _, tops = head(batch["input_ids"].long(), features, batch["attention_mask"], depth, readout=top1)
    return [head.to_target(top[..., 0]) for top in tops]


def stratify(base: Any, heads: list[Any], batches: Any, depth: int) -> list[dict[str, Any]]:
    """Every head's :class:`~specheads.training.diagnostics.StratifiedAgreement` summary, rows and feature norms."""
    import torch

    with torch.inference_mode():
        return _stratify(base, heads, batches, depth)


def _stratify(base: Any, heads: list[Any], batches: Any, depth: int) -> list[dict[str, Any]]:
    import torch

    from specheads.training.diagnostics import StratifiedAgreement, scored_positions

    tallies = [StratifiedAgreement(depth) for _ in heads]
    norms = [torch.zeros(len(head.hidden_state_layers), dtype=torch.float64) for head in heads]
    tokens = 0
    for batch in batches:
        input_ids, attention = batch["input_ids"].long(), batch["attention_mask"]
        valid = batch["loss_mask"].bool() & attention.bool()
        out = base(input_ids=input_ids, attention_mask=attention, output_hidden_states=True)
        p_top1, greedy = out.logits.float().softmax(dim=-1).max(dim=-1)  # [B, T] each
        real = attention.bool()
        tokens += int(real.sum())
        for head, tally, norm in zip(heads, tallies, norms, strict=True):
            drafted = drafted_tokens(head, batch, out.hidden_states, depth)
            tally.add(input_ids, valid, p_top1, scored_positions(input_ids, valid, greedy, drafted), head.t2d)
            for layer, index in enumerate(head.hidden_state_layers):
                norm[layer] += float(out.hidden_states[index][real].float().norm(dim=-1).sum())
    return [
        {**tally.summary(), "row_counts": tally.rows, "feature_norms": (norm / max(tokens, 1)).tolist()}
        for tally, norm in zip(tallies, norms, strict=True)
    ]


def table(summary: dict[str, Any]) -> str:
    """A markdown table: one line per group, agreement (and share of positions) per depth."""
    depths = summary["depths"]
    names = list(dict.fromkeys(name for groups in depths for name in groups))
    lines = [
        "| group | " + " | ".join(f"depth {d + 1} (share)" for d in range(len(depths))) + " |",
        "|---|" + "---|" * len(depths),
    ]
    for name in names:
        cells = []
        for groups in depths:
            cell = groups.get(name)
            cells.append("-" if cell is None else f"{cell['agreement']:.3f} ({cell['share']:.3f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_intervals(results: list[dict[str, Any]], rounds: int) -> list[list[list[float]]]:
    """For each later head, per depth, ``[difference, low, high]`` against the first head."""
    from specheads.training.diagnostics import paired_bootstrap

    intervals = []
    for result in results[1:]:
        per_depth = []
        for depth in range(len(results[0]["depths"])):
            first = [row[depth] for row in results[0]["row_counts"]]
            second = [row[depth] for row in result["row_counts"]]
            scored = sum(count for _, count in first)
            per_depth.append(list(paired_bootstrap(first, second, rounds)) if scored else [math.nan] * 3)
        intervals.append(per_depth)
    return intervals


def _loader(config: Any, data: str | None, batch_size: int) -> Any:
    import torch

    from specheads.loading import load_tokenizer
    from specheads.training.batches import collate_trimmed
    from specheads.training.data import build_dataset
    from specheads.training.files import eval_data, expand_data_paths

    tokenizer = load_tokenizer(config.model.tokenizer or config.model.base)
    settings = config.data if data is None else dataclasses.replace(config.data, eval_paths=[data])
    if settings.eval_paths:
        dataset = build_dataset(eval_data(settings), tokenizer)
    elif settings.heldout_fraction > 0:
        dataset = build_dataset(
            dataclasses.replace(settings, paths=expand_data_paths(settings.paths)), tokenizer, split="heldout"
        )
    else:
        raise SystemExit("no held-out data: the recipe has no data.eval_paths or data.heldout_fraction; pass --data")
    return torch.utils.data.DataLoader(dataset.with_format("torch"), batch_size=batch_size, collate_fn=collate_trimmed)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="the recipe: its base, data format and held-out data (default: overrides)")
    parser.add_argument("--heads", action="append", required=True, help="EAGLE heads (repeat to compare)")
    parser.add_argument("--data", help="a file of the recipe's data format to score instead of its held-out data")
    parser.add_argument("--depth", type=int, default=3, help="draft depths to score")
    parser.add_argument("--max-batches", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--dtype", default="float32", help="the base's dtype")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--out", help="write every number (and each row's counts) to this JSON file")
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides")
    args = parser.parse_args(argv)
    import torch  # once the arguments are read: --help answers without loading torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from itertools import islice

    from specheads.heads import load_heads
    from specheads.loading import load_causal_lm
    from specheads.training.config import load_config

    config = load_config(args.config, args.overrides)
    base = load_causal_lm(config.model.base, dtype=args.dtype)
    heads = [load_heads(path, base_model=base).eval() for path in args.heads]
    loader = _loader(config, args.data, args.batch_size)
    results = stratify(base, heads, islice(loader, args.max_batches), args.depth)
    for path, result in zip(args.heads, results, strict=True):
        result["heads"] = path
        confident, norms = result["base_top1_above_half"], [round(n, 1) for n in result["feature_norms"]]
        print(f"\n{path}: {result['rows']} rows; base top-1 probability > 0.5 at {confident:.3f} of positions")
        print(f"fused feature L2 norms by layer: {norms}")
        print(table(result))
    for index, intervals in enumerate(paired_intervals(results, args.rounds), start=1):
        results[index]["paired_vs_first"] = intervals
        cells = ", ".join(f"depth {d + 1} {v[0]:+.4f} [{v[1]:+.4f}, {v[2]:+.4f}]" for d, v in enumerate(intervals))
        print(f"\n{args.heads[index]} minus {args.heads[0]} (95% paired bootstrap over rows): {cells}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
