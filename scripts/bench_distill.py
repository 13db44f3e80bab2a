"""Time saved by speculation in ``specheads distill``: the same prompts distilled with and without a drafter.

Both paths share one process, one loaded base and the same prompts. Per batch size and round each writes a fresh
output file, batch by batch through distill's own resuming, and the two alternate batch by batch (which goes first
alternates too), so a shared machine whose load changes slows both alike. The report gives each path's median time
per round (the sum of its distill calls), their ratio, tau, and whether the two files of every round are
byte-identical (they must be at temperature 0: the engine is lossless).

Usage (the numbers in the report of this change)::

    OMP_NUM_THREADS=1 python scripts/bench_distill.py --base default --heads default --limit 16 \\
        --max-new-tokens 128 --batch-size 8 1 --rounds 2 --threads 1 [--json bench-distill.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specheads.training.distill import DistillResult


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="default", help="base model: folder, hub id or 'default'")
    drafter = parser.add_mutually_exclusive_group(required=True)
    drafter.add_argument("--heads", help="head checkpoint dir ('default' with --base default: the shipped EAGLE-3)")
    drafter.add_argument("--draft-model", help="draft model sharing the base's tokenizer")
    parser.add_argument("--prompts", help="JSONL prompts (default with --base default: the shipped bench prompts)")
    parser.add_argument("--limit", type=int, default=16, help="use the first N prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[8, 1], metavar="B")
    parser.add_argument(
        "--rounds", type=int, default=2, help="plain/speculative pairs per batch size (order alternates)"
    )
    parser.add_argument("--tree", help="speculation tree (default: the drafter's)")
    parser.add_argument("--num-speculative-tokens", type=int, help="K drafted tokens per step (chains)")
    parser.add_argument("--no-chat-template", action="store_true")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--device", help="cpu, cuda, ...")
    parser.add_argument("--out-dir", help="where the output files go (default: a temporary directory, removed)")
    parser.add_argument("--json", help="also write the report here")
    return parser.parse_args()


def timed_distill(out: Path, **kwargs) -> tuple[float, DistillResult]:
    """Wall time of one distill call (appending to ``out``: the prompts it already holds are skipped)."""
    import torch

    from specheads.training.distill import distill

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = distill(out_path=out, progress=False, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def bench_batch_size(batch_size: int, rounds: int, directory: Path, plain: dict, speculative: dict) -> dict:
    """Alternate plain and speculative runs at one batch size; per-round times, ratio and the byte comparison.

    A round writes one fresh file per path, one batch at a time through distill's resuming (each call is given one
    more batch of prompts and appends it), alternating which path goes first batch by batch: a machine whose load
    changes within a round slows both paths alike.
    """
    prompts = plain["prompts"]
    times: dict[str, list[float]] = {"plain": [], "speculative": []}
    identical, spec_stats, tokens = [], None, 0
    for round_index in range(rounds):
        files = {name: directory / f"{name}-b{batch_size}-r{round_index}.jsonl" for name in times}
        for path in files.values():
            path.unlink(missing_ok=True)
        totals = dict.fromkeys(times, 0.0)
        for batch_index, end in enumerate(range(batch_size, len(prompts) + batch_size, batch_size)):
            order = ("plain", "speculative") if (round_index + batch_index) % 2 == 0 else ("speculative", "plain")
            for name in order:
                kwargs = {**(plain if name == "plain" else speculative), "prompts": prompts[:end]}
                seconds, result = timed_distill(files[name], batch_size=batch_size, **kwargs)
                totals[name] += seconds
                if name == "speculative" and round_index == 0:
                    spec_stats = result.spec_stats if spec_stats is None else spec_stats.merge(result.spec_stats)
                    tokens += result.new_tokens
        for name in times:
            times[name].append(totals[name])
        identical.append(files["plain"].read_bytes() == files["speculative"].read_bytes())
        print(
            f"  b={batch_size} round {round_index}: plain {totals['plain']:.2f}s speculative "
            f"{totals['speculative']:.2f}s ({totals['plain'] / totals['speculative']:.2f}x)",
            flush=True,
        )
    plain_s, speculative_s = statistics.median(times["plain"]), statistics.median(times["speculative"])
    return {
        "batch_size": batch_size,
        "plain_s": times["plain"],
        "speculative_s": times["speculative"],
        "plain_median_s": plain_s,
        "speculative_median_s": speculative_s,
        "speedup": plain_s / speculative_s,
        "speedup_by_round": [p / q for p, q in zip(times["plain"], times["speculative"], strict=True)],
        "tau": spec_stats.mean_accepted_length,
        "new_tokens": tokens,
        "identical_files": all(identical),
    }


def main() -> None:
    args = parse_args()
    # imported once the arguments are read: --help and a usage error answer without loading torch
    import torch

    from specheads import SpecDecoder, assets
    from specheads.heads.loading import heads_path
    from specheads.loading import load_causal_lm, load_tokenizer
    from specheads.prompts import load_prompts

    if args.threads:
        torch.set_num_threads(args.threads)
    prompts_path = args.prompts or (assets.prompts_path() if args.base == "default" else None)
    if prompts_path is None:
        raise SystemExit("--prompts is required unless --base default")
    tokenizer = load_tokenizer(args.base)
    prompts = load_prompts(prompts_path, tokenizer, limit=args.limit)
    base = load_causal_lm(args.base, device=args.device)
    if args.heads is not None:
        decoder = SpecDecoder.from_pretrained(base, heads=heads_path(args.heads), tokenizer=tokenizer)
    else:
        decoder = SpecDecoder.from_pretrained(base, draft_model=args.draft_model, tokenizer=tokenizer)
    options = {"tree": args.tree, "num_speculative_tokens": args.num_speculative_tokens}
    options = {key: value for key, value in options.items() if value is not None}
    common = dict(
        base_model=base,
        tokenizer=tokenizer,
        prompts=prompts,
        max_new_tokens=args.max_new_tokens,
        use_chat_template=not args.no_chat_template,
        allow_evaluation_prompts=True,  # timed, not trained on: the shipped prompts are evaluation prompts
    )
    plain, speculative = common, {**common, "decoder": decoder, "decoder_options": options}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(args.out_dir or scratch)
        directory.mkdir(parents=True, exist_ok=True)
        warm_up = {**common, "prompts": prompts[:2], "max_new_tokens": 8, "batch_size": 2}
        for name, extra in (("plain", {}), ("speculative", {"decoder": decoder, "decoder_options": options})):
            (directory / f"warm-up-{name}.jsonl").unlink(missing_ok=True)
            timed_distill(directory / f"warm-up-{name}.jsonl", **warm_up, **extra)
        rows = [bench_batch_size(b, args.rounds, directory, plain, speculative) for b in args.batch_size]
    report = {
        "command": "python scripts/bench_distill.py " + " ".join(sys.argv[1:]),
        "drafter": decoder.drafter.name,
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average_before_after": [load_before, os.getloadavg()],
        "machine": {"processor": platform.processor(), "cpus": os.cpu_count(), "device": str(base.device)},
        "rows": rows,
    }
    print("\n| batch size | plain s | speculative s | speedup | tau | new tokens | identical files |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['batch_size']} | {row['plain_median_s']:.2f} | {row['speculative_median_s']:.2f} | "
            f"{row['speedup']:.2f}x | {row['tau']:.2f} | {row['new_tokens']} | "
            f"{'yes' if row['identical_files'] else 'NO'} |"
        )
    print(f"load average before/after (1, 5, 15 min): {load_before} / {report['load_average_before_after'][1]}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
