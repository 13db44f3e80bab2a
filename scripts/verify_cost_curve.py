"""Verify cost curve: forward time of q query tokens (a tree, 4D mask) over a cached prefix, q = 1 .. 64.

Speculative decoding pays when verifying q tokens costs little more than verifying 1. On a GPU the curve is flat until
the matrix units fill; on a CPU it rises almost linearly. This builds a randomly initialised Llama of a chosen size
(default ~1.1B parameters: hidden 2048, 16 layers, vocabulary 32000; weights do not change the timing) and times it with
``specheads.calibrate.measure_verify_cost``, the function ``specheads calibrate`` uses.

    python scripts/verify_cost_curve.py --device cuda --dtype bfloat16 --json out/verify.json
    python scripts/verify_cost_curve.py --hidden 256 --layers 4 --intermediate 688 --vocab 8192   # a CPU-sized check
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

SIZES = (1, 2, 4, 8, 16, 32, 64)


def build_model(args: argparse.Namespace) -> LlamaForCausalLM:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(1, args.hidden // 128)  # head dimension 128, grouped-query attention with half as many KV heads
    config = LlamaConfig(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        intermediate_size=args.intermediate,
        vocab_size=args.vocab,
        max_position_embeddings=4096,
    )
    with torch.device(args.device):  # initialised where it runs: no host copy of a 1B model
        model = LlamaForCausalLM(config).to(getattr(torch, args.dtype))
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", help="default: cuda when there is one, else cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--prefix", type=int, default=512, help="cached prompt tokens")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write the curve here")
    args = parser.parse_args()
    # imported once the arguments are read: --help and a usage error answer without loading torch
    import torch

    from specheads.calibrate import measure_verify_cost

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    started = time.perf_counter()
    model = build_model(args)
    params = sum(p.numel() for p in model.parameters())
    with torch.inference_mode():
        curve = measure_verify_cost(model, prefix_len=args.prefix, sizes=SIZES, repeats=args.repeats)
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else args.device
    print(f"verify cost: random Llama {params / 1e9:.2f}B params, {args.dtype}, {device}, prefix {args.prefix}")
    print("| query tokens | ms per forward | x of 1 token |")
    print("|---|---|---|")
    for size in SIZES:
        print(f"| {size} | {curve[size]:.2f} | {curve[size] / curve[1]:.2f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {"parameters": params, "dtype": args.dtype, "device": device, "prefix": args.prefix}
        args.json.write_text(json.dumps({**record, "ms_by_query_tokens": curve}, indent=2) + "\n")
    print(f"took {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
