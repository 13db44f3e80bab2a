"""Training throughput: Medusa training tokens/s against the base's forward-only tokens/s on the same batches.

The base forward is the floor of any head training (the heads need its hidden states); the ratio says what the heads
add. Runs interleaved in one process on the embedded default model (or --base) with packed corpus windows.

Usage: ``python scripts/bench_training.py [--base default] [--num-heads 4] [--batch-size 8] [--max-length 256]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="default")
    parser.add_argument("--data", default="default-corpus:train")
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    # imported once the arguments are read: --help and a usage error answer without loading torch
    import torch

    from specheads.heads import MedusaHeads
    from specheads.loading import load_causal_lm, load_tokenizer
    from specheads.methods.medusa.losses import medusa_loss
    from specheads.training.config import DataConfig
    from specheads.training.data import build_dataset
    from specheads.training.files import expand_data_paths

    torch.set_num_threads(args.threads)
    base = load_causal_lm(args.base).requires_grad_(False)
    config = DataConfig(paths=expand_data_paths([args.data]), max_length=args.max_length, limit=200)
    dataset = build_dataset(config, load_tokenizer(args.base)).with_format("torch")
    batches = [dataset[i * args.batch_size : (i + 1) * args.batch_size] for i in range(args.batches)]
    results = {}
    for share in (False, True):
        heads = MedusaHeads.from_base(base, num_heads=args.num_heads, share_lm_head=share)
        optimizer = torch.optim.AdamW(heads.parameters(), lr=1e-3)
        forward_times, train_times = [], []
        for batch in [batches[0], *batches]:  # the first batch warms up and is not counted
            ids = batch["input_ids"].long()
            start = time.perf_counter()
            with torch.no_grad():
                base(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
            forward = time.perf_counter() - start
            start = time.perf_counter()
            with torch.no_grad():
                hidden = base(input_ids=ids, output_hidden_states=True, logits_to_keep=1).hidden_states[-1]
            loss = medusa_loss(heads(hidden), ids, batch["loss_mask"], accuracy=False).loss.sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            forward_times.append(forward)
            train_times.append(time.perf_counter() - start)
        tokens = args.batch_size * args.max_length
        forward_tps = tokens / statistics.median(forward_times[1:])
        train_tps = tokens / statistics.median(train_times[1:])
        name = "shared lm_head (Medusa v2 heads)" if share else "own lm_head per head (Medusa-1)"
        results[name] = {
            "base_forward_tokens_per_s": forward_tps,
            "training_tokens_per_s": train_tps,
            "ratio": train_tps / forward_tps,
        }
    print(
        f"{args.num_heads} heads, batches of {args.batch_size} x {args.max_length} tokens, "
        f"{torch.get_num_threads()} threads"
    )
    print("| heads | base forward-only tokens/s | training tokens/s | ratio |\n|---|---|---|---|")
    for name, row in results.items():
        print(
            f"| {name} | {row['base_forward_tokens_per_s']:.0f} | {row['training_tokens_per_s']:.0f} | "
            f"{row['ratio']:.2f} |"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
