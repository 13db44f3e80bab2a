"""Compare head checkpoints of one base on the same held-out chats and MT-Bench prompts (tau is deterministic at
T=0, so the comparison does not depend on machine load):

    python scripts/compare_heads.py --config configs/smollm2-135m/eagle3.yaml --heads A B --prompts 8

For each checkpoint (any head type): per-depth (Medusa: per-head) agreement with the base's greedy token on the
recipe's held-out split (the head type's own evaluation), and tau of chain-K decoding on the first turn of
``--prompts`` MT-Bench questions (round robin over categories; 0: none). Prints one markdown table.

``--fold-norms`` adds, after each EAGLE 3.1 checkpoint, its fold into llama.cpp's graph (what ``specheads export
--format gguf --fold-norms`` writes, its statistics from the shipped benchmark prompts): what the fold costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the recipe whose held-out split is scored")
    parser.add_argument("--heads", nargs="+", required=True)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tree", default="chain-3")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--eval-batches", type=int, default=20)
    parser.add_argument("--fold-norms", action="store_true", help="also score each EAGLE 3.1 checkpoint folded")
    args = parser.parse_args()
    # imported once the arguments are read: --help and a usage error answer without loading torch
    import torch

    from specheads import SpecDecoder, assets, load_heads
    from specheads.loading import load_causal_lm, load_tokenizer
    from specheads.methods.eagle import fold
    from specheads.prompts import load_prompts, prompt_token_ids
    from specheads.registry import head_type_of
    from specheads.training.batches import collate_trimmed
    from specheads.training.config import load_config
    from specheads.training.data import build_dataset
    from specheads.training.files import expand_data_paths

    fold_texts = assets.prompt_texts()
    config = load_config(args.config, [])
    base = load_causal_lm(config.model.base)
    tokenizer = load_tokenizer(config.model.base)
    data = dataclasses.replace(config.data, paths=expand_data_paths(config.data.paths))
    heldout = build_dataset(data, tokenizer, split="heldout").with_format("torch")
    loader = torch.utils.data.DataLoader(heldout, batch_size=config.train.batch_size, collate_fn=collate_trimmed)
    prompts = (
        [prompt_token_ids(tokenizer, p) for p in load_prompts("mt-bench", tokenizer, limit=args.prompts)]
        if args.prompts
        else []
    )
    print(f"held-out: {len(heldout)} chats of {config.data.paths}; MT-Bench: {len(prompts)} first turns, {args.tree}")
    print("\n| heads | held-out agreement by depth | tau | accepted / drafted |\n|---|---|---|---|")
    candidates = []
    for path in args.heads:
        head = load_heads(path, base)
        candidates.append((path, head))
        if args.fold_norms and fold.needs_fold(head):
            folded, _ = fold.fold_for_llamacpp(head, base, fold.calibration_rows(tokenizer, fold_texts))
            candidates.append((f"{path}, folded for llama.cpp", folded))
    for path, head in candidates:
        with torch.no_grad():
            agreement = head_type_of(head).evaluate_fn()(base, head, loader, max_batches=args.eval_batches)
        decoder = SpecDecoder.from_pretrained(base, heads=head, tokenizer=tokenizer)
        steps = tokens = accepted = drafted = 0
        for ids in prompts:
            out = decoder.generate(ids, max_new_tokens=args.max_new_tokens, tree=args.tree)
            steps += out.stats.steps
            tokens += out.stats.new_tokens
            accepted += sum(out.stats.accepted_drafts)
            drafted += sum(out.stats.drafted_depths)
        depths = ", ".join(f"{a:.3f}" for a in agreement["agreement_with_base_greedy"])
        tau = f"{tokens / steps:.2f}" if steps else "-"
        print(f"| {path} | {depths} | {tau} | {accepted} / {drafted} |", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
