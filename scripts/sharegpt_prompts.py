"""First user turns of the installed ShareGPT V3 file as a distill prompts file (JSONL ``id`` + ``conversations``).

    python scripts/sharegpt_prompts.py --out data/sharegpt_prompts.jsonl [--max-prompt-tokens 256] [--limit N] \
        [--heldout N --heldout-out data/heldout_prompts.jsonl]

The prompts of the shipped SmolLM2 heads' training data: ``specheads distill`` regenerates the answers with the base
itself. Records are read with the training loader's rules (a truncated file yields its complete records; synonym
roles, leading assistant turns and empty conversations are normalised or skipped with counts). A prompt longer than
``--max-prompt-tokens`` tokens of the base's tokenizer is skipped: MT-Bench questions are short, and a long prompt
costs the distillation as much as its answer. A prompt whose words (lower-cased, punctuation and spacing aside) repeat
an earlier prompt's is skipped: ShareGPT holds many copies of the same first turn, and the base answers a copy
the same way. A prompt that copies an evaluation prompt (MT-Bench, HumanEval, GSM8K, the shipped prompt files;
``specheads.contamination``) is skipped too. Ids are the records' own, made unique with ``#n`` where repeated.

``--heldout N`` moves the last N kept prompts to ``--heldout-out``: distilled apart, their answers are a held-out set
that stays the same while the training file grows (the recipe's ``data.eval_paths``), and no training record can
share a prompt with them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specheads.contamination import evaluation_index, words
from specheads.loading import load_tokenizer
from specheads.training.data import read_sharegpt_conversations, sharegpt_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--base", default="smollm2-135m", help="whose tokenizer measures prompt lengths")
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--limit", type=int, help="stop after keeping N prompts, held-out ones included (quick runs)")
    parser.add_argument("--heldout", type=int, default=0, help="move the last N kept prompts to --heldout-out")
    parser.add_argument("--heldout-out", help="where the held-out prompts go (with --heldout)")
    args = parser.parse_args()
    if args.heldout < 0 or bool(args.heldout) != bool(args.heldout_out):
        parser.error("--heldout N (N >= 1) and --heldout-out FILE go together")
    tokenizer = load_tokenizer(args.base)
    seen: dict[str, int] = {}
    texts: set[tuple[str, ...]] = set()
    index = evaluation_index()
    skipped_long = repeated = copied = 0
    kept: list[str] = []
    for record_id, messages in read_sharegpt_conversations(sharegpt_path()):
        first = next((m["content"] for m in messages if m["role"] == "user"), None)
        if not first or not first.strip():
            continue
        if len(tokenizer(first, add_special_tokens=False)["input_ids"]) > args.max_prompt_tokens:
            skipped_long += 1
            continue
        if index.match([first]) is not None:
            copied += 1
            continue
        key = words(first)
        if key in texts:
            repeated += 1
            continue
        texts.add(key)
        count = seen.get(record_id, 0)
        seen[record_id] = count + 1
        unique = record_id if count == 0 else f"{record_id}#{count}"
        line = {"id": unique, "conversations": [{"from": "human", "value": first}]}
        kept.append(json.dumps(line, ensure_ascii=False) + "\n")
        if args.limit is not None and len(kept) >= args.limit:
            break
    if args.heldout >= len(kept):
        raise SystemExit(f"--heldout {args.heldout} leaves no training prompt of the {len(kept)} kept")
    cut = len(kept) - args.heldout
    for path, lines in ((args.out, kept[:cut]), (args.heldout_out, kept[cut:])):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text("".join(lines), encoding="utf-8")
    held = f" and {args.heldout} held-out prompts to {args.heldout_out}" if args.heldout else ""
    print(
        f"wrote {cut} prompts to {args.out}{held}; skipped {skipped_long} longer than {args.max_prompt_tokens} tokens, "
        f"{repeated} repeating an earlier prompt, {copied} copying an evaluation prompt ({index.describe()})"
    )


if __name__ == "__main__":
    main()
