"""Training throughput side by side: one recipe, one data subset, one epoch each, several trainer settings.

    python scripts/train_throughput.py --config configs/smollm2-135m/eagle3.yaml --records 200 --out bench-out/tp

Every variant trains the recipe's heads for one epoch over the same first ``--records`` records (so each sees the
same tokens), one after another in this process, then evaluates held-out agreement on the same batches. The
variants (``--variants``, comma-separated):

- ``before``: float32 base and heads, rows in random order (the trainer before bf16 and length grouping);
- ``float32``: float32, length-grouped batches;
- ``bf16``: the base in bf16 and the heads under bf16 autocast (fp32 master weights), length-grouped;
- ``bf16-cache``: as ``bf16``, the base's features read from a feature cache written first (its writing is timed
  apart: it is the base forward of one epoch, paid once for every later epoch, run and head type);
- ``float32-cache``: as ``float32``, from a cache of the float32 base's features (the route of a CPU without bf16
  units, where bf16 arithmetic is emulated and slower than float32).

tokens/s counts real (unpadded) tokens over the wall time of the training loop alone (data building, model loading,
evaluation and export excluded). Writes ``throughput.json`` and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

VARIANTS = {
    "before": ["model.dtype=float32", "train.mixed_precision=no", "data.group_by_length=false"],
    "float32": ["model.dtype=float32", "train.mixed_precision=no", "data.group_by_length=true"],
    "bf16": ["model.dtype=bfloat16", "train.mixed_precision=bf16", "data.group_by_length=true"],
    "bf16-cache": ["model.dtype=bfloat16", "train.mixed_precision=bf16", "data.group_by_length=true"],
    "float32-cache": ["model.dtype=float32", "train.mixed_precision=no", "data.group_by_length=true"],
}
CACHED = {"bf16-cache": "features-bf16", "float32-cache": "features-float32"}


def run_variant(args: argparse.Namespace, name: str, out: Path) -> dict:
    from specheads.training.config import load_config
    from specheads.training.trainer import cleanup, setup, train_loop

    overrides = [
        *VARIANTS[name],
        f"data.limit={args.records}",
        "train.steps=null",
        "train.epochs=1",
        f"data.eval_batches={args.eval_batches}",
        f"output.dir={out / name}",
        "output.save_every=0",
        "train.resume=never",
        "train.overwrite=true",
        "log.tracker=none",
        f"data.feature_cache={out / CACHED[name] if name in CACHED else 'null'}",
        *args.overrides,
    ]
    config = load_config(args.config, overrides)
    shutil.rmtree(out / name, ignore_errors=True)
    started = time.perf_counter()
    run = setup(config)  # builds the data, loads the base, writes the feature cache where asked
    setup_s = time.perf_counter() - started
    started = time.perf_counter()
    train_loop(run)
    loop_s = time.perf_counter() - started
    tokens = run.tokens_seen + run.pending[0]
    cleanup(run)
    evaluation = json.loads((out / name / "heads" / "eval.json").read_text())
    return {
        "variant": name,
        "overrides": VARIANTS[name],
        "steps": run.step,
        "tokens": tokens,
        "train_s": round(loop_s, 1),
        "setup_s": round(setup_s, 1),
        "tokens_per_s": round(tokens / loop_s, 1),
        "agreement": [round(a, 4) for a in evaluation["agreement_with_base_greedy"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--records", type=int, default=200, help="train on the first N records, one epoch")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--eval-batches", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("overrides", nargs="*", help="more key=value recipe overrides for every variant")
    args = parser.parse_args()
    # imported once the arguments are read: --help and a usage error answer without loading torch
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.variants.split(","):
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}; choose from {sorted(VARIANTS)}")
        if name in CACHED:  # the cache is written by a setup of its own, timed apart
            shutil.rmtree(out / CACHED[name], ignore_errors=True)
        results.append(run_variant(args, name, out))
        print(json.dumps(results[-1]), flush=True)
    base = results[0]["tokens_per_s"]
    lines = [
        "| variant | tokens | steps | train s | tokens/s | vs first | held-out agreement by depth |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results:
        agreement = " ".join(f"{a:.3f}" for a in row["agreement"])
        lines.append(
            f"| {row['variant']} | {row['tokens']:,} | {row['steps']} | {row['train_s']} | {row['tokens_per_s']:.0f} | "
            f"{row['tokens_per_s'] / base:.2f}x | {agreement} |"
        )
    (out / "throughput.json").write_text(
        json.dumps(
            {"config": args.config, "records": args.records, "threads": args.threads, "results": results}, indent=2
        )
    )
    (out / "throughput.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
