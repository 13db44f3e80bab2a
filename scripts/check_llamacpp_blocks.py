"""llama.cpp as a consumer of specheads' block drafters: convert our native DFlash and DSpark exports with llama.cpp's
own converter, serve them with ``--spec-type draft-dflash`` / ``draft-dspark``, compare with greedy decoding.

    python scripts/check_llamacpp_blocks.py --llama-cpp SRC --server BIN [--dflash HEADS] [--dspark HEADS]

SRC is the llama.cpp tree of the pinned source distribution (``scripts/build_llamacpp.sh`` downloads and builds it)
and BIN its ``llama-server``. The base is the embedded default (converted to an f32 GGUF once). Heads default to
freshly initialised ones (a loading and losslessness check); trained heads make the acceptance comparison telling.
For each variant the check:

1. exports the heads natively (``specheads export --format dflash | dspark``) and converts them with
   ``convert_hf_to_gguf.py --target-model-dir BASE``; a refusal is reported with the converter's last lines;
2. serves the base alone and with the draft (draft length: one block), one prompt at a time at temperature 0;
3. asserts that the speculative output equals llama.cpp's greedy output on every prompt, and reports llama.cpp's
   draft acceptance next to specheads' chain acceptance at the same length (the same argmax drafts: they agree
   unless the two engines' numerics part at near-ties).

Writes ``summary.json`` to ``--out``; exit code 1 when a variant fails to convert, load or stay lossless.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from specheads.methods.dflash.heads import DFlashHead

sys.path.insert(0, str(Path(__file__).resolve().parent))


def heads_for(variant: str, directory: str | None, base: torch.nn.Module) -> DFlashHead:
    import torch

    from specheads import load_heads
    from specheads.methods.dflash.heads import DFlashHead

    if directory:
        return load_heads(directory, base)
    torch.manual_seed(0)
    return DFlashHead.from_base(base, variant=variant, layer_ids=[1, 3, 5], block_size=8)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-cpp", type=Path, required=True, help="the llama.cpp source tree (its converter)")
    parser.add_argument("--server", type=Path, required=True, help="the llama-server binary")
    parser.add_argument("--dflash", help="DFlash heads (default: freshly initialised)")
    parser.add_argument("--dspark", help="DSpark heads (default: freshly initialised)")
    parser.add_argument("--variants", default="dflash,dspark")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="folder for the GGUF files, logs and summary (default: temporary)")
    args = parser.parse_args()
    # imported once the arguments are read: --help and a usage error answer without loading torch
    import torch
    from check_llamacpp import convert, first_difference, prompt_ids, serve_all

    from specheads import SpecDecoder, assets
    from specheads.export import export_heads
    from specheads.loading import load_causal_lm, load_tokenizer
    from specheads.methods.dflash.drafter import DFlashDrafter

    torch.set_num_threads(args.threads)
    work = args.out or Path(tempfile.mkdtemp(prefix="specheads-llamacpp-blocks-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "convert.log"
    base_dir = Path(assets.resolve("default")).resolve()
    base, tokenizer = load_causal_lm("default"), load_tokenizer("default")
    base_gguf = work / "base-f32.gguf"
    if not base_gguf.exists():
        convert(args.llama_cpp, [str(base_dir), "--outtype", "f32", "--outfile", str(base_gguf)], log)
    prompts = prompt_ids("default", tokenizer, args.prompts)
    common = {"binary": args.server, "model": base_gguf, "threads": args.threads, "log": work / "server.log"}
    greedy = serve_all(common, prompts, args.max_new_tokens, "greedy")
    summary: dict = {"threads": args.threads, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens}
    failures: list[str] = []
    for variant in args.variants.split(","):
        head = heads_for(variant, getattr(args, variant), base)
        length = head.config.num_drafts
        native = work / variant
        if not native.exists():
            export_heads(head, native, variant, base_model=base, base_name=str(base_dir))
        draft = work / f"{variant}-f32.gguf"
        draft.unlink(missing_ok=True)
        row: dict = {"heads": getattr(args, variant) or "fresh", "draft_length": length}
        try:
            convert(args.llama_cpp, [str(native), "--target-model-dir", str(base_dir), "--outtype", "f32",
                                     "--outfile", str(draft)], log)  # fmt: skip
        except SystemExit as error:
            row["converted"] = False
            row["converter_output"] = log.read_text().splitlines()[-8:]
            failures.append(f"{variant}: {error}")
            summary[variant] = row
            continue
        row["converted"] = True
        ours = []
        decoder = SpecDecoder(base, DFlashDrafter(head), tokenizer=tokenizer)
        for ids in prompts:
            out = decoder.generate(ids, max_new_tokens=args.max_new_tokens, tree=f"chain-{length}")
            ours.append({"drafted": sum(out.stats.drafted_depths), "accepted": sum(out.stats.accepted_drafts)})
        spec = ["-md", str(draft), "--spec-type", f"draft-{variant}", "--spec-draft-n-max", str(length),
                "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]  # fmt: skip
        try:
            served = serve_all({**common, "args": spec}, prompts, args.max_new_tokens, f"+{variant}")
        except Exception as error:  # the server refused the draft: report what it said
            row["served"] = False
            row["server_error"] = str(error)[-2000:]
            failures.append(f"{variant}: llama-server did not serve the draft: {error}")
            summary[variant] = row
            continue
        same = [g["tokens"] == d["tokens"] for g, d in zip(greedy, served, strict=True)]
        drafted, accepted = sum(r["drafted"] for r in served), sum(r["accepted"] for r in served)
        ours_drafted, ours_accepted = sum(r["drafted"] for r in ours), sum(r["accepted"] for r in ours)
        row.update(
            served=True,
            speculative_equals_greedy=f"{sum(same)}/{len(same)}",
            first_differences=[
                first_difference(g["tokens"], d["tokens"])
                for g, d in zip(greedy, served, strict=True)
                if g["tokens"] != d["tokens"]
            ],  # fmt: skip
            llamacpp_acceptance=f"{accepted}/{drafted}",
            specheads_acceptance=f"{ours_accepted}/{ours_drafted}",
            greedy_tok_s=round(sum(g["tokens_per_s"] for g in greedy) / len(greedy), 1),
            draft_tok_s=round(sum(d["tokens_per_s"] for d in served) / len(served), 1),
        )
        if not all(same):
            failures.append(f"{variant}: speculative output differs from llama.cpp's greedy on {same.count(False)}")
        summary[variant] = row
    summary["failures"] = failures
    (work / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
