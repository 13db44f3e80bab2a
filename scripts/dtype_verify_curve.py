"""The verify cost curve through the engine, per dtype: forward time of q tree tokens over a cached prefix.

The engine's own path (its slot cache, its tree mask, and in bf16 the batch-invariant attention and products) for
q = 1 .. 32, next to transformers' plain one-token forward with its own cache (what ``generate`` pays per token):

    python scripts/dtype_verify_curve.py --base smollm2-135m --threads 2 --json bench-out/curve-smollm2-2t.json
    python scripts/dtype_verify_curve.py --base default --threads 1

Rows: float32 (the model's attention), bfloat16 batch-invariant (what the engine runs on a CPU with bf16 units) and
bfloat16 with the model's own attention (SDPA: what invariance costs). Medians of ``--repeats`` forwards, the first
two dropped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SIZES = (1, 2, 4, 8, 16, 32)


def engine_curve(model: torch.nn.Module, prefix: int, repeats: int) -> dict[int, float]:
    """ms per forward of q tokens (a binary tree) after ``prefix`` cached tokens, as the engine feeds them."""
    import torch

    from specheads.inference import kv_cache
    from specheads.inference.trees import tree_from_parents
    from specheads.loading import vocab_size

    generator = torch.Generator().manual_seed(0)
    vocab = vocab_size(model)
    ids = torch.randint(0, vocab, (1, prefix), generator=generator)
    cache = kv_cache.SlotCache(1, prefix + max(SIZES) + 2)
    model(input_ids=ids, position_ids=torch.arange(prefix)[None], **kv_cache.forward_kwargs(model, cache))
    kv_cache.advance(cache, [prefix])
    curve = {}
    for size in SIZES:
        tree = tree_from_parents([-1] + [(node - 1) // 2 for node in range(1, size)])
        mask = None if size == 1 else kv_cache.tree_step_mask(torch.tensor([prefix]), prefix, tree.attention_mask[None])
        feed = torch.randint(0, vocab, (1, size), generator=generator)
        positions = (prefix + tree.depths)[None]
        samples = []
        for _ in range(repeats + 2):
            start = time.perf_counter()
            model(input_ids=feed, attention_mask=mask, position_ids=positions, **kv_cache.forward_kwargs(model, cache))
            samples.append(1000 * (time.perf_counter() - start))
        curve[size] = statistics.median(samples[2:])
    return curve


def transformers_one_token(model: torch.nn.Module, prefix: int, repeats: int) -> float:
    """ms of transformers' own one-token forward (DynamicCache, no mask given), the per-token cost of generate."""
    import torch
    from transformers import DynamicCache

    from specheads.inference import kv_cache
    from specheads.loading import vocab_size

    ids = torch.randint(0, vocab_size(model), (1, prefix + 1), generator=torch.Generator().manual_seed(1))
    cache = DynamicCache()
    model(input_ids=ids[:, :prefix], past_key_values=cache, use_cache=True)
    samples = []
    for _ in range(repeats + 2):
        start = time.perf_counter()
        model(input_ids=ids[:, prefix:], past_key_values=cache, use_cache=True)
        samples.append(1000 * (time.perf_counter() - start))
        kv_cache.crop(cache, prefix)
    return statistics.median(samples[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefix", type=int, default=256, help="cached prompt tokens")
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--json", type=Path, help="write the curves here")
    args = parser.parse_args()
    # imported once the arguments are read: --help and a usage error answer without loading torch
    import torch

    from specheads.inference import attention
    from specheads.loading import load_causal_lm
    from specheads.machine import measure_load

    torch.set_num_threads(args.threads)
    load = measure_load(1.0)
    rows = {}
    with torch.inference_mode():
        for label, dtype, invariant in (
            ("float32", "float32", False),
            ("bfloat16, batch-invariant", "bfloat16", True),
            ("bfloat16, model attention (SDPA)", "bfloat16", False),
        ):
            model = load_causal_lm(args.base, dtype=dtype)
            with attention.batch_invariant(model, invariant):
                curve = engine_curve(model, args.prefix, args.repeats)
            rows[label] = {
                "engine_ms": curve,
                "transformers_one_token_ms": transformers_one_token(model, args.prefix, args.repeats),
            }
            del model
    print(
        f"verify cost through the engine: {args.base}, prefix {args.prefix}, {args.threads} threads, "
        f"other processes' load {load.busy:.1f} of {load.cores} cores"
    )
    print("| dtype | transformers t(1) | engine t(1) | " + " | ".join(f"t({q})/t(1)" for q in SIZES[1:]) + " |")
    print("|---|---|---|" + "---|" * (len(SIZES) - 1))
    for label, row in rows.items():
        curve = row["engine_ms"]
        ratios = " | ".join(f"{curve[q] / curve[1]:.2f}" for q in SIZES[1:])
        print(f"| {label} | {row['transformers_one_token_ms']:.1f} ms | {curve[1]:.1f} ms | {ratios} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {"base": args.base, "prefix": args.prefix, "threads": args.threads, "load_busy": load.busy}
        args.json.write_text(json.dumps({**record, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
