"""Export EAGLE-3 heads in the speculators format, load them with vLLM's speculators library, and compare its
one-step draft logits and tokens with specheads' at every position of a set of prompts.

    python scripts/check_speculators_export.py [--prompts 20]      # the default model's shipped heads, bench prompts
    python scripts/check_speculators_export.py --base smollm2-135m --heads runs/smollm2-135m-eagle3-long/heads \
        --prompts-file mt-bench --prompts 160                      # every MT-Bench turn, chat-templated

Needs speculators installed (README test command). Prints one summary line per measure; BENCHMARKS.md quotes it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=20, help="prompts to compare on (at most)")
    parser.add_argument("--base", default="default", help="the base (a name, folder or .gguf)")
    parser.add_argument("--heads", help="EAGLE-3 head checkpoint (default: the heads shipped for --base)")
    parser.add_argument(
        "--prompts-file", help="JSONL prompts or 'mt-bench' (each turn as a one-message chat); default: bench prompts"
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="the base's dtype (default float32: both implementations compared in full precision; 'auto' would pick "
        "bf16 for a GGUF on a CPU with bf16 units, and the two then round differently)",
    )
    args = parser.parse_args()
    # imported once the arguments are read: --help and a usage error answer without loading torch
    import speculators
    import torch

    from specheads import assets, load_heads
    from specheads.export import export_heads
    from specheads.loading import load_causal_lm, load_tokenizer

    base_dir = str(Path(assets.resolve(args.base)).resolve())
    base = load_causal_lm(args.base, dtype=args.dtype)
    tokenizer = load_tokenizer(args.base)
    head = load_heads(args.heads or assets.shipped_heads(args.base), base)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "speculators"
        result = export_heads(head, out, "speculators", base_model=base, base_name=base_dir)
        print(f"export: {result.report.engines} load it; {sum(1 for _ in out.iterdir())} files")
        start = time.perf_counter()
        config = speculators.SpeculatorModelConfig.from_pretrained(str(out))
        config.transformer_layer_config._attn_implementation = "eager"
        model = speculators.SpeculatorModel.from_pretrained(str(out), config=config).eval()
        print(
            f"speculators {version('speculators')}: loaded {type(model).__name__} "
            f"in {time.perf_counter() - start:.2f} s"
        )
        records = _prompt_ids(args, tokenizer)
        max_diff, agree, total = 0.0, 0, 0
        captured = {}
        hook = model.lm_head.register_forward_hook(lambda m, a, o: captured.update(logits=o))
        for ids in records:
            ids = ids[:, :256]
            if ids.shape[1] < 2:
                continue
            with torch.no_grad():
                states = base(ids, output_hidden_states=True).hidden_states
                ours = head(ids, [states[i] for i in head.hidden_state_layers], steps=1)[1][0]
                model(
                    hidden_states=torch.cat([states[i] for i in config.eagle_aux_hidden_state_layer_ids], -1)[:, :-1],
                    input_ids=ids[:, 1:],
                    document_ids=torch.zeros_like(ids[:, 1:]),
                    position_ids=torch.arange(ids.shape[1] - 1)[None],
                    ttt_steps=1,
                )
            theirs = captured["logits"]
            max_diff = max(max_diff, float((theirs - ours).abs().max()))
            agree += int((theirs.argmax(-1) == ours.argmax(-1)).sum())
            total += ours.shape[1]
        hook.remove()
        print(
            f"{len(records)} prompts, {total} positions: max |logit diff| {max_diff:.2e}, "
            f"same draft token {agree}/{total}"
        )


def _prompt_ids(args: argparse.Namespace, tokenizer) -> list[torch.Tensor]:  # noqa: ANN001
    """``[1, T]`` token ids of each prompt: raw bench prompts, or every turn of a multi-turn file as a chat."""
    import torch

    from specheads import assets
    from specheads.prompts import load_prompts, render_conversation

    if args.prompts_file is None:
        texts = assets.prompt_texts()
        return [tokenizer(text, return_tensors="pt").input_ids for text in texts[: args.prompts]]
    chats = []
    for prompt in load_prompts(args.prompts_file, tokenizer):
        first = prompt.messages() or [{"role": "user", "content": prompt.text}]
        chats += [first] + [[{"role": "user", "content": turn}] for turn in prompt.followups]
    return [torch.tensor([render_conversation(tokenizer, chat)]) for chat in chats[: args.prompts]]


if __name__ == "__main__":
    main()
