"""Speculative sampling with draft heads at temperature > 0: lossless ``rejection`` against lossy ``typical``.

For each rule, every prompt is generated with the same seed; the rules run interleaved in one process, next to
plain sampling through the engine (``method="none"``). Reports tau, tokens/s and the speed-up over plain sampling.

Usage: ``python scripts/bench_sampling.py --heads default --temperature 0.8 [--tree dynamic] [--limit 67]``
"""

from __future__ import annotations

import argparse
import json
import time

RULES = ("none", "rejection", "typical")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="default")
    parser.add_argument("--heads", default="default")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--tree", default="dynamic")
    parser.add_argument("--limit", type=int, default=67)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    # imported once the arguments are read: --help and a usage error answer without loading torch
    import torch

    from specheads import SpecDecoder, assets
    from specheads.heads.loading import heads_for_decoding, heads_path
    from specheads.inference.drafters import NoDrafter
    from specheads.loading import load_causal_lm, load_tokenizer
    from specheads.prompts import load_prompts
    from specheads.registry import head_type_of

    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.base)
    base = load_causal_lm(args.base)
    heads, base = heads_for_decoding(heads_path(args.heads), base)
    decoders = {
        "none": SpecDecoder(base, NoDrafter()),
        "spec": SpecDecoder(base, head_type_of(heads).make_drafter(heads)),
    }
    prompts = load_prompts(assets.prompts_path(), tokenizer, limit=args.limit)
    totals = {rule: {"tokens": 0, "steps": 0, "seconds": 0.0} for rule in RULES}
    for index, prompt in enumerate(prompts):
        ids = torch.tensor([tokenizer(prompt.text)["input_ids"]])
        order = RULES[index % len(RULES) :] + RULES[: index % len(RULES)]
        for rule in order:
            decoder = decoders["none" if rule == "none" else "spec"]
            kwargs = {} if rule == "none" else {"acceptance": rule, "tree": args.tree}
            start = time.perf_counter()
            out = decoder.generate(ids, args.max_new_tokens, temperature=args.temperature, seed=index, **kwargs)
            totals[rule]["seconds"] += time.perf_counter() - start
            totals[rule]["tokens"] += out.stats.new_tokens
            totals[rule]["steps"] += out.stats.steps
    plain = totals["none"]["tokens"] / totals["none"]["seconds"]
    rows = []
    for rule in RULES:
        tokens_per_s = totals[rule]["tokens"] / totals[rule]["seconds"]
        rows.append(
            {
                "rule": rule,
                "lossless": rule != "typical",
                "tau": totals[rule]["tokens"] / max(totals[rule]["steps"], 1),
                "tokens_per_s": tokens_per_s,
                "speedup_over_plain_sampling": tokens_per_s / plain,
            }
        )
    print(f"{len(prompts)} prompts, {args.max_new_tokens} new tokens, temperature {args.temperature}, tree {args.tree}")
    print("| rule | lossless | tau | tokens/s | speed-up over plain sampling |\n|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['rule']} | {'yes' if row['lossless'] else 'no'} | {row['tau']:.2f} | {row['tokens_per_s']:.1f} | "
            f"{row['speedup_over_plain_sampling']:.2f}x |"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
