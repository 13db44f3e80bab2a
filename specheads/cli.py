"""The ``specheads`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

METHOD_CHOICES = ("draft", "prompt-lookup", "none")


def _add_generate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate a completion with speculative decoding",
        description="Generate a completion of PROMPT with a base model and a drafter; print the text.",
    )
    parser.add_argument("prompt", help="the prompt text ('-' reads it from standard input)")
    parser.add_argument("--base", required=True, help="base model: local folder, hub id or 'default'")
    parser.add_argument("--draft-model", help="draft model sharing the base's tokenizer (method 'draft')")
    parser.add_argument("--method", choices=METHOD_CHOICES, help="drafting method (inferred when omitted)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--acceptance", default="auto", help="auto | greedy | rejection | typical | threshold | alpha")
    parser.add_argument("--tree", help="'chain-K', a tree name under configs/trees/ or a tree JSON file")
    parser.add_argument("--num-speculative-tokens", type=int, help="K drafted tokens per step (chain drafters)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: where the model loads)")
    parser.add_argument("--stats", action="store_true", help="print tau, acceptance by depth and timings")
    parser.add_argument("--json", action="store_true", help="print one JSON object (text and statistics)")
    parser.set_defaults(handler=_generate)


def _generate(args: argparse.Namespace) -> int:
    from specheads import SpecDecoder

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    decoder = SpecDecoder.from_pretrained(
        args.base,
        draft_model=args.draft_model,
        method=args.method,
        device=args.device,
        num_speculative_tokens=args.num_speculative_tokens,
    )
    kwargs = dict(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        acceptance=args.acceptance,
        tree=args.tree,
        seed=args.seed,
    )
    if args.json:
        out = decoder.generate(prompt, max_new_tokens=args.max_new_tokens, **kwargs)
        print(json.dumps({"text": out.text, "new_tokens": out.new_tokens, "stats": out.stats.to_dict()}))
        return 0
    out = None
    if not args.stats:
        for piece in decoder.stream(prompt, max_new_tokens=args.max_new_tokens, **kwargs):
            print(piece, end="", flush=True)
        print()
        return 0
    out = decoder.generate(prompt, max_new_tokens=args.max_new_tokens, **kwargs)
    print(out.text)
    print(f"[{decoder.drafter.name}] {out.stats.summary()}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``specheads`` command."""
    parser = argparse.ArgumentParser(prog="specheads", description="Lossless speculative decoding for transformers.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_generate(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``specheads`` console script."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ValueError, FileNotFoundError, NotImplementedError) as error:
        print(f"specheads {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
