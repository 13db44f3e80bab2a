"""Engine benchmarks on a random ~9M-parameter Llama: the engine's own overhead and the base's verify cost curve.

1. Engine overhead: ``SpecDecoder`` with ``method="none"`` (plain decoding through the speculative loop) against
   transformers ``generate(do_sample=False)``, interleaved in one process, same prompts; the ratio of tokens/s says
   what the loop itself costs.
2. Verify cost curve: one base forward of q = 1, 2, 4, ..., 64 query tokens (a tree mask) over a 256-token prefix.
   Tree sizes for this machine are chosen from this curve.

Usage: ``python scripts/bench_engine.py [--rounds 5] [--new-tokens 96] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import transformers


def random_llama(seed: int = 0) -> transformers.PreTrainedModel:
    """The ~9M-parameter Llama of the issue: 6 layers, hidden 256, vocab 8192."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=8192,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def engine_overhead(model, rounds: int, new_tokens: int, prompt_len: int = 64) -> dict:
    """Interleave HF greedy and ``method='none'`` runs; return tokens/s of each and their ratio."""
    import torch

    from specheads import SpecDecoder

    decoder = SpecDecoder(model)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 8192, (1, prompt_len), generator=generator) for _ in range(rounds)]
    hf_times, ours_times = [], []
    with torch.inference_mode():
        model.generate(prompts[0], do_sample=False, max_new_tokens=8)  # warm-up
        decoder.generate(prompts[0], max_new_tokens=8)
        for index, prompt in enumerate(prompts):
            order = ("hf", "ours") if index % 2 == 0 else ("ours", "hf")
            for name in order:
                start = time.perf_counter()
                if name == "hf":
                    reference = model.generate(
                        prompt, do_sample=False, max_new_tokens=new_tokens, attention_mask=torch.ones_like(prompt)
                    )
                    hf_times.append(time.perf_counter() - start)
                else:
                    out = decoder.generate(prompt, max_new_tokens=new_tokens)
                    ours_times.append(time.perf_counter() - start)
            assert torch.equal(out.sequences, reference), "method='none' must reproduce HF greedy"
    ratios = [h / o for h, o in zip(hf_times, ours_times, strict=True)]
    return {
        "hf_greedy_tokens_per_s": new_tokens * len(hf_times) / sum(hf_times),
        "none_tokens_per_s": new_tokens * len(ours_times) / sum(ours_times),
        "speed_ratio_total": sum(hf_times) / sum(ours_times),
        "speed_ratio_median": statistics.median(ratios),
        "speed_ratio_per_round": ratios,
    }


def verify_cost_curve(model, prefix_len: int = 256, sizes=(1, 2, 4, 8, 16, 32, 64), repeats: int = 20) -> list[dict]:
    """Median time of one base forward of q tree tokens (a binary-ish tree mask) over a cached prefix."""
    import torch

    from specheads.inference import kv_cache
    from specheads.inference.trees import tree_from_parents

    generator = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, 8192, (1, prefix_len), generator=generator)
    rows = []
    with torch.inference_mode():
        cache = kv_cache.new_cache()
        model(input_ids=prefix, **kv_cache.forward_kwargs(model, cache))
        for size in sizes:
            parents = [-1] + [(node - 1) // 2 for node in range(1, size)]  # a binary tree of `size` nodes
            tree = tree_from_parents(parents)
            mask = kv_cache.step_mask([prefix_len], [tree.attention_mask], size) if size > 1 else None
            ids = torch.randint(0, 8192, (1, size), generator=generator)
            positions = (prefix_len + tree.depths)[None]
            times = []
            for _ in range(repeats + 2):
                start = time.perf_counter()
                model(
                    input_ids=ids, attention_mask=mask, position_ids=positions, **kv_cache.forward_kwargs(model, cache)
                )
                times.append(time.perf_counter() - start)
                kv_cache.crop(cache, prefix_len)
            median = statistics.median(times[2:])
            rows.append({"query_tokens": size, "forward_ms": 1000 * median})
    base = rows[0]["forward_ms"]
    for row in rows:
        row["relative_to_1"] = row["forward_ms"] / base
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    # imported once the arguments are read: --help and a usage error answer without loading torch
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    model = random_llama()
    params = sum(p.numel() for p in model.parameters())
    print(
        f"random Llama: {params / 1e6:.1f}M parameters; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    )
    overhead = engine_overhead(model, args.rounds, args.new_tokens)
    print(f"\nEngine overhead ({args.rounds} interleaved rounds, {args.new_tokens} new tokens, 64-token prompts)")
    print("| method | tokens/s |\n|---|---|")
    print(f"| hf-greedy (transformers generate) | {overhead['hf_greedy_tokens_per_s']:.1f} |")
    print(f"| specheads method='none' | {overhead['none_tokens_per_s']:.1f} |")
    print(
        f"speed ratio none / hf-greedy: total {overhead['speed_ratio_total']:.3f}, median of rounds "
        f"{overhead['speed_ratio_median']:.3f} (per round: "
        f"{', '.join(f'{r:.2f}' for r in overhead['speed_ratio_per_round'])})"
    )
    curve = verify_cost_curve(model)
    print("\nVerify cost curve (one forward over a 256-token cached prefix, median of 20)")
    print("| query tokens | forward ms | x of 1 token |\n|---|---|---|")
    for row in curve:
        print(f"| {row['query_tokens']} | {row['forward_ms']:.2f} | {row['relative_to_1']:.2f} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"parameters": params, "overhead": overhead, "verify_cost": curve}, handle, indent=2)


if __name__ == "__main__":
    main()
